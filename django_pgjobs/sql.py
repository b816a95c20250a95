"""Every statement the queue runs, as named constants. Only `managers.py` executes them.

Conventions: each statement opens with a `--` line saying what it does; parameters are
named `%(name)s`; time is always the database's `now()` (DESIGN S22), never a timestamp
computed in Python. Statements that act on claims apply one validity predicate
(`_CLAIM_IS_CURRENT`, DESIGN S10) and lock the rows they change, so a late write from a
superseded claim changes nothing.

Inside a transaction `now()` is the transaction's start. That is what makes the fence
(S16) and transaction mode (S21) sound: the row is locked while the predicate holds at
the start, no claimer can take it while the lock is held, so every later statement of
the same transaction sees the claim as current, and rightly so.
"""

from __future__ import annotations

import functools

JOB_TABLE = "pgjobs_job"
DEAD_TABLE = "pgjobs_dead"

# Columns a job keeps when it moves between the live and the dead table.
_KEPT_COLUMNS = (
    "queue, kind, key, priority, run_after, attempts, max_attempts, lease_s, claimed_by,"
    " claimed_until, claimed_at, started_at, worker_id, expires_at, payload, result,"
    " rerun_after, rerun_payload, rerun_expires_at, result_ttl_s, created_at"
)


def _prefixed(alias: str) -> str:
    return ", ".join(f"{alias}.{column.strip()}" for column in _KEPT_COLUMNS.split(","))


# The S10 predicate, for a job row `j` and an input row `t` carrying the claim's token.
_CLAIM_IS_CURRENT = "j.state = 'running' AND j.claimed_by = t.token AND j.claimed_until > now()"


def _current_claims(inputs: str, names: str, select: str, lock: str = "FOR UPDATE") -> str:
    """Return SQL reading one input row `t` per claim (unnest of `inputs`, columns `names`,
    starting with id and token) joined to its job row `j`, locked, when the claim is
    current (S10). The LATERAL makes every lookup a primary-key probe whatever the
    planner guesses of the input's size, so a plan made once stays right."""
    return (
        f"SELECT {select}\n"
        f"    FROM unnest({inputs}) AS t({names})\n"
        "    CROSS JOIN LATERAL (\n"
        "        SELECT * FROM pgjobs_job AS j\n"
        f"        WHERE j.id = t.id AND {_CLAIM_IS_CURRENT_BY_ID}\n"
        f"        {lock}\n"
        "    ) AS j"
    )


# The same, for a row found by its id. Wrapped in `IS TRUE`, the test can be neither an
# index condition nor proof of a partial index's predicate, so the planner never trades
# the primary key for a walk of the lease index, whose cost grows with the running jobs.
_CLAIM_IS_CURRENT_BY_ID = f"({_CLAIM_IS_CURRENT}) IS TRUE"

# The live key index, as ON CONFLICT must name it (its predicate, verbatim).
_ON_LIVE_KEY = "ON CONFLICT (kind, key) WHERE key IS NOT NULL AND state IN ('pending', 'running')"


def _append_error(errors: str, entry: str) -> str:
    """Return SQL for `errors` with `entry` appended, keeping the last %(errors_kept)s."""
    return (
        f"jsonb_path_query_array({errors} || jsonb_build_array({entry}),"
        " '$[last - $keep to last]', jsonb_build_object('keep', %(errors_kept)s - 1))"
    )


def _error_entry(error: str, traceback: str = "NULL", exception: str = "NULL") -> str:
    """Return SQL for one `errors` entry of the current attempt of job row `j`."""
    return (
        f"jsonb_build_object('attempt', j.attempts, 'at', now(), 'error', {error},"
        f" 'traceback', {traceback}, 'exception', {exception}, 'worker_id', j.worker_id)"
    )


# A pending trigger (S3) replaces the run that just ended: same row, the trigger's
# payload, schedule and expiry, a fresh attempt budget. Used by every way a run ends.
_PROMOTE_RERUN = """
    state = 'pending', payload = j.rerun_payload, run_after = coalesce(j.rerun_after, now()),
    expires_at = j.rerun_expires_at, attempts = 0, claimed_by = NULL, claimed_until = NULL,
    rerun_payload = NULL, rerun_after = NULL, rerun_expires_at = NULL"""

