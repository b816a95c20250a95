"""Statements on the periodic schedules: each tick taken by exactly one replica."""

from __future__ import annotations

DUE_SCHEDULES = """
-- Up to %(limit)s enabled schedules whose next tick has come, with the database's now().
SELECT name, kind, cron, timezone, payload, options, on_missed, backfill_limit,
       next_run_at, now()
FROM pgjobs_schedule
WHERE enabled AND next_run_at <= now()
ORDER BY next_run_at
LIMIT %(limit)s
"""

ADVANCE_SCHEDULE = """
-- Take the tick of %(name)s that is due at %(seen)s: advance it to %(next_run_at)s. Only
-- one replica's update matches (the others find next_run_at moved, after waiting for its
-- commit), and that replica enqueues the tick's jobs in the same transaction.
UPDATE pgjobs_schedule
SET next_run_at = %(next_run_at)s, last_run_at = %(last_tick)s, runs = runs + %(ticks)s,
    updated_at = now()
WHERE name = %(name)s AND enabled AND next_run_at = %(seen)s
RETURNING name
"""

RECORD_SCHEDULE_JOB = """
-- Remember the last job a schedule enqueued.
UPDATE pgjobs_schedule SET last_job_id = %(job_id)s WHERE name = %(name)s
"""

NEXT_SCHEDULE_IN = """
-- Seconds from now() until the next tick of an enabled schedule (NULL: none).
SELECT extract(epoch FROM min(next_run_at) - now())::float8
FROM pgjobs_schedule
WHERE enabled
"""

UPSERT_SCHEDULE = """
-- Declare schedule %(name)s: insert it, or update what changed. A new cron or timezone,
-- or a schedule declared again after it was retired, starts from %(next_run_at)s (the
-- next tick from now); otherwise its next tick is kept. Returns a row when it changed.
INSERT INTO pgjobs_schedule AS s (
    name, kind, cron, timezone, payload, options, on_missed, backfill_limit, enabled,
    declared, next_run_at, runs, created_at, updated_at
)
VALUES (
    %(name)s, %(kind)s, %(cron)s, %(timezone)s, %(payload)s::jsonb, %(options)s::jsonb,
    %(on_missed)s, %(backfill_limit)s, true, true, %(next_run_at)s, 0, now(), now()
)
ON CONFLICT (name) DO UPDATE
SET kind = EXCLUDED.kind, payload = EXCLUDED.payload, options = EXCLUDED.options,
    on_missed = EXCLUDED.on_missed, backfill_limit = EXCLUDED.backfill_limit,
    next_run_at = CASE
        WHEN (s.cron, s.timezone) IS DISTINCT FROM (EXCLUDED.cron, EXCLUDED.timezone)
             OR NOT s.declared
        THEN EXCLUDED.next_run_at ELSE s.next_run_at END,
    cron = EXCLUDED.cron, timezone = EXCLUDED.timezone,
    enabled = s.enabled OR NOT s.declared,
    declared = true,
    updated_at = now()
WHERE (s.kind, s.cron, s.timezone, s.payload, s.options, s.on_missed, s.backfill_limit,
       s.declared)
      IS DISTINCT FROM (EXCLUDED.kind, EXCLUDED.cron, EXCLUDED.timezone, EXCLUDED.payload,
                        EXCLUDED.options, EXCLUDED.on_missed, EXCLUDED.backfill_limit, true)
RETURNING (xmax = 0) AS inserted
"""

RETIRE_SCHEDULES = """
-- Disable the schedules no longer declared (kept, with their history).
UPDATE pgjobs_schedule
SET declared = false, enabled = false, updated_at = now()
WHERE declared AND NOT (name = ANY(%(names)s::text[]))
RETURNING name
"""
