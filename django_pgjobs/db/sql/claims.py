"""Statements on claims: taking jobs (S6-S9) and every write a claim makes (S10-S17, S25).

Each write finds its job rows by primary key through a LATERAL probe and applies the S10
predicate (`CLAIM_IS_CURRENT`) under a row lock, so a late write from a superseded claim
changes nothing. Inside a transaction `now()` is the transaction's start. That is what
makes the fence (S16) and transaction mode (S21) sound: the row is locked while the
predicate holds at the start, no claimer can take it while the lock is held, so every
later statement of the same transaction sees the claim as current, and rightly so.
"""

from __future__ import annotations

import functools

from django_pgjobs.db.sql.fragments import (
    CANCELS_ANSWERED,
    CANCELS_REQUESTED,
    CLAIM_IS_CURRENT,
    CLAIM_PICKED,
    CLAIMABLE,
    COMMIT_MODE,
    DEPENDENTS_OF_ACKED,
    DEPENDENTS_OF_BURIED,
    KEPT_COLUMNS,
    KEPT_COLUMNS_OF_J,
    NEXT_DUE_SECONDS,
    NOT_CANCEL_REQUESTED,
    OF_KINDS,
    PROMOTE_RERUN,
    QUEUE_ALLOWANCE,
    UNKEYED,
    in_target,
)

_CLAIM_JOBS = f"""
-- Claim up to %(limit)s pending jobs of %(queues)s (and of the kinds OF_KINDS admits; or
-- in two parts, a worker's threads' and its event loop's: claim_jobs) for %(worker_id)s
-- (S6-S8) by priority DESC, run_after, id. Each row also says whether
-- a lapsed claim waits in these queues (S9): the caller then runs RESCUE_LAPSED_JOBS and
-- claims again. An empty claim still returns one row, for that flag.
-- Per queue, %(floors)s and %(tops)s (each NULL: none) are what CLAIM_FLOORS found:
-- the claim reads each level of the claim index from the queue's floor on, below which
-- only the dead entries of claimed jobs lie while the xmin horizon is held, and starts
-- its skip scan at the top level the queue last had, probing above it first.
WITH RECURSIVE queues (name, floor, top) AS (
    SELECT q.name, coalesce(q.floor, '-infinity'), q.top
    FROM unnest(%(queues)s::text[], %(floors)s::timestamptz[], %(tops)s::int[])
         AS q(name, floor, top)
    -- Paused queues are never claimed; limited ones only by CLAIM_LIMITED_JOBS.
    WHERE NOT EXISTS (
        SELECT 1 FROM pgjobs_queue AS c
        WHERE c.name = q.name
          AND (c.paused OR c.max_running IS NOT NULL OR c.rate_limit IS NOT NULL)
    )
),
levels (queue, floor, priority) AS (
    -- A skip scan of the claim index: one row per (queue, priority) holding pending
    -- jobs, each found by one index probe. Reading runnable rows level by level means a
    -- claim never wades through scheduled rows sorted between two runnable ones. The
    -- first level is the highest, found from the start of the queue's index range; with a
    -- top (floors on), the highest above that top, else the top, else the highest below.
    SELECT q.name, q.floor, CASE WHEN q.top IS NULL THEN
        (SELECT j.priority FROM pgjobs_job AS j
         WHERE j.state = 'pending' AND {UNKEYED} AND j.queue = q.name
           AND j.run_after >= q.floor
         ORDER BY j.priority DESC LIMIT 1)
    ELSE coalesce(
        (SELECT j.priority FROM pgjobs_job AS j
         WHERE j.state = 'pending' AND {UNKEYED} AND j.queue = q.name
           AND j.priority > q.top AND j.run_after >= q.floor
         ORDER BY j.priority DESC LIMIT 1),
        (SELECT j.priority FROM pgjobs_job AS j
         WHERE j.state = 'pending' AND {UNKEYED} AND j.queue = q.name
           AND j.priority = q.top AND j.run_after >= q.floor
         ORDER BY j.run_after, j.id LIMIT 1),
        (SELECT j.priority FROM pgjobs_job AS j
         WHERE j.state = 'pending' AND {UNKEYED} AND j.queue = q.name
           AND j.priority < q.top AND j.run_after >= q.floor
         ORDER BY j.priority DESC LIMIT 1)) END
    FROM queues AS q
    UNION ALL
    SELECT l.queue, l.floor, (SELECT j.priority FROM pgjobs_job AS j
                              WHERE j.state = 'pending' AND {UNKEYED} AND j.queue = l.queue
                                AND j.priority < l.priority AND j.run_after >= l.floor
                              ORDER BY j.priority DESC LIMIT 1)
    FROM levels AS l
    WHERE l.priority IS NOT NULL
),
ordered_levels AS (
    -- Within one priority, the queue holding the oldest runnable job goes first.
    SELECT l.queue, l.floor, l.priority
    FROM levels AS l
    WHERE l.priority IS NOT NULL
    ORDER BY l.priority DESC,
             (SELECT j.run_after FROM pgjobs_job AS j
              WHERE j.state = 'pending' AND {UNKEYED} AND j.queue = l.queue
                AND j.priority = l.priority AND j.run_after >= l.floor
                AND j.run_after <= now()
              ORDER BY j.run_after, j.id LIMIT 1) NULLS LAST,
             l.queue
),
{{PICKED}}
{CLAIM_PICKED}
"""