# S3 for INSERTs into pgjobs_job AS job: a live job of the same (kind, key) takes the new
# trigger instead of a second row. Pending: payload (and schedule, for "replace") replaced.
# Running: the trigger is stored and promoted when the run ends. "ignore": no change,
# but the row still comes back so the caller learns the live job's id. `xmax = 0` tells
# an inserted row from an updated one.
_MERGE_INTO_LIVE_JOB = f"""{_ON_LIVE_KEY}
    DO UPDATE SET
        payload = CASE WHEN job.state = 'pending' AND %(on_conflict)s <> 'ignore'
                       THEN excluded.payload ELSE job.payload END,
        run_after = CASE WHEN job.state = 'pending' AND %(on_conflict)s = 'replace'
                         THEN excluded.run_after ELSE job.run_after END,
        expires_at = CASE WHEN job.state = 'pending' AND %(on_conflict)s <> 'ignore'
                          THEN excluded.expires_at ELSE job.expires_at END,
        rerun_payload = CASE WHEN job.state = 'running' AND %(on_conflict)s <> 'ignore'
                             THEN excluded.payload ELSE job.rerun_payload END,
        rerun_after = CASE
            WHEN job.state = 'running' AND %(on_conflict)s = 'replace' THEN excluded.run_after
            WHEN job.state = 'running' AND %(on_conflict)s = 'keep_schedule'
                THEN coalesce(job.rerun_after, excluded.run_after)
            ELSE job.rerun_after END,
        rerun_expires_at = CASE WHEN job.state = 'running' AND %(on_conflict)s <> 'ignore'
                                THEN excluded.expires_at ELSE job.rerun_expires_at END
    RETURNING job.id, job.xmax = 0 AS inserted, job.queue, job.created_at,
              job.state = 'pending' AND job.run_after <= now() AS runnable
"""


def _bury(last_error: str, errors: str, reason: str) -> str:
    """Return SQL moving the rows of the CTE `buried` (read as `j`) to the dead table."""
    return (
        f"INSERT INTO pgjobs_dead (id, {_KEPT_COLUMNS}, last_error, errors, reason, died_at)\n"
        f"    SELECT j.id, {_prefixed('j')}, {last_error}, {errors}, {reason}, now()\n"
        "    FROM buried AS j"
    )


# The errors of a job whose lease lapsed, and of one whose final attempt failed.
_LAPSED_ERRORS = _append_error("j.errors", _error_entry("'lease lapsed'"))
_FINAL_ERRORS = _append_error("j.errors", "j.final_entry")

# Sets this statement's transaction to commit without waiting for the WAL flush when
# %(synchronous_commit)s is 'off' (NULL: no change). synchronous_commit is read at commit,
# so a transaction-local setting made while the statement runs applies to its own commit.
# Placed where it runs whenever the statement changed a row: an uncorrelated scalar
# subquery, evaluated once.
_COMMIT_MODE = (
    "(SELECT set_config('synchronous_commit',"
    " coalesce(%(synchronous_commit)s, current_setting('synchronous_commit')), true))"
)

_WAKE_PROMOTED = """
woke AS (
    SELECT pg_notify(%(channel)s, p.queue)
    FROM (SELECT DISTINCT queue FROM promoted WHERE %(notify)s AND run_after <= now()) AS p
)"""


INSERT_JOB = """
-- Insert one job without a key, which nothing can merge with (S1); wake workers when it
-- can run now (S23). ENQUEUE_JOB's shape for the common case, cheaper to parse and plan.
INSERT INTO pgjobs_job (
    queue, kind, state, priority, run_after, attempts, max_attempts, lease_s,
    expires_at, payload, errors, result_ttl_s, created_at)
VALUES (
    %(queue)s, %(kind)s, 'pending', %(priority)s,
    coalesce(now() + make_interval(secs => %(delay_s)s::float8),
             %(run_after)s::timestamptz, now()),
    0, %(max_attempts)s, %(lease_s)s,
    now() + make_interval(secs => %(expires_s)s::float8),
    %(payload)s::jsonb, '[]'::jsonb, %(result_ttl_s)s, now())
RETURNING id, true, created_at,
          CASE WHEN %(notify)s AND run_after <= now() THEN pg_notify(%(channel)s, queue)::text END
"""

ENQUEUE_JOB = f"""
-- Insert one job, or merge it into the live job of its (kind, key) (S3); wake workers (S23).
WITH merged AS (
    INSERT INTO pgjobs_job AS job (
        queue, kind, key, state, priority, run_after, attempts, max_attempts, lease_s,
        expires_at, payload, errors, result_ttl_s, created_at)
    VALUES (
        %(queue)s, %(kind)s, %(key)s, 'pending', %(priority)s,
        coalesce(now() + make_interval(secs => %(delay_s)s::float8),
                 %(run_after)s::timestamptz, now()),
        0, %(max_attempts)s, %(lease_s)s,
        now() + make_interval(secs => %(expires_s)s::float8),
        %(payload)s::jsonb, '[]'::jsonb, %(result_ttl_s)s, now())
    {_MERGE_INTO_LIVE_JOB}
),
woke AS (
    SELECT pg_notify(%(channel)s, queue) FROM merged WHERE %(notify)s AND runnable
)
SELECT id, inserted, created_at, (SELECT count(*) FROM woke) FROM merged
"""

# The rows of ENQUEUE_JOBS' document %(jobs)s, a JSON array of rows [queue, kind, priority,
# delay_s, run_after, max_attempts, lease_s, expires_s, result_ttl_s, key, payload]: one
# parameter the server parses in C, where arrays of strings would be escaped element by
# element client-side. Inserted in input order, so rows come back in input order.
_INSERT_DOCUMENT = """INSERT INTO pgjobs_job AS job (
        queue, kind, key, state, priority, run_after, attempts, max_attempts, lease_s,
        expires_at, payload, errors, result_ttl_s, created_at)
    SELECT i.row ->> 0, i.row ->> 1, i.row ->> 9, 'pending', (i.row ->> 2)::smallint,
           coalesce(now() + make_interval(secs => (i.row ->> 3)::float8),
                    (i.row ->> 4)::timestamptz, now()),
           0, (i.row ->> 5)::int, (i.row ->> 6)::int,
           now() + make_interval(secs => (i.row ->> 7)::float8),
           i.row -> 10, '[]'::jsonb, (i.row ->> 8)::int, now()
    FROM jsonb_array_elements(%(jobs)s::jsonb) WITH ORDINALITY AS i(row, n)
    ORDER BY i.n"""

