"""Statements on the counts the workers keep for the dashboard: per minute (written by the
workers), per hour (summed by the sweeper once an hour has ended), and what the charts
read from both."""

from __future__ import annotations


def _summed_until(table: str, condition: str = "true") -> str:
    """Where the minutes not yet summed into `table` start: an hour after the last summed
    hour, or -infinity (none). A row dated past the current hour (edited by hand, or
    written under a skewed clock) is not taken for one, or nothing would be summed again."""
    return (
        f"(SELECT coalesce(max(hour) + interval '1 hour', '-infinity'::timestamptz) "
        f"FROM {table} WHERE hour < date_trunc('hour', now()) AND {condition})"
    )


def _clamped(expression: str) -> str:
    """A sum of counts as an `int` column holds it (rows edited by hand may hold anything)."""
    return f"least(greatest({expression}, 0), 2147483647)::int"


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

#: The start of THROUGHPUT's first bucket: a multiple of the bucket's size since the
#: hour, (buckets - 1) buckets before the current one. Written out where it is compared,
#: so that the planner reads the minutes along their index from it.
_FIRST_BUCKET = """(date_trunc('hour', now())
                  + floor(extract(minute FROM now()) / %(bucket_min)s)
                    * make_interval(mins => %(bucket_min)s)
                  - make_interval(mins => %(bucket_min)s * (%(buckets)s - 1)))"""

THROUGHPUT = f"""
-- Jobs done, retried, dead-lettered and cancelled per bucket of %(bucket_min)s minutes over
-- the last %(buckets)s buckets (the current one last), every bucket present (zero when
-- nothing happened); a bucket starts at a multiple of its size since the hour. Of one
-- queue if %(queue)s is not NULL. The minutes are read in one range of their index and
-- summed per bucket, then set beside the buckets.
WITH counted AS (
    SELECT floor(extract(epoch FROM s.minute - (SELECT {_FIRST_BUCKET}))
                 / (%(bucket_min)s * 60))::int AS bucket,
           sum(s.succeeded) AS succeeded, sum(s.retried) AS retried, sum(s.dead) AS dead,
           sum(s.cancelled) AS cancelled
    FROM pgjobs_stats AS s
    WHERE s.minute >= {_FIRST_BUCKET}
      AND (%(queue)s::text IS NULL OR s.queue = %(queue)s)
    GROUP BY 1
)
SELECT {_FIRST_BUCKET} + b.bucket * make_interval(mins => %(bucket_min)s),
       {_clamped("coalesce(c.succeeded, 0)")}, {_clamped("coalesce(c.retried, 0)")},
       {_clamped("coalesce(c.dead, 0)")}, {_clamped("coalesce(c.cancelled, 0)")}
FROM generate_series(0, %(buckets)s - 1) AS b(bucket)
LEFT JOIN counted AS c ON c.bucket = b.bucket
ORDER BY b.bucket
"""