def _picked(name: str, kinds: str, limit: str) -> str:
    """The `picked` step of CLAIM_JOBS: up to `limit` ids of the kinds `kinds` admits,
    level by level."""
    return f"""{name} AS (
    -- The CTE is an optimization fence: LIMIT applies before the UPDATE, and the LATERAL
    -- scans lock rows only as the LIMIT pulls them, so no more than {limit} are locked.
    SELECT c.id
    FROM ordered_levels AS l
    CROSS JOIN LATERAL (
        SELECT j.id FROM pgjobs_job AS j
        WHERE {CLAIMABLE} AND {UNKEYED} AND j.queue = l.queue AND j.priority = l.priority
          AND j.run_after >= l.floor AND {kinds}
        ORDER BY j.run_after, j.id
        LIMIT {limit}
        FOR UPDATE SKIP LOCKED
    ) AS c
    LIMIT {limit}
),"""


#: A claim of up to %(limit)s jobs of the kinds OF_KINDS admits.
_PICKED_ONE_PART = _picked("picked", OF_KINDS, "%(limit)s")

#: A worker's claim for its threads and its event loop in one statement: up to
#: %(thread_limit)s jobs of the kinds OF_KINDS admits (not of %(not_kinds)s, the loop's),
#: and up to %(loop_limit)s of %(not_kinds)s, each into capacity of its own.
_PICKED_TWO_PARTS = "\n".join(
    [
        _picked("picked_threads", OF_KINDS, "%(thread_limit)s"),
        _picked("picked_loop", "j.kind = ANY(%(not_kinds)s::text[])", "%(loop_limit)s"),
        "picked AS (SELECT id FROM picked_threads UNION ALL SELECT id FROM picked_loop),",
    ]
)


CLAIM_JOBS = _CLAIM_JOBS.replace("{PICKED}", _PICKED_ONE_PART)