# One NOTIFY per queue of the CTE `merged`'s runnable rows, and the ids of its rows.
# PostgreSQL would fold the NOTIFYs anyway; this skips the calls.
_WAKE_AND_RETURN_IDS = """woke AS (
    SELECT pg_notify(%(channel)s, q.queue)
    FROM (SELECT DISTINCT queue FROM merged WHERE %(notify)s AND runnable) AS q
)
SELECT id, inserted, (SELECT count(*) FROM woke) FROM merged"""

ENQUEUE_JOBS = f"""
-- Insert many jobs in one statement (S5), merging keyed ones as ENQUEUE_JOB does.
-- The caller folds duplicate keys beforehand, because ON CONFLICT cannot change one row
-- twice in a statement.
WITH merged AS (
    {_INSERT_DOCUMENT}
    {_MERGE_INTO_LIVE_JOB}
),
{_WAKE_AND_RETURN_IDS}
"""

ENQUEUE_KEYLESS_JOBS = f"""
-- ENQUEUE_JOBS for a document whose jobs have no key: with nothing to merge, the rows
-- skip ON CONFLICT's check of the key index (a tenth of the statement's time).
WITH merged AS (
    {_INSERT_DOCUMENT}
    RETURNING job.id, true AS inserted, job.queue, job.run_after <= now() AS runnable
),
{_WAKE_AND_RETURN_IDS}
"""

_CLAIM_PICKED = f"""claimed AS (
    -- Claim the rows of `picked` (S8).
    UPDATE pgjobs_job AS j
    SET state = 'running',
        attempts = j.attempts + 1,
        claimed_by = gen_random_uuid(),
        claimed_at = now(),
        started_at = coalesce(j.started_at, now()),
        claimed_until = now() + make_interval(secs => j.lease_s),
        worker_id = %(worker_id)s
    FROM picked AS p
    WHERE j.id = p.id
    RETURNING j.id, j.queue, j.kind, j.key, j.priority, j.run_after, j.attempts,
              j.max_attempts, j.lease_s, j.claimed_by, j.claimed_at, j.claimed_until,
              j.worker_id, j.expires_at, j.created_at, j.payload
),
flags AS (
    SELECT EXISTS (
        SELECT 1 FROM pgjobs_job AS j
        WHERE j.state = 'running' AND j.claimed_until <= now()
          AND j.queue = ANY(%(queues)s::text[])
    ) AS lapsed_waiting, {_COMMIT_MODE} AS commit_mode
)
SELECT f.lapsed_waiting, c.*
FROM flags AS f
LEFT JOIN claimed AS c ON true
"""

# A job a claim may take: runnable now and not expired.
_CLAIMABLE = (
    "j.state = 'pending' AND j.run_after <= now()"
    " AND (j.expires_at IS NULL OR j.expires_at > now())"
)


CLAIM_JOBS = f"""
-- Claim up to %(limit)s pending jobs of %(queues)s for %(worker_id)s (S6-S8) by priority
-- DESC, run_after, id. Each row also says whether a lapsed claim waits in these queues
-- (S9): the caller then runs RESCUE_LAPSED_JOBS and claims again. An empty claim still
-- returns one row, for that flag.
WITH RECURSIVE levels (queue, priority) AS (
    -- A skip scan of the claim index: one row per (queue, priority) holding pending
    -- jobs, each found by one index probe. Reading runnable rows level by level means a
    -- claim never wades through scheduled rows sorted between two runnable ones.
    SELECT q.name, (SELECT max(j.priority) FROM pgjobs_job AS j
                    WHERE j.state = 'pending' AND j.queue = q.name)
    FROM unnest(%(queues)s::text[]) AS q(name)
    -- Paused queues are never claimed; limited ones only by CLAIM_LIMITED_JOBS.
    WHERE NOT EXISTS (
        SELECT 1 FROM pgjobs_queue AS c
        WHERE c.name = q.name AND (c.paused OR c.max_running IS NOT NULL)
    )
    UNION ALL
    SELECT l.queue, (SELECT max(j.priority) FROM pgjobs_job AS j
                     WHERE j.state = 'pending' AND j.queue = l.queue AND j.priority < l.priority)
    FROM levels AS l
    WHERE l.priority IS NOT NULL
),
ordered_levels AS (
    -- Within one priority, the queue holding the oldest runnable job goes first.
    SELECT l.queue, l.priority
    FROM levels AS l
    WHERE l.priority IS NOT NULL
    ORDER BY l.priority DESC,
             (SELECT j.run_after FROM pgjobs_job AS j
              WHERE j.state = 'pending' AND j.queue = l.queue AND j.priority = l.priority
                AND j.run_after <= now()
              ORDER BY j.run_after, j.id LIMIT 1) NULLS LAST,
             l.queue
),
picked AS (
    -- The CTE is an optimization fence: LIMIT applies before the UPDATE, and the LATERAL
    -- scans lock rows only as the LIMIT pulls them, so no more than %(limit)s are locked.
    SELECT c.id
    FROM ordered_levels AS l
    CROSS JOIN LATERAL (
        SELECT j.id FROM pgjobs_job AS j
        WHERE {_CLAIMABLE} AND j.queue = l.queue AND j.priority = l.priority
        ORDER BY j.run_after, j.id
        LIMIT %(limit)s
        FOR UPDATE SKIP LOCKED
    ) AS c
    LIMIT %(limit)s
),
{_CLAIM_PICKED}"""


