"""Statements on the per-minute counts the workers keep for the admin's chart."""

from __future__ import annotations

RECORD_STATS = """
-- Add a worker's counts of finished jobs to the current minute of each queue.
INSERT INTO pgjobs_stats AS s (minute, queue, succeeded, retried, dead, cancelled)
SELECT date_trunc('minute', now()), c.queue, c.succeeded, c.retried, c.dead, c.cancelled
FROM unnest(%(queues)s::text[], %(succeeded)s::int[], %(retried)s::int[], %(dead)s::int[],
            %(cancelled)s::int[])
     AS c(queue, succeeded, retried, dead, cancelled)
ON CONFLICT (minute, queue) DO UPDATE SET
    succeeded = s.succeeded + excluded.succeeded,
    retried = s.retried + excluded.retried,
    dead = s.dead + excluded.dead,
    cancelled = s.cancelled + excluded.cancelled
"""

THROUGHPUT = """
-- Jobs done, retried, dead-lettered and cancelled per bucket of %(bucket_min)s minutes over
-- the last %(buckets)s buckets (the current one last), every bucket present (zero when
-- nothing happened); a bucket starts at a multiple of its size since the hour.
WITH bounds AS (
    SELECT date_trunc('hour', now())
           + floor(extract(minute FROM now()) / %(bucket_min)s)
             * make_interval(mins => %(bucket_min)s) AS current
)
SELECT b.at, coalesce(sum(s.succeeded), 0)::int, coalesce(sum(s.retried), 0)::int,
       coalesce(sum(s.dead), 0)::int, coalesce(sum(s.cancelled), 0)::int
FROM bounds,
     generate_series(bounds.current - make_interval(mins => %(bucket_min)s * (%(buckets)s - 1)),
                     bounds.current, make_interval(mins => %(bucket_min)s)) AS b(at)
LEFT JOIN pgjobs_stats AS s
       ON s.minute >= b.at AND s.minute < b.at + make_interval(mins => %(bucket_min)s)
GROUP BY b.at
ORDER BY b.at
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