@functools.cache
def claim_jobs(limit: int, loop_limit: int = 0) -> str:
    """Return CLAIM_JOBS with its LIMITs written into the text: up to `limit` jobs of the
    kinds its %(only_kinds)s and %(not_kinds)s admit and, with a `loop_limit`, up to that
    many of %(not_kinds)s too (a worker's threads and its event loop, in one round trip).

    A prepared statement is planned once, before its parameters are known; PostgreSQL
    then guesses a parameter LIMIT at a tenth of the table, and the plan (and its cost,
    which can cross jit_above_cost) grows with the backlog. With the LIMIT in the text,
    the one-off plan is the plan a known LIMIT gets. A worker claims a few sizes only,
    so few variants exist per connection.
    """
    for value in (limit, loop_limit):
        if not isinstance(value, int) or isinstance(value, bool) or value < 0:
            raise ValueError(f"A claim limit must be a whole number >= 0, not {value!r}.")
    if limit + loop_limit < 1:
        raise ValueError("A claim must ask for one job at least.")
    if not loop_limit:
        return CLAIM_JOBS.replace("%(limit)s", str(limit))
    return (
        _CLAIM_JOBS.replace("{PICKED}", _PICKED_TWO_PARTS)
        .replace("%(thread_limit)s", str(limit))
        .replace("%(loop_limit)s", str(loop_limit))
        .replace("%(limit)s", str(limit + loop_limit))
    )


CLAIM_LIMITED_JOBS = f"""
-- Claim up to %(limit)s unkeyed jobs of the limited queues %(limited)s for %(worker_id)s,
-- each queue up to what it admits now (QUEUE_ALLOWANCE: its keyed jobs count too, S37).
-- Runs after LOCK_LIMITED_QUEUES, in the same transaction, and stamps its claims with
-- this statement's start, after the turn was had (S37).
WITH clock AS (
    SELECT statement_timestamp() AS at
),
{QUEUE_ALLOWANCE},
picked AS (
    SELECT t.id, a.name AS queue, a.rated
    FROM queue_allowance AS a
    CROSS JOIN LATERAL (
        SELECT j.id FROM pgjobs_job AS j
        WHERE {CLAIMABLE} AND {UNKEYED} AND j.queue = a.name AND {OF_KINDS}
        ORDER BY j.priority DESC, j.run_after, j.id
        LIMIT a.free
        FOR UPDATE SKIP LOCKED
    ) AS t
    LIMIT %(limit)s
),
counted AS (
    -- Each claim of a rated queue counts against its rate (S35).
    INSERT INTO pgjobs_rate_claim (scope, at)
    SELECT 'queue:' || p.queue, clock.at FROM picked AS p, clock WHERE p.rated
),
pruned AS (
    DELETE FROM pgjobs_rate_claim AS r
    USING queue_allowance AS a, clock
    WHERE a.rated AND r.scope = 'queue:' || a.name
      AND r.at <= clock.at - make_interval(secs => a.rate_period_s)
),
{CLAIM_PICKED}
"""

