"""Statements on the dead-letter table: requeue (S3 merge), retention (S24), the overview."""

from __future__ import annotations

from django_pgjobs.db.sql.fragments import CANCELS_OF_MOVED, EDGES_OF_PRUNED, ON_LIVE_KEY

REQUEUE_DEAD_JOB = f"""
-- Move a dead letter back to pending with a fresh attempt budget and no expiry; if its
-- key has a live job, merge into that job instead (S3, replace) and drop the letter.
-- A dependent requeued by itself runs without waiting for its parents again.
WITH moved AS (
    DELETE FROM pgjobs_dead WHERE id = %(id)s RETURNING *
),
merged AS (
    INSERT INTO pgjobs_job AS job (
        id, queue, kind, key, state, priority, run_after, attempts, max_attempts, lease_s,
        payload, last_error, errors, result_ttl_s, created_at, timeout_s, progress,
        limit_key, concurrency_limit, rate_limit, rate_period_s, has_parents, has_children)
    SELECT id, queue, kind, key, 'pending', priority, now(), 0, max_attempts, lease_s,
           payload, last_error, errors, result_ttl_s, created_at, timeout_s, progress,
           limit_key, concurrency_limit, rate_limit, rate_period_s, has_parents, has_children
    FROM moved
    {ON_LIVE_KEY}
    DO UPDATE SET
        payload = CASE WHEN job.state = 'pending' THEN excluded.payload ELSE job.payload END,
        run_after = CASE WHEN job.state = 'pending' THEN excluded.run_after
                         ELSE job.run_after END,
        rerun_payload = CASE WHEN job.state = 'running' THEN excluded.payload
                             ELSE job.rerun_payload END,
        rerun_after = CASE WHEN job.state = 'running' THEN excluded.run_after
                           ELSE job.rerun_after END
    RETURNING job.id, job.xmax = 0 AS inserted, job.queue,
              job.state = 'pending' AND job.run_after <= now() AS runnable
),
woke AS (
    SELECT pg_notify(%(channel)s, queue) FROM merged WHERE %(notify)s AND runnable
),
{CANCELS_OF_MOVED}
SELECT id, inserted, (SELECT count(*) FROM woke) FROM merged
"""


def _prune(table: str, letters: str, which: str) -> str:
    return f"""
-- Delete up to %(limit)s dead letters {letters}
-- older than %(retention_s)s (S24), {which},
-- and their edges (S29). Returns how many.
WITH pruned AS (
    DELETE FROM {table}
    WHERE (id, died_at) IN (  -- died_at: each letter is looked for in its partition only
        SELECT id, died_at FROM {table}
        WHERE queue {{test}}
          AND died_at < now() - make_interval(secs => %(retention_s)s::float8)
        ORDER BY died_at
        LIMIT %(limit)s
        FOR UPDATE SKIP LOCKED
    )
    RETURNING id, has_parents
),
{EDGES_OF_PRUNED}
SELECT count(*) FROM pruned
"""


_WHOLE = "in every partition (a retention shorter than the longest, S44)"
_STRAY = "in the default partition only: the range partitions go whole (S44)"
_IN = "of %(queues)s"
_OUTSIDE = "of queues other than %(queues)s (the default retention)"

PRUNE_DEAD_IN_QUEUES = _prune("pgjobs_dead", _IN, _WHOLE).format(test="= ANY(%(queues)s::text[])")
PRUNE_DEAD_OUTSIDE_QUEUES = _prune("pgjobs_dead", _OUTSIDE, _WHOLE).format(
    test="<> ALL(%(queues)s::text[])"
)
PRUNE_STRAY_DEAD_IN_QUEUES = _prune("pgjobs_dead_default", _IN, _STRAY).format(
    test="= ANY(%(queues)s::text[])"
)
PRUNE_STRAY_DEAD_OUTSIDE_QUEUES = _prune("pgjobs_dead_default", _OUTSIDE, _STRAY).format(
    test="<> ALL(%(queues)s::text[])"
)

DELETE_DEAD_JOBS = f"""
-- Delete the dead letters %(ids)s (the admin's delete), and their edges, as pruning
-- deletes them (S29). Returns how many.
WITH pruned AS (
    DELETE FROM pgjobs_dead WHERE id = ANY(%(ids)s::bigint[]) RETURNING id, has_parents
),
{EDGES_OF_PRUNED}
SELECT count(*) FROM pruned
"""

DEAD_QUEUE_NAMES = """
-- The queues that hold dead letters: a skip scan of the dead table's queue index.
WITH RECURSIVE dead_queues (queue) AS (
    (SELECT d.queue FROM pgjobs_dead AS d ORDER BY d.queue LIMIT 1)
    UNION ALL
    SELECT (SELECT d.queue FROM pgjobs_dead AS d WHERE d.queue > q.queue
            ORDER BY d.queue LIMIT 1)
    FROM dead_queues AS q
    WHERE q.queue IS NOT NULL
)
SELECT queue FROM dead_queues WHERE queue IS NOT NULL
"""

ESTIMATE_DEAD = """
-- The planner's estimate of a queue's dead letters (for counts past the cap).
EXPLAIN (FORMAT JSON)
SELECT 1 FROM pgjobs_dead WHERE queue = %(queue)s
"""

