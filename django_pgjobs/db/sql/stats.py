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

RECORD_KIND_STATS = """
-- Add a worker's runs per kind, and its queue-wait and run-time histograms (jsonb lists
-- of counts), to the current minute of each kind, bucket by bucket.
INSERT INTO pgjobs_kind_stats AS s (minute, kind, runs, wait_hist, run_hist)
SELECT date_trunc('minute', now()), k.kind, k.runs, k.wait, k.run
FROM jsonb_to_recordset(%(kinds)s::jsonb) AS k(kind text, runs int, wait jsonb, run jsonb)
ON CONFLICT (minute, kind) DO UPDATE SET
    runs = s.runs + excluded.runs,
    wait_hist = (SELECT jsonb_agg(a.n::int + b.n::int ORDER BY i)
                 FROM jsonb_array_elements_text(s.wait_hist) WITH ORDINALITY AS a(n, i)
                 JOIN jsonb_array_elements_text(excluded.wait_hist) WITH ORDINALITY AS b(n, i)
                      USING (i)),
    run_hist = (SELECT jsonb_agg(a.n::int + b.n::int ORDER BY i)
                FROM jsonb_array_elements_text(s.run_hist) WITH ORDINALITY AS a(n, i)
                JOIN jsonb_array_elements_text(excluded.run_hist) WITH ORDINALITY AS b(n, i)
                     USING (i))
"""

KIND_LATENCY = """
-- Per kind over the last %(minutes)s minutes: each histogram bucket's total (queue wait,
-- run time), one row per kind and bucket, in bucket order.
SELECT s.kind, i, sum(w.n::int)::int, sum(r.n::int)::int
FROM pgjobs_kind_stats AS s
CROSS JOIN LATERAL jsonb_array_elements_text(s.wait_hist) WITH ORDINALITY AS w(n, i)
JOIN LATERAL jsonb_array_elements_text(s.run_hist) WITH ORDINALITY AS r(n, i) USING (i)
WHERE s.minute > date_trunc('minute', now()) - make_interval(mins => %(minutes)s)
GROUP BY s.kind, i
ORDER BY s.kind, i
"""

PRUNE_KIND_STATS = """
-- Delete up to %(limit)s per-minute statistics of kinds older than a day.
DELETE FROM pgjobs_kind_stats
WHERE id IN (
    SELECT id FROM pgjobs_kind_stats
    WHERE minute < now() - interval '1 day'
    LIMIT %(limit)s
)
"""