RESCUE_LAPSED_JOBS = f"""
-- Take back up to %(limit)s claims whose lease lapsed, of %(queues)s (NULL: of every
-- queue) (S9): pending again with the attempt counted, so the next claim consumes another;
-- dead with 'max attempts exceeded' when none is left; or the key's pending trigger
-- promoted (S3); dead with its cancel request's reason when one binds the claim (S38).
-- Each lapsed attempt is recorded in the job's errors as 'lease lapsed'.
WITH target AS (
    SELECT j.id, j.attempts >= j.max_attempts AS exhausted,
           j.rerun_payload IS NOT NULL AS has_rerun,
           (SELECT c.reason FROM pgjobs_cancel_request AS c
            WHERE c.job_id = j.id) AS cancel_reason,
           jsonb_build_object('attempt', j.attempts, 'at', now(), 'error', 'lease lapsed',
                              'traceback', NULL, 'exception', NULL,
                              'worker_id', j.worker_id) AS entry
    FROM pgjobs_job AS j
    WHERE j.state = 'running' AND j.claimed_until <= now()
      AND (%(queues)s::text[] IS NULL OR j.queue = ANY(%(queues)s::text[]))
    ORDER BY j.claimed_until
    LIMIT %(limit)s
    FOR UPDATE SKIP LOCKED
),
requeued AS (
    UPDATE pgjobs_job AS j
    SET state = 'pending', claimed_by = NULL, claimed_until = NULL,
        last_error = 'lease lapsed',
        errors = jsonb_path_query_array(j.errors || jsonb_build_array(t.entry),
                 '$[last - $keep to last]', jsonb_build_object('keep', %(errors_kept)s - 1))
    FROM target AS t
    WHERE j.id = t.id AND NOT t.exhausted AND NOT t.has_rerun AND t.cancel_reason IS NULL
    RETURNING j.queue, j.run_after
),
buried AS (
    DELETE FROM pgjobs_job AS j USING target AS t
    WHERE j.id = t.id AND (t.exhausted OR t.cancel_reason IS NOT NULL) AND NOT t.has_rerun
    RETURNING j.*, t.entry AS final_entry, t.cancel_reason
),
dead AS (
    INSERT INTO pgjobs_dead (id, {KEPT_COLUMNS}, last_error, errors, reason, category,
                             died_at)
    SELECT j.id, {KEPT_COLUMNS_OF_J}, 'lease lapsed',
           jsonb_path_query_array(j.errors || jsonb_build_array(j.final_entry),
           '$[last - $keep to last]', jsonb_build_object('keep', %(errors_kept)s - 1)),
           coalesce(j.cancel_reason, 'max attempts exceeded'),
           CASE WHEN j.cancel_reason IS NULL THEN 'max_attempts' ELSE 'cancelled' END, now()
    FROM buried AS j
    RETURNING id
),
promoted AS (
    UPDATE pgjobs_job AS j
    SET {PROMOTE_RERUN},
        last_error = 'lease lapsed',
        errors = jsonb_path_query_array(j.errors || jsonb_build_array(t.entry),
                 '$[last - $keep to last]', jsonb_build_object('keep', %(errors_kept)s - 1))
    FROM target AS t
    WHERE j.id = t.id AND t.has_rerun
    RETURNING j.id, j.queue, j.run_after
),
{CANCELS_ANSWERED},
woke AS (
    SELECT pg_notify(%(channel)s, q.queue)
    FROM (SELECT queue FROM requeued WHERE run_after <= now()
          UNION SELECT queue FROM promoted WHERE run_after <= now()) AS q
    WHERE %(notify)s
),
{DEPENDENTS_OF_BURIED}
SELECT (SELECT count(*) FROM requeued), (SELECT count(*) FROM dead),
       (SELECT count(*) FROM promoted), (SELECT count(*) FROM woke),
       (SELECT count(*) FROM dependents)
"""

NEXT_DUE_IN = f"""
-- Seconds until a job of %(queues)s next becomes claimable: the earliest scheduled
-- pending job, the earliest running job whose lease will lapse, or a rated queue's next
-- slot (NULL: none).
-- A claim that comes up short answers the same itself (CLAIM_PICKED's due_in).
SELECT {NEXT_DUE_SECONDS}
"""

