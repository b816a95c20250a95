"""Statements on the worker registry: each `runjobs` heartbeats its own row."""

from __future__ import annotations

HEARTBEAT_WORKER = """
-- Register a worker, or refresh its row: last seen now (database clock), its counters,
-- and whether its claims read from their queues' floors (S42). Returns what an operator
-- asked of it (NULL: nothing; 'quiet', 'stop') and the queues paused on it alone: of this
-- process, never of an earlier one that had the same id (a fixed --worker-id restarted:
-- another pid, or a stopped row).
INSERT INTO pgjobs_worker AS w (id, host, pid, queues, concurrency, version, heartbeat_s,
                                running, succeeded, failed, abandoned, claims_from_floors)
VALUES (%(id)s, %(host)s, %(pid)s, %(queues)s::jsonb, %(concurrency)s, %(version)s,
        %(heartbeat_s)s, %(running)s, %(succeeded)s, %(failed)s, %(abandoned)s,
        %(claims_from_floors)s)
ON CONFLICT (id) DO UPDATE SET
    asked = CASE WHEN w.stopped_at IS NULL AND w.pid = excluded.pid AND w.host = excluded.host
                 THEN w.asked END,
    paused_queues = CASE WHEN w.stopped_at IS NULL AND w.pid = excluded.pid
                              AND w.host = excluded.host
                         THEN w.paused_queues END,
    host = excluded.host,
    pid = excluded.pid,
    last_seen_at = now(),
    stopped_at = NULL,
    running = excluded.running,
    succeeded = excluded.succeeded,
    failed = excluded.failed,
    abandoned = excluded.abandoned,
    claims_from_floors = excluded.claims_from_floors
RETURNING w.asked, w.paused_queues
"""

ASK_WORKERS = """
-- Ask the workers %(ids)s that have not stopped to go quiet, to stop, or (%(asked)s NULL)
-- to run again, for %(by)s: each obeys at its next heartbeat. A stop is not taken back
-- (a worker may be inside its grace already). Returns the ids asked.
UPDATE pgjobs_worker
SET asked = %(asked)s, asked_by = %(by)s, asked_at = now()
WHERE id = ANY(%(ids)s::text[]) AND stopped_at IS NULL
  AND (asked IS DISTINCT FROM 'stop' OR %(asked)s::text = 'stop')
RETURNING id
"""

#: The queues paused on a worker as an object (a value edited by hand into anything else:
#: none).
_PAUSED_HELD = (
    "(CASE WHEN jsonb_typeof(paused_queues) = 'object' THEN paused_queues ELSE '{}'::jsonb END)"
)

PAUSE_ON_WORKERS = f"""
-- Pause the queue %(queue)s on the workers %(ids)s alone (%(paused)s; else resume it there),
-- for %(by)s: those that have not stopped, claim from it, and are not already so; each
-- obeys at its next heartbeat. Returns the ids changed.
UPDATE pgjobs_worker
SET paused_queues = CASE
        WHEN %(paused)s THEN {_PAUSED_HELD} || jsonb_build_object(
            %(queue)s::text, jsonb_build_object('by', %(by)s::text, 'at', now()))
        ELSE nullif({_PAUSED_HELD} - %(queue)s::text, '{{}}'::jsonb)
    END
WHERE id = ANY(%(ids)s::text[]) AND stopped_at IS NULL
  AND queues ? %(queue)s::text
  AND ({_PAUSED_HELD} ? %(queue)s::text) <> %(paused)s::boolean
RETURNING id
"""

STOP_WORKER = """
-- Mark a worker stopped (it left on its own), with its final counters; what was asked of
-- it is done with.
UPDATE pgjobs_worker
SET stopped_at = now(), last_seen_at = now(), running = 0, asked = NULL, paused_queues = NULL,
    succeeded = %(succeeded)s, failed = %(failed)s
WHERE id = %(id)s
"""

#: A worker's columns as WorkerStatus holds them, with whether it is live: not stopped
#: and seen within 3 of its heartbeats, on the database clock.
_WORKER_STATUS = """
SELECT id, host, pid, queues, concurrency, version, heartbeat_s, started_at, last_seen_at,
       stopped_at, running, succeeded, failed, claims_from_floors, asked, asked_by, asked_at,
       paused_queues,
       (stopped_at IS NULL AND last_seen_at > now() - make_interval(secs => 3 * heartbeat_s))
           AS live,
       extract(epoch FROM now() - last_seen_at)::float8 AS seen_s_ago
FROM pgjobs_worker"""

LIST_WORKERS = f"""
-- Every worker in the registry, newest first, with whether it is live.
{_WORKER_STATUS}
ORDER BY started_at DESC, id
"""

WORKER_STATUS = f"""
-- The worker %(id)s of the registry (no row: none such), with whether it is live.
{_WORKER_STATUS}
WHERE id = %(id)s
"""

PRUNE_WORKERS = """
-- Delete up to %(limit)s workers not seen for a day.
DELETE FROM pgjobs_worker
WHERE id IN (
    SELECT id FROM pgjobs_worker
    WHERE last_seen_at < now() - interval '1 day'
    LIMIT %(limit)s
)
"""