RECORD_KIND_STATS = """
-- Add a worker's runs per queue and kind, and their queue-wait and run-time histograms
-- (jsonb lists of counts), to the current minute of each, bucket by bucket.
INSERT INTO pgjobs_kind_stats AS s (minute, queue, kind, runs, wait_hist, run_hist)
SELECT date_trunc('minute', now()), k.queue, k.kind, k.runs, k.wait, k.run
FROM jsonb_to_recordset(%(kinds)s::jsonb) AS k(queue text, kind text, runs int, wait jsonb,
                                                run jsonb)
ON CONFLICT (minute, queue, kind) DO UPDATE SET
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


#: The queue or kind of the sums the workers keep beside each pair's histograms: per
#: queue (kind EVERY), per kind (queue EVERY), over all (both). No queue or kind can be
#: named so.
EVERY = "*"


def _in_scope(alias: str) -> str:
    """Whether a histogram row (`alias`) is one a dashboard's scope reads: of one queue
    and one kind, its rows; with either open (NULL), the sums kept for it (EVERY)."""
    return f"""CASE WHEN %(queue)s::text IS NULL AND %(kind)s::text IS NULL
           THEN {alias}.queue = '{EVERY}' OR {alias}.kind = '{EVERY}'
           ELSE ({alias}.queue = %(queue)s OR %(queue)s::text IS NULL)
                AND ({alias}.kind = %(kind)s OR %(kind)s::text IS NULL) END"""


KIND_STATS_HOURS = f"""
-- The per-hour histograms (the sweeper's sums) a dashboard's scope reads, from %(since)s
-- until %(until)s (the end of the summed hours, as SPAN_START says). Of the scope of one
-- queue and one kind: its rows; with either open (NULL), the sums the workers keep for
-- it ('*'): over all, per queue and per kind, not every pair's.
SELECT h.hour, h.queue, h.kind, h.wait_hist, h.run_hist
FROM pgjobs_kind_stats_hour AS h
WHERE h.hour >= %(since)s AND h.hour < %(until)s
  AND {_in_scope("h")}
"""

KIND_STATS_MINUTES = f"""
-- The per-minute histograms a dashboard's scope reads from %(minutes_from)s (after the
-- last summed hour, or the span's start), as KIND_STATS_HOURS chooses them.
SELECT m.minute, m.queue, m.kind, m.wait_hist, m.run_hist
FROM pgjobs_kind_stats AS m
WHERE m.minute >= %(minutes_from)s
  AND {_in_scope("m")}
"""

SPAN_START = f"""
-- The start of the span of %(minutes)s minutes that ends now, at the start of a minute
-- (%(hours)s: of an hour), on the database clock; where its minutes start: after the
-- last hour the sweeper summed (%(hours)s), else with the span; and, to know the summed
-- hours again, the newest's id (the sweeper only adds rows).
WITH span AS (
    SELECT CASE WHEN %(hours)s
                THEN date_trunc('hour', now()) - make_interval(mins => %(minutes)s - 60)
                ELSE date_trunc('minute', now()) - make_interval(mins => %(minutes)s - 1)
           END AS since
)
SELECT span.since,
       greatest(span.since, {_summed_until("pgjobs_kind_stats_hour", "%(hours)s")}),
       (SELECT max(id) FROM pgjobs_kind_stats_hour WHERE %(hours)s)
FROM span
"""

THROUGHPUT_HOURS = f"""
-- Jobs done, retried, dead-lettered and cancelled per hour over the last %(hours)s hours
-- (the current one last), every hour present: the hours the sweeper has summed, then the
-- minutes after the last of them. Of one queue if %(queue)s is not NULL.
WITH counts AS (
    SELECT h.hour AS at, h.succeeded, h.retried, h.dead, h.cancelled
    FROM pgjobs_stats_hour AS h
    WHERE h.hour > date_trunc('hour', now()) - make_interval(hours => %(hours)s)
      AND (%(queue)s::text IS NULL OR h.queue = %(queue)s)
    UNION ALL
    SELECT date_trunc('hour', m.minute), m.succeeded, m.retried, m.dead, m.cancelled
    FROM pgjobs_stats AS m
    WHERE m.minute >= {_summed_until("pgjobs_stats_hour")}
      AND m.minute > date_trunc('hour', now()) - make_interval(hours => %(hours)s)
      AND (%(queue)s::text IS NULL OR m.queue = %(queue)s)
)
SELECT b.at, {_clamped("coalesce(sum(c.succeeded), 0)")},
       {_clamped("coalesce(sum(c.retried), 0)")}, {_clamped("coalesce(sum(c.dead), 0)")},
       {_clamped("coalesce(sum(c.cancelled), 0)")}
FROM generate_series(date_trunc('hour', now()) - make_interval(hours => %(hours)s - 1),
                     date_trunc('hour', now()), interval '1 hour') AS b(at)
LEFT JOIN counts AS c ON c.at = b.at
GROUP BY b.at
ORDER BY b.at
"""

SUM_STATS_HOURS = f"""
-- Sum each queue's per-minute counts into one row per hour, for the hours after the last
-- summed one that ended more than two minutes ago (a worker's write of a minute commits
-- after it); once per hour: a second sweeper's sum conflicts and does nothing.
INSERT INTO pgjobs_stats_hour (hour, queue, succeeded, retried, dead, cancelled)
SELECT date_trunc('hour', s.minute), s.queue, {_clamped("sum(s.succeeded)")},
       {_clamped("sum(s.retried)")}, {_clamped("sum(s.dead)")}, {_clamped("sum(s.cancelled)")}
FROM pgjobs_stats AS s
WHERE s.minute >= {_summed_until("pgjobs_stats_hour")}
  AND s.minute < date_trunc('hour', now() - interval '2 minutes')
GROUP BY 1, 2
ON CONFLICT (hour, queue) DO NOTHING
"""

SUM_KIND_STATS_HOURS = f"""
-- Sum each queue's and kind's per-minute runs and histograms into one row per hour, for
-- the hours after the last summed one that ended more than two minutes ago; once per
-- hour, as SUM_STATS_HOURS.
WITH minutes AS (
    SELECT date_trunc('hour', s.minute) AS hour, s.queue, s.kind, s.runs, s.wait_hist,
           s.run_hist
    FROM pgjobs_kind_stats AS s
    WHERE s.minute >= {_summed_until("pgjobs_kind_stats_hour")}
      AND s.minute < date_trunc('hour', now() - interval '2 minutes')
      AND jsonb_typeof(s.wait_hist) = 'array' AND jsonb_typeof(s.run_hist) = 'array'
),
buckets AS (
    -- A row edited by hand may hold anything: what is not a count counts none.
    SELECT m.hour, m.queue, m.kind, w.i,
           sum(CASE WHEN jsonb_typeof(w.n) = 'number'
                    THEN greatest(least(w.n::numeric, 1e9), 0)::bigint ELSE 0 END) AS waited,
           sum(CASE WHEN jsonb_typeof(r.n) = 'number'
                    THEN greatest(least(r.n::numeric, 1e9), 0)::bigint ELSE 0 END) AS ran
    FROM minutes AS m
    CROSS JOIN LATERAL jsonb_array_elements(m.wait_hist) WITH ORDINALITY AS w(n, i)
    JOIN LATERAL jsonb_array_elements(m.run_hist) WITH ORDINALITY AS r(n, i) USING (i)
    GROUP BY m.hour, m.queue, m.kind, w.i
),
runs AS (
    SELECT hour, queue, kind, least(sum(greatest(runs, 0)), 2147483647)::int AS runs
    FROM minutes
    GROUP BY hour, queue, kind
)
INSERT INTO pgjobs_kind_stats_hour (hour, queue, kind, runs, wait_hist, run_hist)
SELECT b.hour, b.queue, b.kind, r.runs, jsonb_agg(b.waited ORDER BY b.i),
       jsonb_agg(b.ran ORDER BY b.i)
FROM buckets AS b
JOIN runs AS r USING (hour, queue, kind)
GROUP BY b.hour, b.queue, b.kind, r.runs
ON CONFLICT (hour, queue, kind) DO NOTHING
"""


def _prune(what: str, table: str, column: str, kept: tuple[str, str]) -> str:
    """Delete up to %(limit)s rows of `table` whose `column` is older than what `kept`
    says (its SQL, its words), a batch at a time (the sweeper's)."""
    age, words = kept
    return f"""
-- Delete up to %(limit)s {what} older than {words}.
DELETE FROM {table}
WHERE id IN (
    SELECT id FROM {table}
    WHERE {column} < now() - {age}
    LIMIT %(limit)s
)
"""


_A_DAY = ("interval '1 day'", "a day")
_HOURS_KEPT = ("make_interval(hours => %(hours)s)", "%(hours)s hours")
PRUNE_STATS = _prune("per-minute statistics", "pgjobs_stats", "minute", _A_DAY)
PRUNE_KIND_STATS = _prune("per-minute statistics of kinds", "pgjobs_kind_stats", "minute", _A_DAY)
PRUNE_STATS_HOURS = _prune("hours of per-queue counts", "pgjobs_stats_hour", "hour", _HOURS_KEPT)
PRUNE_KIND_STATS_HOURS = _prune(
    "hours of per-kind histograms", "pgjobs_kind_stats_hour", "hour", _HOURS_KEPT
)