@functools.cache
def claim_jobs(limit: int) -> str:
    """Return CLAIM_JOBS with its LIMIT written into the text.

    A prepared statement is planned once, before its parameters are known; PostgreSQL
    then guesses a parameter LIMIT at a tenth of the table, and the plan (and its cost,
    which can cross jit_above_cost) grows with the backlog. With the LIMIT in the text,
    the one-off plan is the plan a known LIMIT gets. A worker claims a few sizes only
    (Worker._claim_size), so few variants exist per connection.
    """
    if not isinstance(limit, int) or isinstance(limit, bool) or limit < 1:
        raise ValueError(f"A claim limit must be a whole number >= 1, not {limit!r}.")
    return CLAIM_JOBS.replace("%(limit)s", str(limit))


LOCK_LIMITED_QUEUES = """
-- Take the claim turn of the limited queues among %(queues)s (S6 with a limit): claimers
-- of one limited queue wait for each other here, so that the next statement of this
-- transaction, with a snapshot taken after the wait, counts every claim made before it.
SELECT c.name
FROM pgjobs_queue AS c
WHERE c.name = ANY(%(queues)s::text[]) AND c.max_running IS NOT NULL AND NOT c.paused
ORDER BY c.name
FOR UPDATE
"""

CLAIM_LIMITED_JOBS = f"""
-- Claim up to %(limit)s jobs of the limited queues among %(queues)s for %(worker_id)s,
-- each queue up to its max_running less its running jobs whose lease holds (a lapsed
-- lease frees its slot). Runs after LOCK_LIMITED_QUEUES, in the same transaction.
WITH allowance AS (
    SELECT c.name, greatest(c.max_running - (
        SELECT count(*) FROM pgjobs_job AS j
        WHERE j.state = 'running' AND j.queue = c.name AND j.claimed_until > now()
    ), 0) AS free
    FROM pgjobs_queue AS c
    WHERE c.name = ANY(%(queues)s::text[]) AND c.max_running IS NOT NULL AND NOT c.paused
),
picked AS (
    SELECT t.id
    FROM allowance AS a
    CROSS JOIN LATERAL (
        SELECT j.id FROM pgjobs_job AS j
        WHERE {_CLAIMABLE} AND j.queue = a.name
        ORDER BY j.priority DESC, j.run_after, j.id
        LIMIT least(a.free, %(limit)s)
        FOR UPDATE SKIP LOCKED
    ) AS t
    LIMIT %(limit)s
),
{_CLAIM_PICKED}"""

LIMITED_QUEUES = """
-- The queues with a limit on their running jobs (claimed by CLAIM_LIMITED_JOBS).
SELECT name FROM pgjobs_queue WHERE max_running IS NOT NULL
"""

RESCUE_LAPSED_JOBS = f"""
-- Take back up to %(limit)s claims whose lease lapsed, of %(queues)s (NULL: of every
-- queue) (S9): pending again with the attempt counted, so the next claim consumes another;
-- dead with 'max attempts exceeded' when none is left; or the key's pending trigger
-- promoted (S3). Each lapsed attempt is recorded in the job's errors as 'lease lapsed'.
WITH target AS (
    SELECT j.id, j.attempts >= j.max_attempts AS exhausted,
           j.rerun_payload IS NOT NULL AS has_rerun
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
        last_error = 'lease lapsed', errors = {_LAPSED_ERRORS}
    FROM target AS t
    WHERE j.id = t.id AND NOT t.exhausted AND NOT t.has_rerun
    RETURNING j.queue, j.run_after
),
buried AS (
    DELETE FROM pgjobs_job AS j USING target AS t
    WHERE j.id = t.id AND t.exhausted AND NOT t.has_rerun
    RETURNING j.*
),
dead AS (
    {_bury("'lease lapsed'", _LAPSED_ERRORS, "'max attempts exceeded'")}
    RETURNING id
),
promoted AS (
    UPDATE pgjobs_job AS j
    SET {_PROMOTE_RERUN}, last_error = 'lease lapsed', errors = {_LAPSED_ERRORS}
    FROM target AS t
    WHERE j.id = t.id AND t.has_rerun
    RETURNING j.queue, j.run_after
),
woke AS (
    SELECT pg_notify(%(channel)s, q.queue)
    FROM (SELECT queue FROM requeued WHERE run_after <= now()
          UNION SELECT queue FROM promoted WHERE run_after <= now()) AS q
    WHERE %(notify)s
)
SELECT (SELECT count(*) FROM requeued), (SELECT count(*) FROM dead),
       (SELECT count(*) FROM promoted), (SELECT count(*) FROM woke)
"""

