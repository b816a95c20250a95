"""Statements of the keyed claim (S34, S35): jobs with a concurrency key are claimed per
key value, each up to its concurrency and its rate, counted inside the claim's
transaction on the database clock.

Planned without sorts (PLAN_KEYED_CLAIM), so that every walk reads the keyed index in
its order. Two statements in one transaction, as for limited queues: LOCK_KEYS takes the claim
turn of some keys (claimers of one key take turns; a key another claimer holds is
skipped, since that claimer serves it), and CLAIM_KEYED_JOBS, whose snapshot is taken
after the turn is had, counts every claim of those keys made before it.
"""

from __future__ import annotations

from django_pgjobs.db.sql.fragments import CLAIM_PICKED, CLAIMABLE, OF_KINDS, QUEUE_ALLOWANCE

LOCK_KEYS = f"""
-- Take the claim turn of up to %(keys)s concurrency key values with runnable jobs in
-- each of %(queues)s, each queue from the first key after its own cursor in %(afters)s
-- (S34, S37: one cursor per queue, so that a queue of many keys never holds the keys of
-- another back). Returns each (queue, key) taken, then per queue of %(queues)s the last
-- key seen (NULL: none) and whether keys past it were left unseen.
WITH RECURSIVE cursors (queue, after) AS (
    SELECT * FROM unnest(%(queues)s::text[], %(afters)s::text[])
),
found (queue, limit_key, depth) AS (
    -- A skip scan of the keyed index: one probe per key of each queue.
    SELECT q.queue, (SELECT j.limit_key FROM pgjobs_job AS j
                     WHERE j.state = 'pending' AND j.limit_key IS NOT NULL
                       AND j.queue = q.queue AND j.limit_key > q.after
                     ORDER BY j.limit_key LIMIT 1), 1
    FROM cursors AS q
    WHERE NOT EXISTS (SELECT 1 FROM pgjobs_queue AS c WHERE c.name = q.queue AND c.paused)
    UNION ALL
    SELECT f.queue, (SELECT j.limit_key FROM pgjobs_job AS j
                     WHERE j.state = 'pending' AND j.limit_key IS NOT NULL
                       AND j.queue = f.queue AND j.limit_key > f.limit_key
                     ORDER BY j.limit_key LIMIT 1), f.depth + 1
    FROM found AS f
    WHERE f.limit_key IS NOT NULL AND f.depth < %(keys)s
),
seen AS (
    SELECT f.queue, f.limit_key FROM found AS f WHERE f.limit_key IS NOT NULL
),
runnable AS (
    -- The key's next job in claim order (the keyed index's) of the kinds this claim
    -- takes (OF_KINDS), if one can run now.
    SELECT s.queue, s.limit_key FROM seen AS s
    WHERE (SELECT j.id FROM pgjobs_job AS j
           WHERE j.queue = s.queue AND j.limit_key = s.limit_key AND {CLAIMABLE}
             AND {OF_KINDS}
           ORDER BY j.priority DESC, j.run_after, j.id
           LIMIT 1) IS NOT NULL
    OFFSET 0
),
taken AS (
    -- An advisory lock held to the end of this transaction, per key value.
    SELECT r.queue, r.limit_key FROM runnable AS r
    WHERE pg_try_advisory_xact_lock(hashtextextended('pgjobs.key:' || r.limit_key, 0))
)
SELECT array(SELECT t.queue FROM taken AS t ORDER BY t.limit_key, t.queue),
       array(SELECT t.limit_key FROM taken AS t ORDER BY t.limit_key, t.queue),
       array(SELECT (SELECT max(s.limit_key) FROM seen AS s WHERE s.queue = q.queue)
             FROM unnest(%(queues)s::text[]) WITH ORDINALITY AS q(queue, n) ORDER BY q.n),
       array(SELECT EXISTS (SELECT 1 FROM found AS f
                            WHERE f.queue = q.queue AND f.depth = %(keys)s
                              AND f.limit_key IS NOT NULL)
             FROM unnest(%(queues)s::text[]) WITH ORDINALITY AS q(queue, n) ORDER BY q.n)
"""

