"""Statements on the per-minute counts the workers keep for the admin's chart."""

from __future__ import annotations

RECORD_STATS = """
-- Add a worker's counts of finished jobs to the current minute of each queue.
INSERT INTO pgjobs_stats AS s (minute, queue, succeeded, retried, dead)
SELECT date_trunc('minute', now()), c.queue, c.succeeded, c.retried, c.dead
FROM unnest(%(queues)s::text[], %(succeeded)s::int[], %(retried)s::int[], %(dead)s::int[])
     AS c(queue, succeeded, retried, dead)
ON CONFLICT (minute, queue) DO UPDATE SET
    succeeded = s.succeeded + excluded.succeeded,
    retried = s.retried + excluded.retried,
    dead = s.dead + excluded.dead
"""

THROUGHPUT = """
-- Jobs finished and failed attempts per minute over the last %(minutes)s minutes, every
-- minute present (zero when nothing happened).
SELECT m.minute, coalesce(sum(s.succeeded), 0)::int,
       coalesce(sum(s.retried) + sum(s.dead), 0)::int
FROM generate_series(date_trunc('minute', now()) - make_interval(mins => %(minutes)s - 1),
                     date_trunc('minute', now()), interval '1 minute') AS m(minute)
LEFT JOIN pgjobs_stats AS s ON s.minute = m.minute
GROUP BY m.minute
ORDER BY m.minute
"""

PRUNE_STATS = """
-- Delete up to %(limit)s per-minute statistics older than a day.
DELETE FROM pgjobs_stats
WHERE id IN (
    SELECT id FROM pgjobs_stats
    WHERE minute < now() - interval '1 day'
    LIMIT %(limit)s
)
"""