ACK_JOBS = f"""
-- Complete claimed jobs whose claim is current (S12, S17): delete each, keep it as done
-- with its result while it has result retention, or promote its pending trigger (S3).
WITH target AS (
    {
    _current_claims(
        "%(ids)s::bigint[], %(tokens)s::uuid[], %(results)s::jsonb[]",
        "id, token, result",
        "j.id, t.result, j.rerun_payload IS NOT NULL AS has_rerun, j.result_ttl_s",
    )
}
),
deleted AS (
    DELETE FROM pgjobs_job AS j USING target AS t
    WHERE j.id = t.id AND NOT t.has_rerun AND t.result_ttl_s IS NULL
    RETURNING j.id
),
kept AS (
    UPDATE pgjobs_job AS j
    SET state = 'done', result = t.result, finished_at = now(),
        purge_at = now() + make_interval(secs => t.result_ttl_s)
    FROM target AS t
    WHERE j.id = t.id AND NOT t.has_rerun AND t.result_ttl_s IS NOT NULL
    RETURNING j.id
),
promoted AS (
    UPDATE pgjobs_job AS j
    SET {_PROMOTE_RERUN}
    FROM target AS t
    WHERE j.id = t.id AND t.has_rerun
    RETURNING j.queue, j.run_after
),
{_WAKE_PROMOTED}
SELECT (SELECT count(*) FROM deleted) + (SELECT count(*) FROM kept)
       + (SELECT count(*) FROM promoted),
       (SELECT count(*) FROM woke), {_COMMIT_MODE}
"""

RETRY_JOBS = f"""
-- Record a failed attempt of claimed jobs whose claim is current (S13): back to pending
-- after the given delay, or dead with 'max attempts exceeded' when attempts are spent;
-- a pending trigger (S3) is promoted instead of either.
WITH target AS (
    {
    _current_claims(
        "%(ids)s::bigint[], %(tokens)s::uuid[], %(errors)s::text[], %(tracebacks)s::text[],"
        " %(exceptions)s::text[], %(delays_s)s::float8[]",
        "id, token, error, traceback, exception, delay_s",
        "j.id, t.error, t.delay_s, "
        + _error_entry("t.error", "t.traceback", "t.exception")
        + " AS entry, j.attempts >= j.max_attempts AS exhausted,"
        " j.rerun_payload IS NOT NULL AS has_rerun",
    )
}
),
retried AS (
    UPDATE pgjobs_job AS j
    SET state = 'pending', run_after = now() + make_interval(secs => t.delay_s),
        claimed_by = NULL, claimed_until = NULL, last_error = t.error,
        errors = {_append_error("j.errors", "t.entry")}
    FROM target AS t
    WHERE j.id = t.id AND NOT t.exhausted AND NOT t.has_rerun
    RETURNING j.id
),
promoted AS (
    UPDATE pgjobs_job AS j
    SET {_PROMOTE_RERUN}, last_error = t.error, errors = {_append_error("j.errors", "t.entry")}
    FROM target AS t
    WHERE j.id = t.id AND t.has_rerun
    RETURNING j.queue, j.run_after
),
buried AS (
    DELETE FROM pgjobs_job AS j USING target AS t
    WHERE j.id = t.id AND t.exhausted AND NOT t.has_rerun
    RETURNING j.*, t.error AS final_error, t.entry AS final_entry
),
dead AS (
    {_bury("j.final_error", _FINAL_ERRORS, "'max attempts exceeded'")}
    RETURNING id
),
{_WAKE_PROMOTED}
SELECT (SELECT count(*) FROM retried), (SELECT count(*) FROM promoted),
       (SELECT count(*) FROM dead), (SELECT count(*) FROM woke), {_COMMIT_MODE}
"""

FAIL_JOBS = f"""
-- Dead-letter claimed jobs whose claim is current at once (S15), with the caller's reason
-- verbatim; a pending trigger (S3) is promoted instead.
WITH target AS (
    {
    _current_claims(
        "%(ids)s::bigint[], %(tokens)s::uuid[], %(errors)s::text[], %(tracebacks)s::text[],"
        " %(exceptions)s::text[]",
        "id, token, error, traceback, exception",
        "j.id, t.error, "
        + _error_entry("t.error", "t.traceback", "t.exception")
        + " AS entry, j.rerun_payload IS NOT NULL AS has_rerun",
    )
}
),
promoted AS (
    UPDATE pgjobs_job AS j
    SET {_PROMOTE_RERUN}, last_error = t.error, errors = {_append_error("j.errors", "t.entry")}
    FROM target AS t
    WHERE j.id = t.id AND t.has_rerun
    RETURNING j.queue, j.run_after
),
buried AS (
    DELETE FROM pgjobs_job AS j USING target AS t
    WHERE j.id = t.id AND NOT t.has_rerun
    RETURNING j.*, t.error AS final_error, t.entry AS final_entry
),
dead AS (
    {_bury("j.final_error", _FINAL_ERRORS, "j.final_error")}
    RETURNING id
),
{_WAKE_PROMOTED}
SELECT (SELECT count(*) FROM dead), (SELECT count(*) FROM promoted), (SELECT count(*) FROM woke),
       {_COMMIT_MODE}
"""