CLAIM_KEYED_JOBS = f"""
-- Claim up to %(limit)s jobs of the (queue, key) pairs %(pair_queues)s/%(pair_keys)s,
-- whose keys LOCK_KEYS took in this transaction, for %(worker_id)s: each key value up to
-- its concurrency less its running jobs whose lease holds (S34), and its rate less its
-- claims within the rate's period (S35); a key's limits are those of its next job. The
-- limited queues among them, %(limited)s, whose claim turn LOCK_LIMITED_QUEUES took in
-- this transaction, bind their keyed jobs too (S37): each up to its max_running less
-- all its running jobs, keyed or not, and its rate less all its claims. Claims are
-- stamped with this statement's start, after the turns were had (S37).
WITH clock AS (
    SELECT statement_timestamp() AS at
),
pairs AS (
    SELECT * FROM unnest(%(pair_queues)s::text[], %(pair_keys)s::text[])
        AS p(queue, limit_key)
),
heads AS (
    SELECT p.limit_key, h.priority, h.run_after, h.id,
           h.concurrency_limit, h.rate_limit, h.rate_period_s
    FROM pairs AS p
    CROSS JOIN LATERAL (
        SELECT j.* FROM pgjobs_job AS j
        WHERE j.queue = p.queue AND j.limit_key = p.limit_key AND {CLAIMABLE}
        ORDER BY j.priority DESC, j.run_after, j.id
        LIMIT 1
    ) AS h
),
allowance AS (
    SELECT DISTINCT ON (h.limit_key) h.limit_key, h.rate_limit IS NOT NULL AS rated,
           h.rate_period_s, greatest(least(
               h.concurrency_limit - (
                   SELECT count(*) FROM pgjobs_job AS j
                   WHERE j.state = 'running' AND j.limit_key = h.limit_key
                     AND j.claimed_until > now()),
               h.rate_limit - (
                   SELECT count(*) FROM pgjobs_rate_claim AS r, clock
                   WHERE r.scope = 'key:' || h.limit_key
                     AND r.at > clock.at - make_interval(secs => h.rate_period_s)),
               %(limit)s
           ), 0) AS free
    FROM heads AS h
    ORDER BY h.limit_key, h.priority DESC, h.run_after, h.id
),
{QUEUE_ALLOWANCE},
offered AS (
    -- Each pair offers its share of the claim at most (rows it locks and the claim does
    -- not take are let go at commit): a claim of many keys locks about what it takes.
    SELECT t.id, t.priority, t.run_after, p.queue, a.limit_key, a.free, a.rated
    FROM pairs AS p
    JOIN allowance AS a ON a.limit_key = p.limit_key AND a.free > 0
    CROSS JOIN LATERAL (
        SELECT j.id, j.priority, j.run_after FROM pgjobs_job AS j
        WHERE j.queue = p.queue AND j.limit_key = p.limit_key AND {CLAIMABLE} AND {OF_KINDS}
        ORDER BY j.priority DESC, j.run_after, j.id
        LIMIT least(a.free, ceil(%(limit)s::float8 / (SELECT count(*) FROM pairs))::int)
        FOR UPDATE SKIP LOCKED
    ) AS t
    WHERE NOT EXISTS (SELECT 1 FROM queue_allowance AS q
                      WHERE q.name = p.queue AND q.free <= 0)
      -- A queue paused, or limited since the caller's list of limited queues was read
      -- (its turn not taken here), is not offered: never more than its limit (S37).
      AND NOT EXISTS (SELECT 1 FROM pgjobs_queue AS c
                      WHERE c.name = p.queue
                        AND (c.paused OR ((c.max_running IS NOT NULL OR c.rate_limit IS NOT NULL)
                                          AND NOT c.name = ANY(%(limited)s::text[]))))
),
within_keys AS (
    -- A key in two queues is offered from each: its allowance holds over both.
    SELECT o.id, o.priority, o.run_after, o.queue, o.limit_key, o.rated
    FROM (SELECT o.*, row_number() OVER (PARTITION BY o.limit_key
                                         ORDER BY o.priority DESC, o.run_after, o.id) AS nth
          FROM offered AS o) AS o
    WHERE o.nth <= o.free
),
picked AS (
    -- Then each limited queue's allowance over its keys (S37).
    SELECT o.id, o.queue, o.limit_key, o.rated, q.rated AS queue_rated
    FROM (SELECT o.*, row_number() OVER (PARTITION BY o.queue
                                         ORDER BY o.priority DESC, o.run_after, o.id) AS in_queue
          FROM within_keys AS o) AS o
    LEFT JOIN queue_allowance AS q ON q.name = o.queue
    WHERE q.name IS NULL OR o.in_queue <= q.free
    ORDER BY o.priority DESC, o.run_after, o.id
    LIMIT %(limit)s
),
counted AS (
    -- Each claim of a rated key, and of a rated queue, counts against its rate (S35).
    INSERT INTO pgjobs_rate_claim (scope, at)
    SELECT 'key:' || p.limit_key, clock.at FROM picked AS p, clock WHERE p.rated
    UNION ALL
    SELECT 'queue:' || p.queue, clock.at FROM picked AS p, clock WHERE p.queue_rated
),
pruned AS (
    DELETE FROM pgjobs_rate_claim AS r
    USING allowance AS a, clock
    WHERE a.rated AND r.scope = 'key:' || a.limit_key
      AND r.at <= clock.at - make_interval(secs => a.rate_period_s)
),
{CLAIM_PICKED}
"""

PRUNE_RATE_CLAIMS = """
-- Delete up to %(limit)s counted claims older than a day, the longest rate period (S35):
-- those of scopes no claim has pruned since.
DELETE FROM pgjobs_rate_claim
WHERE id IN (
    SELECT id FROM pgjobs_rate_claim
    WHERE at < now() - interval '1 day'
    ORDER BY at
    LIMIT %(limit)s
)
"""