ESTIMATE_DEAD_QUEUES = """
-- The statistics' estimate of the dead letters of each of %(queues)s (for counts past the
-- cap), summed over the dead-letter table's partitions from what ANALYZE keeps of each
-- (its rows, and how often each queue comes up) as the planner reckons them, in one read
-- of the catalog: an EXPLAIN per queue plans over every partition (S44). The last column
-- is false when a partition that holds rows has no statistics this role may read (a
-- least-privilege role sees those of the tables it was granted): ask the planner then.
WITH parts AS (
    SELECT c.relname, c.relnamespace, c.reltuples AS total
    FROM pg_inherits AS i
    JOIN pg_class AS c ON c.oid = i.inhrelid
    WHERE i.inhparent = 'pgjobs_dead'::regclass AND c.reltuples > 0
),
stats AS (
    SELECT p.total, s.null_frac, s.n_distinct,
           s.most_common_vals::text::text[] AS vals, s.most_common_freqs AS freqs
    FROM parts AS p
    JOIN pg_stats AS s
      ON s.schemaname = p.relnamespace::regnamespace::text AND s.tablename = p.relname
     AND s.attname = 'queue' AND NOT s.inherited
)
SELECT q.queue,
       round(coalesce(sum(st.total * coalesce(
           st.freqs[array_position(st.vals, q.queue)],
           -- a queue no partition counts among its most common: its share of the rest
           greatest(1 - st.null_frac - coalesce(
               (SELECT sum(f) FROM unnest(st.freqs) AS f), 0), 0)
           / greatest(CASE WHEN st.n_distinct < 0 THEN -st.n_distinct * st.total
                           ELSE st.n_distinct END
                      - coalesce(cardinality(st.vals), 0), 1))), 0))::bigint,
       (SELECT count(*) FROM parts) = (SELECT count(*) FROM stats)
FROM unnest(%(queues)s::text[]) AS q (queue)
LEFT JOIN stats AS st ON true
GROUP BY q.queue
"""

FILE_DEAD_LETTERS = """
-- File the dead letters with ids above %(after)s, up to %(limit)s by id, under the
-- category their reason says (migration 0010), where none is stored yet; one that says
-- none stays NULL, as do the dependency failures (the category reads them by their
-- reason). Returns the last id of the batch (NULL: no letter left).
WITH batch AS (
    SELECT d.id FROM pgjobs_dead AS d
    WHERE d.id > %(after)s
    ORDER BY d.id
    LIMIT %(limit)s
),
filed AS (
    UPDATE pgjobs_dead AS d
    SET category = CASE
        -- Its attempts ran out on workers that had no handler of its kind (S25).
        WHEN d.reason = 'max attempts exceeded'
             AND starts_with(d.last_error, 'unknown job kind ''') THEN 'unknown_kind'
        WHEN d.reason = 'max attempts exceeded' THEN 'max_attempts'
        WHEN d.reason = 'failed' THEN 'failed'
        WHEN d.reason = 'expired' THEN 'expired'
        WHEN d.reason = 'cancelled' THEN 'cancelled'
        WHEN starts_with(d.reason, 'unknown job kind') THEN 'unknown_kind'
        WHEN starts_with(d.reason, 'payload does not fit')
             OR starts_with(d.reason, 'payload is not a JSON object') THEN 'payload'
        WHEN starts_with(d.reason, 'the outcome could not be stored: ')
             OR starts_with(d.reason, 'result is not JSON')
             OR d.reason ~ '^result is [0-9]+ bytes of JSON; '
             THEN 'unstorable'
        END
    FROM batch AS b
    WHERE d.id = b.id AND d.category IS NULL
)
SELECT max(id) FROM batch
"""

#: Whether dead letter `d` matches the filters of a listing: its kind begins with
#: %(kind_pattern)s (a LIKE pattern), its queue is %(queue)s, its category is %(category)s
#: (each NULL: any). A category is the stored one, else "dependency" for a letter of
#: pgjobs_end_parents (its reason begins with %(dependency_prefix)s), and "other" names
#: the letters with none recorded: as DeadJob.filed_category and in_category read them.
_MATCHING_LETTER = """
    (%(kind_pattern)s::text IS NULL OR d.kind LIKE %(kind_pattern)s::text)
    AND (%(queue)s::text IS NULL OR d.queue = %(queue)s::text)
    AND CASE
        WHEN %(category)s::text IS NULL THEN true
        WHEN %(category)s::text = 'dependency'
            THEN d.category IS NULL AND starts_with(d.reason, %(dependency_prefix)s::text)
        WHEN %(category)s::text = 'other'
            THEN d.category IS NULL AND NOT starts_with(d.reason, %(dependency_prefix)s::text)
        ELSE d.category = %(category)s::text
    END"""

DEAD_LETTERS = f"""
-- Up to %(limit)s dead letters matching the filters (kind prefix, queue, category), the
-- newest first, each with its category as filed and its age in seconds by the database
-- clock.
SELECT d.id, d.queue, d.kind, d.key, d.reason,
       coalesce(d.category, CASE WHEN starts_with(d.reason, %(dependency_prefix)s::text)
                                 THEN 'dependency' END) AS category,
       d.attempts, d.max_attempts, d.last_error, d.created_at, d.died_at,
       extract(epoch FROM now() - d.died_at)::float8 AS died_s_ago
FROM pgjobs_dead AS d
WHERE {_MATCHING_LETTER}
ORDER BY d.died_at DESC, d.id DESC
LIMIT %(limit)s
"""

DEAD_LETTER_IDS = f"""
-- The ids above %(after)s, up to %(limit)s in id order, of the dead letters matching the
-- filters (kind prefix, queue, category) that had died by %(died_by)s (a time read from
-- the database's clock): a requeue of every matching letter walks them a batch at a
-- time, and a letter that dies again meanwhile is not taken twice.
SELECT d.id
FROM pgjobs_dead AS d
WHERE d.id > %(after)s AND d.died_at <= %(died_by)s AND {_MATCHING_LETTER}
ORDER BY d.id
LIMIT %(limit)s
"""