RELEASE_JOBS = f"""
-- Hand claims back at shutdown (S25): pending again with the attempt refunded, or the
-- pending trigger promoted; wake the workers of their queues. A row a still-running
-- transaction holds is skipped: it comes back when its lease lapses.
WITH target AS (
    {
    _current_claims(
        "%(ids)s::bigint[], %(tokens)s::uuid[]",
        "id, token",
        "j.id, j.rerun_payload IS NOT NULL AS has_rerun",
        "FOR UPDATE SKIP LOCKED",
    )
}
),
released AS (
    UPDATE pgjobs_job AS j
    SET state = 'pending', attempts = greatest(j.attempts - 1, 0),
        claimed_by = NULL, claimed_until = NULL
    FROM target AS t
    WHERE j.id = t.id AND NOT t.has_rerun
    RETURNING j.queue, j.run_after
),
promoted AS (
    UPDATE pgjobs_job AS j
    SET {_PROMOTE_RERUN}
    FROM target AS t
    WHERE j.id = t.id AND t.has_rerun
    RETURNING j.queue, j.run_after
),
woke AS (
    SELECT pg_notify(%(channel)s, q.queue)
    FROM (SELECT queue FROM released WHERE run_after <= now()
          UNION SELECT queue FROM promoted WHERE run_after <= now()) AS q
    WHERE %(notify)s
)
SELECT (SELECT count(*) FROM released) + (SELECT count(*) FROM promoted),
       (SELECT count(*) FROM woke), {_COMMIT_MODE}
"""

HEARTBEAT_JOBS = f"""
-- Extend current claims to now() + extend (S11: an absolute reset); a lapsed or
-- superseded claim is refused. Returns the jobs extended and their new deadline.
WITH target AS (
    {
    _current_claims(
        "%(ids)s::bigint[], %(tokens)s::uuid[], %(extends_s)s::float8[]",
        "id, token, extend_s",
        "j.id, t.extend_s",
    )
}
)
UPDATE pgjobs_job AS j
SET claimed_until = now() + make_interval(secs => t.extend_s)
FROM target AS t
WHERE j.id = t.id
RETURNING j.id, j.claimed_until, {_COMMIT_MODE}
"""

HEARTBEAT_UNLOCKED_JOBS = f"""
-- HEARTBEAT_JOBS for the worker's background heartbeats: rows locked by a running fence
-- or transaction-mode job are skipped (that lock already keeps every claimer away).
WITH target AS (
    {
    _current_claims(
        "%(ids)s::bigint[], %(tokens)s::uuid[], %(extends_s)s::float8[]",
        "id, token, extend_s",
        "j.id, t.extend_s",
        "FOR UPDATE SKIP LOCKED",
    )
}
)
UPDATE pgjobs_job AS j
SET claimed_until = now() + make_interval(secs => t.extend_s)
FROM target AS t
WHERE j.id = t.id
RETURNING j.id, j.claimed_until, {_COMMIT_MODE}
"""

LOCK_CURRENT_CLAIM = f"""
-- Lock a job row for the rest of the transaction if its claim is current (S16, S21).
SELECT j.id
FROM pgjobs_job AS j, (SELECT %(token)s::uuid AS token) AS t
WHERE j.id = %(id)s AND {_CLAIM_IS_CURRENT_BY_ID}
FOR UPDATE OF j
"""

CANCEL_JOB = """
-- Delete a pending or running job (S18); a running handler's later writes are refused.
DELETE FROM pgjobs_job WHERE id = %(id)s AND state IN ('pending', 'running') RETURNING id
"""

REQUEUE_DEAD_JOB = f"""
-- Move a dead letter back to pending with a fresh attempt budget and no expiry; if its
-- key has a live job, merge into that job instead (S3, replace) and drop the letter.
WITH moved AS (
    DELETE FROM pgjobs_dead WHERE id = %(id)s RETURNING *
),
merged AS (
    INSERT INTO pgjobs_job AS job (
        id, queue, kind, key, state, priority, run_after, attempts, max_attempts, lease_s,
        payload, last_error, errors, result_ttl_s, created_at)
    SELECT id, queue, kind, key, 'pending', priority, now(), 0, max_attempts, lease_s,
           payload, last_error, errors, result_ttl_s, created_at
    FROM moved
    {_ON_LIVE_KEY}
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
)
SELECT id, inserted, (SELECT count(*) FROM woke) FROM merged
"""