ACK_JOBS = f"""
-- Complete claimed jobs whose claim is current (S12, S17): delete each, keep it as done
-- with its result while it has result retention, or promote its pending trigger (S3).
-- A claim a cancel request binds is not acked (S38): the last column says which, with
-- the request's reason, for the caller to dead-letter.
WITH target AS (
    SELECT j.id, t.result, j.rerun_payload IS NOT NULL AS has_rerun, j.result_ttl_s,
           j.has_children, j.has_parents
    FROM unnest(%(ids)s::bigint[], %(tokens)s::uuid[], %(results)s::jsonb[])
         AS t(id, token, result)
    CROSS JOIN LATERAL (
        SELECT * FROM pgjobs_job AS j
        WHERE j.id = t.id AND {CLAIM_IS_CURRENT} AND {NOT_CANCEL_REQUESTED}
        FOR UPDATE
    ) AS j
),
deleted AS (
    DELETE FROM pgjobs_job AS j
    WHERE {in_target("NOT k.has_rerun AND k.result_ttl_s IS NULL")}
    RETURNING j.id
),
kept AS (
    UPDATE pgjobs_job AS j
    -- LIMIT 1: a claim given twice is in `target` twice, with the same values.
    SET state = 'done', result = (SELECT k.result FROM target AS k WHERE k.id = j.id LIMIT 1),
        finished_at = now(),
        purge_at = now() + make_interval(
            secs => (SELECT k.result_ttl_s FROM target AS k WHERE k.id = j.id LIMIT 1))
    WHERE {in_target("NOT k.has_rerun AND k.result_ttl_s IS NOT NULL")}
    RETURNING j.id
),
promoted AS (
    UPDATE pgjobs_job AS j
    SET {PROMOTE_RERUN}
    WHERE {in_target("k.has_rerun")}
    RETURNING j.queue, j.run_after
),
woke AS (
    SELECT pg_notify(%(channel)s, p.queue)
    FROM (SELECT DISTINCT queue FROM promoted WHERE %(notify)s AND run_after <= now()) AS p
),
{DEPENDENTS_OF_ACKED}
SELECT (SELECT count(*) FROM deleted) + (SELECT count(*) FROM kept)
       + (SELECT count(*) FROM promoted),
       (SELECT count(*) FROM woke) + (SELECT count(*) FROM dependents), {COMMIT_MODE},
       {CANCELS_REQUESTED}
"""

RETRY_JOBS = f"""
-- Record a failed attempt of claimed jobs whose claim is current (S13): back to pending
-- after the given delay, or dead with 'max attempts exceeded' when attempts are spent;
-- a pending trigger (S3) is promoted instead of either. A dead letter's category is the
-- caller's (%(categories)s: 'max_attempts', or 'unknown_kind' for a kind its worker has
-- no handler of). A claim a cancel request binds is not retried (S38): the last column
-- says which, for the caller to dead-letter.
WITH target AS (
    SELECT j.id, t.error, t.delay_s, t.category,
           jsonb_build_object('attempt', j.attempts, 'at', now(), 'error', t.error,
                              'traceback', t.traceback, 'exception', t.exception,
                              'worker_id', j.worker_id) AS entry,
           j.attempts >= j.max_attempts AS exhausted,
           j.rerun_payload IS NOT NULL AS has_rerun
    FROM unnest(%(ids)s::bigint[], %(tokens)s::uuid[], %(errors)s::text[],
                %(tracebacks)s::text[], %(exceptions)s::text[], %(delays_s)s::float8[],
                %(categories)s::text[])
         AS t(id, token, error, traceback, exception, delay_s, category)
    CROSS JOIN LATERAL (
        SELECT * FROM pgjobs_job AS j
        WHERE j.id = t.id AND {CLAIM_IS_CURRENT} AND {NOT_CANCEL_REQUESTED}
        FOR UPDATE
    ) AS j
),
retried AS (
    UPDATE pgjobs_job AS j
    SET state = 'pending', run_after = now() + make_interval(secs => t.delay_s),
        claimed_by = NULL, claimed_until = NULL, last_error = t.error,
        errors = jsonb_path_query_array(j.errors || jsonb_build_array(t.entry),
                 '$[last - $keep to last]', jsonb_build_object('keep', %(errors_kept)s - 1))
    FROM target AS t
    WHERE j.id = t.id AND NOT t.exhausted AND NOT t.has_rerun
    RETURNING j.id
),
promoted AS (
    UPDATE pgjobs_job AS j
    SET {PROMOTE_RERUN},
        last_error = t.error,
        errors = jsonb_path_query_array(j.errors || jsonb_build_array(t.entry),
                 '$[last - $keep to last]', jsonb_build_object('keep', %(errors_kept)s - 1))
    FROM target AS t
    WHERE j.id = t.id AND t.has_rerun
    RETURNING j.queue, j.run_after
),
buried AS (
    DELETE FROM pgjobs_job AS j USING target AS t
    WHERE j.id = t.id AND t.exhausted AND NOT t.has_rerun
    RETURNING j.*, t.error AS final_error, t.entry AS final_entry, t.category AS final_category
),
dead AS (
    INSERT INTO pgjobs_dead (id, {KEPT_COLUMNS}, last_error, errors, reason, category,
                             died_at)
    SELECT j.id, {KEPT_COLUMNS_OF_J}, j.final_error,
           jsonb_path_query_array(j.errors || jsonb_build_array(j.final_entry),
           '$[last - $keep to last]', jsonb_build_object('keep', %(errors_kept)s - 1)),
           'max attempts exceeded', j.final_category, now()
    FROM buried AS j
    RETURNING id
),
woke AS (
    SELECT pg_notify(%(channel)s, p.queue)
    FROM (SELECT DISTINCT queue FROM promoted WHERE %(notify)s AND run_after <= now()) AS p
),
{DEPENDENTS_OF_BURIED}
SELECT (SELECT count(*) FROM retried), (SELECT count(*) FROM promoted),
       (SELECT count(*) FROM dead), (SELECT count(*) FROM woke) + (SELECT count(*) FROM dependents),
       {COMMIT_MODE}, {CANCELS_REQUESTED}
"""

