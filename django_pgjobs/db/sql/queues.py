"""Statements on the queue controls: pause, resume, and limits on running jobs."""

from __future__ import annotations

LIMITED_QUEUES = """
-- The queues with a limit on their running jobs or a rate (claimed by CLAIM_LIMITED_JOBS).
SELECT name FROM pgjobs_queue WHERE max_running IS NOT NULL OR rate_limit IS NOT NULL
"""

LOCK_LIMITED_QUEUES = """
-- Take the claim turn of the limited queues among %(queues)s (S6 with a limit): claimers
-- of one limited queue wait for each other here, so that the next statement of this
-- transaction, with a snapshot taken after the wait, counts every claim made before it.
SELECT c.name
FROM pgjobs_queue AS c
WHERE c.name = ANY(%(queues)s::text[]) AND NOT c.paused
  AND (c.max_running IS NOT NULL OR c.rate_limit IS NOT NULL)
ORDER BY c.name
FOR UPDATE
"""

PAUSE_QUEUES = """
-- Pause %(queues)s: no replica claims their jobs until they are resumed.
INSERT INTO pgjobs_queue AS c (name, paused, paused_at, limit_from_settings, updated_at)
SELECT q.name, true, now(), false, now() FROM unnest(%(queues)s::text[]) AS q(name)
ON CONFLICT (name) DO UPDATE
SET paused = true, paused_at = coalesce(c.paused_at, now()), updated_at = now()
RETURNING c.name
"""

RESUME_QUEUES = """
-- Resume the paused ones of %(queues)s, and wake their workers at once (S23).
WITH resumed AS (
    UPDATE pgjobs_queue AS c
    SET paused = false, paused_at = NULL, updated_at = now()
    WHERE c.name = ANY(%(queues)s::text[]) AND c.paused
    RETURNING c.name
),
woke AS (
    SELECT pg_notify(%(channel)s, r.name) FROM resumed AS r WHERE %(notify)s
)
SELECT r.name, (SELECT count(*) FROM woke) FROM resumed AS r
"""

SET_QUEUE_LIMIT = """
-- Set (or, with NULL, lift) the limit on the running jobs of %(queue)s; wake its workers.
WITH limited AS (
    INSERT INTO pgjobs_queue AS c (name, paused, max_running, limit_from_settings, updated_at)
    VALUES (%(queue)s, false, %(max_running)s, %(from_settings)s, now())
    ON CONFLICT (name) DO UPDATE
    SET max_running = EXCLUDED.max_running, limit_from_settings = EXCLUDED.limit_from_settings,
        updated_at = now()
    WHERE (c.max_running, c.limit_from_settings)
          IS DISTINCT FROM (EXCLUDED.max_running, EXCLUDED.limit_from_settings)
    RETURNING c.name
),
woke AS (
    SELECT pg_notify(%(channel)s, l.name) FROM limited AS l WHERE %(notify)s
)
SELECT l.name, (SELECT count(*) FROM woke) FROM limited AS l
"""

SET_QUEUE_RATE = """
-- Set (or, with NULL, lift) the rate of %(queue)s's claims (S35); wake its workers.
WITH rated AS (
    INSERT INTO pgjobs_queue AS c (name, paused, rate_limit, rate_period_s, updated_at)
    VALUES (%(queue)s, false, %(rate_limit)s, %(rate_period_s)s, now())
    ON CONFLICT (name) DO UPDATE
    SET rate_limit = EXCLUDED.rate_limit, rate_period_s = EXCLUDED.rate_period_s,
        updated_at = now()
    WHERE (c.rate_limit, c.rate_period_s)
          IS DISTINCT FROM (EXCLUDED.rate_limit, EXCLUDED.rate_period_s)
    RETURNING c.name
),
woke AS (
    SELECT pg_notify(%(channel)s, r.name) FROM rated AS r WHERE %(notify)s
)
SELECT r.name, (SELECT count(*) FROM woke) FROM rated AS r
"""

LIFT_SETTINGS_LIMITS = """
-- Lift the limits that came from settings on queues whose settings no longer set one.
UPDATE pgjobs_queue
SET max_running = NULL, limit_from_settings = false, updated_at = now()
WHERE limit_from_settings AND NOT (name = ANY(%(queues)s::text[]))
RETURNING name
"""

QUEUES_HOLDING_ANYTHING = """
-- Those of %(queues)s that have a row, a job in any state or a dead letter: a probe per
-- name and state along the indexes, so that a queue whose jobs all wait for their
-- parents or are done counts as known (the waiting and running jobs' indexes are not by
-- queue: those probes may walk them whole, which a jobsctl command can afford).
SELECT q.name
FROM unnest(%(queues)s::text[]) AS q(name)
WHERE EXISTS (SELECT 1 FROM pgjobs_queue AS c WHERE c.name = q.name)
   OR EXISTS (SELECT 1 FROM pgjobs_job AS j WHERE j.state = 'pending' AND j.queue = q.name)
   OR EXISTS (SELECT 1 FROM pgjobs_job AS j WHERE j.state = 'running' AND j.queue = q.name)
   OR EXISTS (SELECT 1 FROM pgjobs_job AS j WHERE j.state = 'waiting' AND j.queue = q.name)
   OR EXISTS (SELECT 1 FROM pgjobs_job AS j WHERE j.state = 'done' AND j.queue = q.name)
   OR EXISTS (SELECT 1 FROM pgjobs_dead AS d WHERE d.queue = q.name)
ORDER BY q.name
"""