NEXT_DUE_IN = """
-- Seconds from now() until a job of %(queues)s next becomes claimable: the earliest
-- scheduled pending job, or the earliest running job whose lease will lapse (NULL: none).
SELECT extract(epoch FROM least(
    (SELECT min(n.run_after)
     FROM unnest(%(queues)s::text[]) AS q(name)
     CROSS JOIN LATERAL (
         SELECT j.run_after FROM pgjobs_job AS j
         WHERE j.state = 'pending' AND j.queue = q.name AND j.run_after > now()
         ORDER BY j.run_after
         LIMIT 1
     ) AS n),
    (SELECT j.claimed_until FROM pgjobs_job AS j
     WHERE j.state = 'running' AND j.claimed_until > now()
       AND j.queue = ANY(%(queues)s::text[])
     ORDER BY j.claimed_until
     LIMIT 1)
) - now())::float8
"""

SWEEP_EXPIRED = f"""
-- Move up to %(limit)s live jobs past expires_at to the dead table as 'expired' (S24);
-- a pending trigger (S3) is promoted instead, the expiry kept in the job's errors.
WITH target AS (
    SELECT j.id, j.rerun_payload IS NOT NULL AS has_rerun
    FROM pgjobs_job AS j
    WHERE j.expires_at <= now() AND j.state IN ('pending', 'running')
    ORDER BY j.expires_at
    LIMIT %(limit)s
    FOR UPDATE SKIP LOCKED
),
buried AS (
    DELETE FROM pgjobs_job AS j USING target AS t
    WHERE j.id = t.id AND NOT t.has_rerun
    RETURNING j.*
),
dead AS (
    {_bury("j.last_error", "j.errors", "'expired'")}
    RETURNING id
),
promoted AS (
    UPDATE pgjobs_job AS j
    SET {_PROMOTE_RERUN}, last_error = 'expired',
        errors = {_append_error("j.errors", _error_entry("'expired'"))}
    FROM target AS t
    WHERE j.id = t.id AND t.has_rerun
    RETURNING j.queue, j.run_after
),
{_WAKE_PROMOTED}
SELECT (SELECT count(*) FROM dead), (SELECT count(*) FROM promoted)
"""

PRUNE_DONE = """
-- Delete up to %(limit)s done jobs whose result retention has ended (S24).
DELETE FROM pgjobs_job
WHERE id IN (
    SELECT id FROM pgjobs_job
    WHERE state = 'done' AND purge_at <= now()
    ORDER BY purge_at
    LIMIT %(limit)s
    FOR UPDATE SKIP LOCKED
)
"""

PRUNE_DEAD_IN_QUEUES = """
-- Delete up to %(limit)s dead letters of %(queues)s older than %(retention_s)s (S24).
DELETE FROM pgjobs_dead
WHERE id IN (
    SELECT id FROM pgjobs_dead
    WHERE queue = ANY(%(queues)s::text[])
      AND died_at < now() - make_interval(secs => %(retention_s)s::float8)
    ORDER BY died_at
    LIMIT %(limit)s
    FOR UPDATE SKIP LOCKED
)
"""

PRUNE_DEAD_OUTSIDE_QUEUES = """
-- Delete up to %(limit)s dead letters of queues other than %(queues)s older than
-- %(retention_s)s (S24): the default retention, for queues without their own.
DELETE FROM pgjobs_dead
WHERE id IN (
    SELECT id FROM pgjobs_dead
    WHERE queue <> ALL(%(queues)s::text[])
      AND died_at < now() - make_interval(secs => %(retention_s)s::float8)
    ORDER BY died_at
    LIMIT %(limit)s
    FOR UPDATE SKIP LOCKED
)
"""

RUN_JOBS_NOW = """
-- Make pending jobs runnable now (admin "run now"); wake the workers of their queues.
WITH moved AS (
    UPDATE pgjobs_job SET run_after = now()
    WHERE id = ANY(%(ids)s::bigint[]) AND state = 'pending'
    RETURNING queue
),
woke AS (
    SELECT pg_notify(%(channel)s, q.queue)
    FROM (SELECT DISTINCT queue FROM moved) AS q
    WHERE %(notify)s
)
SELECT (SELECT count(*) FROM moved), (SELECT count(*) FROM woke)
"""

CANCEL_JOBS = f"""
-- Move pending or running jobs to the dead table with %(reason)s (the admin's cancel); a
-- running handler's later writes are refused (S10), and the letter can be requeued.
WITH buried AS (
    DELETE FROM pgjobs_job AS j
    WHERE j.id = ANY(%(ids)s::bigint[]) AND j.state IN ('pending', 'running')
    RETURNING j.*
),
dead AS (
    {_bury("j.last_error", "j.errors", "%(reason)s")}
    RETURNING id
)
SELECT count(*) FROM dead
"""