#: RETRY_JOBS for the worker's own record of a timed-out attempt (S33), whose handler
#: it abandoned: a row that handler's fence holds right now is skipped rather than
#: waited for (it comes back when its lease lapses).
TIME_OUT_JOBS = RETRY_JOBS.replace(
    "-- Record a failed attempt of claimed jobs whose claim is current (S13)",
    "-- Record timed-out attempts (S33) as RETRY_JOBS does, skipping rows a fence holds",
    1,
).replace("        FOR UPDATE\n    ) AS j", "        FOR UPDATE SKIP LOCKED\n    ) AS j", 1)

FAIL_JOBS = f"""
-- Dead-letter claimed jobs whose claim is current at once (S15), with the caller's reason
-- verbatim and category (%(categories)s), or as 'cancelled' with the reason of a cancel
-- request that binds the claim (S38: a cancel wins); a pending trigger (S3) is promoted
-- instead.
WITH target AS (
    SELECT j.id, t.error, t.category,
           jsonb_build_object('attempt', j.attempts, 'at', now(), 'error', t.error,
                              'traceback', t.traceback, 'exception', t.exception,
                              'worker_id', j.worker_id) AS entry,
           j.rerun_payload IS NOT NULL AS has_rerun
    FROM unnest(%(ids)s::bigint[], %(tokens)s::uuid[], %(errors)s::text[],
                %(tracebacks)s::text[], %(exceptions)s::text[], %(categories)s::text[])
         AS t(id, token, error, traceback, exception, category)
    CROSS JOIN LATERAL (
        SELECT * FROM pgjobs_job AS j
        WHERE j.id = t.id AND {CLAIM_IS_CURRENT}
        FOR UPDATE
    ) AS j
),
promoted AS (
    UPDATE pgjobs_job AS j
    SET {PROMOTE_RERUN},
        last_error = t.error,
        errors = jsonb_path_query_array(j.errors || jsonb_build_array(t.entry),
                 '$[last - $keep to last]', jsonb_build_object('keep', %(errors_kept)s - 1))
    FROM target AS t
    WHERE j.id = t.id AND t.has_rerun
    RETURNING j.id, j.queue, j.run_after
),
buried AS (
    DELETE FROM pgjobs_job AS j USING target AS t
    WHERE j.id = t.id AND NOT t.has_rerun
    RETURNING j.*, t.error AS final_error, t.entry AS final_entry, t.category AS final_category
),
dead AS (
    INSERT INTO pgjobs_dead (id, {KEPT_COLUMNS}, last_error, errors, reason, category,
                             died_at)
    SELECT j.id, {KEPT_COLUMNS_OF_J}, j.final_error,
           jsonb_path_query_array(j.errors || jsonb_build_array(j.final_entry),
           '$[last - $keep to last]', jsonb_build_object('keep', %(errors_kept)s - 1)),
           coalesce(c.reason, j.final_error),
           CASE WHEN c.job_id IS NULL THEN j.final_category ELSE 'cancelled' END, now()
    FROM buried AS j
    -- job_id is the requests' key: one row at most.
    LEFT JOIN pgjobs_cancel_request AS c ON c.job_id = j.id
    RETURNING id
),
{CANCELS_ANSWERED},
woke AS (
    SELECT pg_notify(%(channel)s, p.queue)
    FROM (SELECT DISTINCT queue FROM promoted WHERE %(notify)s AND run_after <= now()) AS p
),
{DEPENDENTS_OF_BURIED}
SELECT (SELECT count(*) FROM dead), (SELECT count(*) FROM promoted),
       (SELECT count(*) FROM woke) + (SELECT count(*) FROM dependents), {COMMIT_MODE}
"""

RELEASE_JOBS = f"""
-- Hand claims back at shutdown (S25): pending again with the attempt refunded, or the
-- pending trigger promoted; wake the workers of their queues. A row a still-running
-- transaction holds is skipped: it comes back when its lease lapses; so is a claim a
-- cancel request binds (S38): its lapse dead-letters it.
WITH target AS (
    SELECT j.id, j.rerun_payload IS NOT NULL AS has_rerun
    FROM unnest(%(ids)s::bigint[], %(tokens)s::uuid[]) AS t(id, token)
    CROSS JOIN LATERAL (
        SELECT * FROM pgjobs_job AS j
        WHERE j.id = t.id AND {CLAIM_IS_CURRENT} AND {NOT_CANCEL_REQUESTED}
        FOR UPDATE SKIP LOCKED
    ) AS j
),
released AS (
    UPDATE pgjobs_job AS j
    SET state = 'pending', attempts = greatest(j.attempts - 1, 0),
        claimed_by = NULL, claimed_until = NULL
    WHERE {in_target("NOT k.has_rerun")}
    RETURNING j.queue, j.run_after
),
promoted AS (
    UPDATE pgjobs_job AS j
    SET {PROMOTE_RERUN}
    WHERE {in_target("k.has_rerun")}
    RETURNING j.queue, j.run_after
),
woke AS (
    SELECT pg_notify(%(channel)s, q.queue)
    FROM (SELECT queue FROM released WHERE run_after <= now()
          UNION SELECT queue FROM promoted WHERE run_after <= now()) AS q
    WHERE %(notify)s
)
SELECT (SELECT count(*) FROM released) + (SELECT count(*) FROM promoted),
       (SELECT count(*) FROM woke), {COMMIT_MODE}
"""

# Two heartbeats, that differ in how they take the row lock: a handler's own heartbeat
# waits for a lock another transaction holds a moment (the worker's background
# heartbeat, say) rather than be refused; the worker's background heartbeat skips a row
# another statement is changing right now, and tries it again soon. Both lock the row
# FOR NO KEY UPDATE, which a fence's or a transaction-mode job's lock (FOR KEY SHARE,
# LOCK_CURRENT_CLAIM) admits: a running job is heartbeaten whatever locks its row holds
# (S39), so that its lease, and the slot of its key or queue, never lapse under it.
HEARTBEAT_JOBS = f"""
-- Extend current claims to now() + extend (S11: an absolute reset); a lapsed or
-- superseded claim is refused. Returns the jobs extended and their new deadline.
WITH target AS (
    SELECT j.id, t.extend_s
    FROM unnest(%(ids)s::bigint[], %(tokens)s::uuid[], %(extends_s)s::float8[])
         AS t(id, token, extend_s)
    CROSS JOIN LATERAL (
        SELECT * FROM pgjobs_job AS j
        WHERE j.id = t.id AND {CLAIM_IS_CURRENT}
        FOR NO KEY UPDATE
    ) AS j
)
UPDATE pgjobs_job AS j
SET claimed_until = now() + make_interval(secs => t.extend_s)
FROM target AS t
WHERE j.id = t.id
RETURNING j.id, j.claimed_until, {COMMIT_MODE}
"""