LIVE_QUEUE_NAMES = """
-- The queues that hold pending or running jobs. Pending queues come from a skip scan of
-- the schedule index, one probe per queue, never a DISTINCT over the backlog; running
-- jobs are few.
WITH RECURSIVE pending_queues (queue) AS (
    (SELECT j.queue FROM pgjobs_job AS j WHERE j.state = 'pending' ORDER BY j.queue LIMIT 1)
    UNION ALL
    SELECT (SELECT j.queue FROM pgjobs_job AS j
            WHERE j.state = 'pending' AND j.queue > p.queue
            ORDER BY j.queue LIMIT 1)
    FROM pending_queues AS p
    WHERE p.queue IS NOT NULL
)
SELECT queue FROM pending_queues WHERE queue IS NOT NULL
UNION
SELECT DISTINCT queue FROM pgjobs_job WHERE state = 'running'
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

QUEUE_OVERVIEW = """
-- Per queue: runnable, scheduled and dead jobs, each counted up to %(cap)s + 1 rows along
-- an index (a count at the cap is estimated by the caller); running jobs, counted
-- exactly in one pass (there are at most as many as the workers' slots); and the age of
-- the oldest runnable job in seconds, by the database clock.
WITH running AS (
    SELECT j.queue, count(*) AS n
    FROM pgjobs_job AS j
    WHERE j.state = 'running' AND j.queue = ANY(%(queues)s::text[])
    GROUP BY j.queue
)
SELECT q.name,
       (SELECT count(*) FROM (SELECT 1 FROM pgjobs_job AS j
                              WHERE j.state = 'pending' AND j.queue = q.name
                                AND j.run_after <= now()
                              LIMIT %(cap)s + 1) AS c),
       (SELECT count(*) FROM (SELECT 1 FROM pgjobs_job AS j
                              WHERE j.state = 'pending' AND j.queue = q.name
                                AND j.run_after > now()
                              LIMIT %(cap)s + 1) AS c),
       coalesce((SELECT r.n FROM running AS r WHERE r.queue = q.name), 0),
       (SELECT count(*) FROM (SELECT 1 FROM pgjobs_dead AS d WHERE d.queue = q.name
                              LIMIT %(cap)s + 1) AS c),
       (SELECT extract(epoch FROM now() - min(j.run_after))::float8 FROM pgjobs_job AS j
        WHERE j.state = 'pending' AND j.queue = q.name AND j.run_after <= now())
FROM unnest(%(queues)s::text[]) AS q(name)
ORDER BY q.name
"""

ESTIMATE_RUNNABLE = """
-- The planner's estimate of a queue's runnable jobs (for counts past the cap).
EXPLAIN (FORMAT JSON)
SELECT 1 FROM pgjobs_job
WHERE state = 'pending' AND queue = %(queue)s AND run_after <= now()
"""

ESTIMATE_SCHEDULED = """
-- The planner's estimate of a queue's scheduled jobs (for counts past the cap).
EXPLAIN (FORMAT JSON)
SELECT 1 FROM pgjobs_job
WHERE state = 'pending' AND queue = %(queue)s AND run_after > now()
"""

ESTIMATE_DEAD = """
-- The planner's estimate of a queue's dead letters (for counts past the cap).
EXPLAIN (FORMAT JSON)
SELECT 1 FROM pgjobs_dead WHERE queue = %(queue)s
"""

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

LISTEN_CHANNEL = """
-- Subscribe this connection to the wake-up channel (S23); {channel} is an identifier.
LISTEN {channel}
"""

PROBE_LISTENER = """
-- Send %(token)s on the wake-up channel: a LISTEN connection that receives it is one
-- that notifications reach (through a transaction-mode pooler, they do not).
SELECT pg_notify(%(channel)s, %(token)s)
"""

TUNE_WORKER_SESSION = """
-- Plan each prepared statement once on this connection and never JIT-compile: the
-- worker's own connection runs nothing but the queue's short, index-bound statements.
SELECT set_config('plan_cache_mode', 'force_generic_plan', false),
       set_config('jit', 'off', false)
"""

SWEEP_LOCK = """
-- Take the sweeper's turn for this transaction, if no other replica has it.
SELECT pg_try_advisory_xact_lock(%(lock_id)s)
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

LIFT_SETTINGS_LIMITS = """
-- Lift the limits that came from settings on queues whose settings no longer set one.
UPDATE pgjobs_queue
SET max_running = NULL, limit_from_settings = false, updated_at = now()
WHERE limit_from_settings AND NOT (name = ANY(%(queues)s::text[]))
RETURNING name
"""

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

LIMIT_LOCK_WAIT = """
-- Give up on any lock this transaction waits for longer than %(timeout)s (a duration
-- such as '2s'), instead of waiting for as long as its holder lives.
SELECT set_config('lock_timeout', %(timeout)s, true)
"""

DATABASE_CLOCK = """
-- The database's clock at this instant, not at the start of the transaction (S22).
SELECT clock_timestamp()
"""

TERMINATE_BACKENDS = """
-- Drop up to %(limit)s connections of one application at once (manage.py chaosjobs).
SELECT count(*) FILTER (WHERE pg_terminate_backend(pid))
FROM (
    SELECT pid FROM pg_stat_activity
    WHERE application_name = %(application_name)s AND pid <> pg_backend_pid()
    ORDER BY random()
    LIMIT %(limit)s
) AS chosen
"""

# Every statement above, by name: the manager's whole vocabulary.
STATEMENTS = {
    name: value
    for name, value in dict(globals()).items()
    if name.isupper() and isinstance(value, str) and value.lstrip().startswith("--")
}