HEARTBEAT_UNLOCKED_JOBS = f"""
-- HEARTBEAT_JOBS for the worker's background heartbeats: a row another statement is
-- changing right now is skipped (tried again soon), and each claim's latest progress
-- report (NULL: none) is stored with the time. Returns every claim given: its new
-- deadline if extended, and, if it must stop, why: a cancel request binds it (S38), its
-- job was dead-lettered under this claim (cancelled, say), or its row is gone (deleted
-- by cancel(), or ended under a newer claim after this one lapsed): the worker tells its
-- handler (S32, when the notification was lost or never sent).
WITH given AS (
    SELECT * FROM unnest(%(ids)s::bigint[], %(tokens)s::uuid[], %(extends_s)s::float8[],
                         %(progress)s::jsonb[]) AS t(id, token, extend_s, progress)
),
target AS (
    SELECT j.id, t.extend_s, t.progress
    FROM given AS t
    CROSS JOIN LATERAL (
        SELECT * FROM pgjobs_job AS j
        WHERE j.id = t.id AND {CLAIM_IS_CURRENT}
        FOR NO KEY UPDATE SKIP LOCKED
    ) AS j
),
extended AS (
    UPDATE pgjobs_job AS j
    SET claimed_until = now() + make_interval(secs => t.extend_s),
        progress = coalesce(t.progress || jsonb_build_object('at', now()), j.progress)
    FROM target AS t
    WHERE j.id = t.id
    RETURNING j.id, j.claimed_until
)
SELECT t.id, e.claimed_until,
       coalesce(
           (SELECT c.reason FROM pgjobs_cancel_request AS c
            WHERE c.job_id = t.id),
           CASE WHEN e.id IS NOT NULL THEN NULL
                WHEN EXISTS (SELECT 1 FROM pgjobs_job AS j WHERE j.id = t.id) THEN NULL
                ELSE coalesce((SELECT d.reason FROM pgjobs_dead AS d
                               WHERE d.id = t.id AND d.claimed_by = t.token),
                              'gone')
           END) AS gone,
       {COMMIT_MODE}
FROM given AS t
LEFT JOIN extended AS e ON e.id = t.id
"""

RECORD_PROGRESS = f"""
-- Store a claim's progress report with the time, if the claim is current.
UPDATE pgjobs_job AS j
SET progress = %(progress)s::jsonb || jsonb_build_object('at', now())
FROM (SELECT %(id)s::bigint AS id, %(token)s::uuid AS token) AS t
WHERE j.id = t.id AND {CLAIM_IS_CURRENT}
RETURNING j.id
"""

LOCK_CURRENT_CLAIM = f"""
-- Lock a job row for the rest of the transaction if its claim is current (S16, S21),
-- say whether a cancel request binds the claim (its reason; NULL: none, S38), and which
-- backend and transaction hold the lock (the worker cancels that transaction's statement
-- at a timeout, S39). FOR KEY SHARE keeps every claimer, rescuer, cancel and sweep away
-- (they take the row FOR UPDATE or delete it) and lets the worker's heartbeats in (S39).
SELECT j.id, (SELECT c.reason FROM pgjobs_cancel_request AS c
              WHERE c.job_id = j.id), pg_backend_pid(), pg_current_xact_id()::xid::text
FROM pgjobs_job AS j, (SELECT %(token)s::uuid AS token) AS t
WHERE j.id = %(id)s AND {CLAIM_IS_CURRENT}
FOR KEY SHARE OF j
"""
