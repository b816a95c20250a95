"""Statements on the live table outside claims: enqueue (S1-S5, S23), the operators'
writes (S18), the sweeper's (S24), and the overview read along the partial indexes."""

from __future__ import annotations

from django_pgjobs.db.sql.fragments import (
    CANCELS_ANSWERED,
    DEPENDENTS_OF_BURIED,
    EDGES_OF_PRUNED,
    KEPT_COLUMNS,
    KEPT_COLUMNS_OF_J,
    MERGE_INTO_LIVE_JOB,
    PROMOTE_RERUN,
    in_target,
)

INSERT_JOB = """
-- Insert one job without a key, which nothing can merge with (S1); wake workers when it
-- can run now (S23). ENQUEUE_JOB's shape for the common case, cheaper to parse and plan.
INSERT INTO pgjobs_job (
    queue, kind, state, priority, run_after, attempts, max_attempts, lease_s,
    expires_at, payload, errors, result_ttl_s, created_at, timeout_s, limit_key,
    concurrency_limit, rate_limit, rate_period_s, trace_context)
VALUES (
    %(queue)s, %(kind)s, 'pending', %(priority)s,
    coalesce(now() + make_interval(secs => %(delay_s)s::float8),
             %(run_after)s::timestamptz, now()),
    0, %(max_attempts)s, %(lease_s)s,
    now() + make_interval(secs => %(expires_s)s::float8),
    %(payload)s::jsonb, '[]'::jsonb, %(result_ttl_s)s, now(), %(timeout_s)s,
    %(limit_key)s, %(concurrency_limit)s, %(rate_limit)s, %(rate_period_s)s,
    %(trace)s::jsonb)
RETURNING id, true, created_at,
          CASE WHEN %(notify)s AND run_after <= now() THEN pg_notify(%(channel)s, queue)::text END
"""

ENQUEUE_JOB = f"""
-- Insert one job, or merge it into the live job of its (kind, key) (S3); wake workers (S23).
WITH merged AS (
    INSERT INTO pgjobs_job AS job (
        queue, kind, key, state, priority, run_after, attempts, max_attempts, lease_s,
        expires_at, payload, errors, result_ttl_s, created_at, timeout_s, limit_key,
        concurrency_limit, rate_limit, rate_period_s, trace_context)
    VALUES (
        %(queue)s, %(kind)s, %(key)s, 'pending', %(priority)s,
        coalesce(now() + make_interval(secs => %(delay_s)s::float8),
                 %(run_after)s::timestamptz, now()),
        0, %(max_attempts)s, %(lease_s)s,
        now() + make_interval(secs => %(expires_s)s::float8),
        %(payload)s::jsonb, '[]'::jsonb, %(result_ttl_s)s, now(), %(timeout_s)s,
        %(limit_key)s, %(concurrency_limit)s, %(rate_limit)s, %(rate_period_s)s,
        %(trace)s::jsonb)
    {MERGE_INTO_LIVE_JOB}
),
woke AS (
    SELECT pg_notify(%(channel)s, queue) FROM merged WHERE %(notify)s AND runnable
)
SELECT id, inserted, created_at, (SELECT count(*) FROM woke) FROM merged
"""

# The rows of enqueue_many's document %(jobs)s: a JSON array of rows, each an array in
# the order of options.ENQUEUE_ROW (the comments name them; a test holds the two to each
# other). One parameter the server parses in C, where arrays of strings would be escaped
# element by element client-side. Inserted in input order, so rows come back in it.
# Every job of a document was enqueued in one trace: %(trace)s is the statement's.
#: The columns a document row fills, and their values read from a row `i.row` (what
#: ENQUEUE_DEPENDENT_JOBS shares with _INSERT_DOCUMENT).
DOCUMENT_COLUMNS = """queue, kind, key, priority, run_after, attempts, max_attempts, lease_s,
        expires_at, payload, errors, result_ttl_s, created_at, timeout_s, limit_key,
        concurrency_limit, rate_limit, rate_period_s, trace_context"""
DOCUMENT_VALUES = """i.row ->> 0,  -- queue
           i.row ->> 1,  -- kind
           i.row ->> 14,  -- key
           (i.row ->> 2)::smallint,  -- priority
           coalesce(now() + make_interval(secs => (i.row ->> 3)::float8),  -- delay_s
                    (i.row ->> 4)::timestamptz,  -- run_after
                    now()),
           0,
           (i.row ->> 5)::int,  -- max_attempts
           (i.row ->> 6)::int,  -- lease_s
           now() + make_interval(secs => (i.row ->> 7)::float8),  -- expires_s
           i.row -> 15,  -- payload
           '[]'::jsonb,
           (i.row ->> 8)::int,  -- result_ttl_s
           now(),
           (i.row ->> 9)::float8,  -- timeout_s
           i.row ->> 13,  -- limit_key
           (i.row ->> 10)::int,  -- concurrency_limit
           (i.row ->> 11)::int,  -- rate_limit
           (i.row ->> 12)::float8,  -- rate_period_s
           %(trace)s::jsonb"""

_INSERT_DOCUMENT = f"""INSERT INTO pgjobs_job AS job (
        state, {DOCUMENT_COLUMNS})
    SELECT 'pending', {DOCUMENT_VALUES}
    FROM jsonb_array_elements(%(jobs)s::jsonb) WITH ORDINALITY AS i(row, n)
    ORDER BY i.n"""

ENQUEUE_JOBS = f"""
-- Insert many jobs in one statement (S5), merging keyed ones as ENQUEUE_JOB does.
-- The caller folds duplicate keys beforehand, because ON CONFLICT cannot change one row
-- twice in a statement.
WITH merged AS (
    {_INSERT_DOCUMENT}
    {MERGE_INTO_LIVE_JOB}
),
woke AS (
    SELECT pg_notify(%(channel)s, q.queue)
    FROM (SELECT DISTINCT queue FROM merged WHERE %(notify)s AND runnable) AS q
)
SELECT id, inserted, (SELECT count(*) FROM woke) FROM merged
"""

ENQUEUE_KEYLESS_JOBS = f"""
-- ENQUEUE_JOBS for a document whose jobs have no key: with nothing to merge, the rows
-- skip ON CONFLICT's check of the key index (a tenth of the statement's time).
WITH merged AS (
    {_INSERT_DOCUMENT}
    RETURNING job.id, true AS inserted, job.queue, job.run_after <= now() AS runnable
),
woke AS (
    SELECT pg_notify(%(channel)s, q.queue)
    FROM (SELECT DISTINCT queue FROM merged WHERE %(notify)s AND runnable) AS q
)
SELECT id, inserted, (SELECT count(*) FROM woke) FROM merged
"""

# The cancel statements. A pending job is cancelled once a claim that holds its row a
# moment lets go (it may be running by then). A running one is cancelled at once unless
# a transaction holds its row (a fence, transaction mode, a heartbeat or an ack at that
# moment): for that one a cancel request is recorded (S38), without waiting for the row;
# its worker finds it at the next heartbeat, tells the handler, and dead-letters the job
# with the request's reason when the handler stops; no ack of that claim is taken. Every
# running job's worker is also told over NOTIFY, "pgjobs.cancel:<id>:<token>", at commit.
_CANCEL_TARGETS = """seen AS (
    SELECT j.id, j.state, j.claimed_by FROM pgjobs_job AS j
    WHERE j.id = ANY(%(ids)s::bigint[]) AND j.state IN ('waiting', 'pending', 'running')
),
waited AS (
    SELECT j.id FROM pgjobs_job AS j JOIN seen AS s ON s.id = j.id
    WHERE s.state IN ('waiting', 'pending') AND j.state IN ('waiting', 'pending', 'running')
    FOR UPDATE OF j
),
unheld AS (
    SELECT j.id FROM pgjobs_job AS j JOIN seen AS s ON s.id = j.id
    WHERE s.state = 'running' AND j.state = 'running'
    FOR UPDATE OF j SKIP LOCKED
),
held AS (
    SELECT s.id, s.claimed_by FROM seen AS s
    WHERE s.state = 'running' AND s.id NOT IN (SELECT id FROM unheld)
),
requested AS (
    -- S38: durable whatever locks the row holds; a request of an older claim is replaced.
    INSERT INTO pgjobs_cancel_request AS c (job_id, claimed_by, reason, requested_at)
    SELECT h.id, h.claimed_by, %(reason)s, now() FROM held AS h
    ON CONFLICT (job_id) DO UPDATE
    SET claimed_by = excluded.claimed_by, reason = excluded.reason,
        requested_at = excluded.requested_at
    WHERE c.claimed_by <> excluded.claimed_by
    RETURNING c.job_id
),
buried AS (
    DELETE FROM pgjobs_job AS j
    WHERE j.id IN (SELECT id FROM waited UNION ALL SELECT id FROM unheld)
    RETURNING j.*
),
answered AS (
    -- A request an earlier cancel left (S38) goes with the job it bound.
    DELETE FROM pgjobs_cancel_request AS c USING buried AS b WHERE c.job_id = b.id
)"""

_TELL_CANCELLED = """told AS (
    SELECT pg_notify(%(channel)s, 'pgjobs.cancel:' || c.id || ':' || c.claimed_by)
    FROM (SELECT b.id, b.claimed_by FROM buried AS b WHERE b.state = 'running'
          UNION ALL
          SELECT h.id, h.claimed_by FROM held AS h) AS c
    WHERE %(notify)s
)"""

RUNNING_JOBS = """
-- Up to %(limit)s running jobs (of %(queues)s; NULL: every queue), the longest running
-- first, with how long each has run and the database's clock to date its progress by.
SELECT id, queue, kind, worker_id, attempts, max_attempts,
       extract(epoch FROM now() - coalesce(started_at, claimed_at))::float8 AS running_s,
       progress, now() AS now
FROM pgjobs_job
WHERE state = 'running' AND (%(queues)s::text[] IS NULL OR queue = ANY(%(queues)s::text[]))
ORDER BY coalesce(started_at, claimed_at), id
LIMIT %(limit)s
"""

RUNNING_JOBS_OF_WORKERS = """
-- Up to %(per_worker)s running jobs of each worker of %(workers)s, by id, for the
-- workers' page: one read of the running jobs for every worker it shows.
SELECT r.worker_id, r.id, r.kind
FROM (
    SELECT j.worker_id, j.id, j.kind,
           row_number() OVER (PARTITION BY j.worker_id ORDER BY j.id) AS n
    FROM pgjobs_job AS j
    WHERE j.state = 'running' AND j.worker_id = ANY(%(workers)s::text[])
) AS r
WHERE r.n <= %(per_worker)s
ORDER BY r.worker_id, r.id
"""

CANCEL_JOB = f"""
-- Delete a pending or running job (S18); a running handler is told (S32) and its later
-- writes are refused. Returns the jobs deleted, and those whose cancel was recorded as a
-- request (a transaction holds them, S38: their worker dead-letters them with %(reason)s).
WITH {_CANCEL_TARGETS},
{_TELL_CANCELLED},
{DEPENDENTS_OF_BURIED},
edges AS (
    -- A deleted child's edges go with it (S29).
    DELETE FROM pgjobs_dependency AS d
    WHERE d.child_id IN (SELECT b.id FROM buried AS b WHERE b.has_parents)
)
SELECT (SELECT count(*) FROM buried), (SELECT count(*) FROM held),
       (SELECT count(*) FROM told) + (SELECT count(*) FROM dependents)
"""

CANCEL_JOBS = f"""
-- Move pending or running jobs to the dead table with %(reason)s, as 'cancelled'
-- (requeueable), whatever the reason says; running
-- handlers are told (S32) and their later writes refused (S10). Returns the jobs moved,
-- and those whose cancel was recorded as a request (a transaction holds them, S38).
WITH {_CANCEL_TARGETS},
dead AS (
    INSERT INTO pgjobs_dead (id, {KEPT_COLUMNS}, last_error, errors, reason, category,
                             died_at)
    SELECT j.id, {KEPT_COLUMNS_OF_J}, j.last_error, j.errors, %(reason)s, 'cancelled', now()
    FROM buried AS j
    RETURNING id
),
{_TELL_CANCELLED},
{DEPENDENTS_OF_BURIED}
SELECT (SELECT count(*) FROM dead), (SELECT count(*) FROM held),
       (SELECT count(*) FROM told) + (SELECT count(*) FROM dependents)
"""

READ_JOBS = f"""
-- Read jobs by id from the live and the dead table in one round trip (S19): the results
-- of a batch of django.tasks tasks whose outcomes were just saved. A dead letter reads
-- as state 'dead', with its reason.
SELECT id, state, {KEPT_COLUMNS}, last_error, errors, finished_at, purge_at,
       NULL::text AS reason, NULL::timestamptz AS died_at
FROM pgjobs_job WHERE id = ANY(%(ids)s::bigint[])
UNION ALL
SELECT id, 'dead', {KEPT_COLUMNS}, last_error, errors, finished_at, NULL::timestamptz,
       reason, died_at
FROM pgjobs_dead WHERE id = ANY(%(ids)s::bigint[])
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
    DELETE FROM pgjobs_job AS j
    WHERE {in_target("NOT k.has_rerun")}
    RETURNING j.*
),
dead AS (
    INSERT INTO pgjobs_dead (id, {KEPT_COLUMNS}, last_error, errors, reason, category,
                             died_at)
    SELECT j.id, {KEPT_COLUMNS_OF_J}, j.last_error, j.errors, 'expired', 'expired', now()
    FROM buried AS j
    RETURNING id
),
promoted AS (
    UPDATE pgjobs_job AS j
    SET {PROMOTE_RERUN},
        last_error = 'expired',
        errors = jsonb_path_query_array(
            j.errors || jsonb_build_array(jsonb_build_object(
                'attempt', j.attempts, 'at', now(), 'error', 'expired', 'traceback', NULL,
                'exception', NULL, 'worker_id', j.worker_id)),
            '$[last - $keep to last]', jsonb_build_object('keep', %(errors_kept)s - 1))
    WHERE {in_target("k.has_rerun")}
    RETURNING j.id, j.queue, j.run_after
),
{CANCELS_ANSWERED},
woke AS (
    SELECT pg_notify(%(channel)s, p.queue)
    FROM (SELECT DISTINCT queue FROM promoted WHERE %(notify)s AND run_after <= now()) AS p
),
{DEPENDENTS_OF_BURIED}
SELECT (SELECT count(*) FROM dead), (SELECT count(*) FROM promoted),
       (SELECT count(*) FROM dependents)
"""

PRUNE_CANCEL_REQUESTS = """
-- Delete up to %(limit)s cancel requests (S38) whose job has ended: done (acked while
-- the cancel came), dead or gone. A request whose job is live binds it, whatever claim
-- it names: the job was put back in line as the cancel came (REQUESTED_IN_LINE).
DELETE FROM pgjobs_cancel_request
WHERE job_id IN (
    SELECT c.job_id FROM pgjobs_cancel_request AS c
    WHERE NOT EXISTS (SELECT 1 FROM pgjobs_job AS j
                      WHERE j.id = c.job_id AND j.state IN ('waiting', 'pending', 'running'))
    LIMIT %(limit)s
)
"""

REQUESTED_IN_LINE = """
-- Up to %(limit)s jobs back in line that a cancel request binds (S38): a retry, a lapse
-- or a hand-back put each back as its cancel came. With each request's reason; the sweep
-- cancels them, so that a cancelled job does not wait for its next claim to end.
SELECT c.job_id, c.reason
FROM pgjobs_cancel_request AS c
JOIN pgjobs_job AS j ON j.id = c.job_id AND j.state IN ('waiting', 'pending')
ORDER BY c.job_id
LIMIT %(limit)s
"""

PRUNE_DONE = f"""
-- Delete up to %(limit)s done jobs whose result retention has ended (S24), and their
-- edges (S29). Returns how many.
WITH pruned AS (
    DELETE FROM pgjobs_job
    WHERE id IN (
        SELECT id FROM pgjobs_job
        WHERE state = 'done' AND purge_at <= now()
        ORDER BY purge_at
        LIMIT %(limit)s
        FOR UPDATE SKIP LOCKED
    )
    RETURNING id, has_parents
),
{EDGES_OF_PRUNED}
SELECT count(*) FROM pruned
"""

LIVE_QUEUE_NAMES = """
-- The queues that hold pending or running jobs, each from a skip scan of its state's
-- index (schedule, running), one probe per queue, never a DISTINCT over the backlog or
-- over a large fleet's running jobs.
WITH RECURSIVE pending_queues (queue) AS (
    (SELECT j.queue FROM pgjobs_job AS j WHERE j.state = 'pending' ORDER BY j.queue LIMIT 1)
    UNION ALL
    SELECT (SELECT j.queue FROM pgjobs_job AS j
            WHERE j.state = 'pending' AND j.queue > p.queue
            ORDER BY j.queue LIMIT 1)
    FROM pending_queues AS p
    WHERE p.queue IS NOT NULL
),
running_queues (queue) AS (
    (SELECT j.queue FROM pgjobs_job AS j WHERE j.state = 'running' ORDER BY j.queue LIMIT 1)
    UNION ALL
    SELECT (SELECT j.queue FROM pgjobs_job AS j
            WHERE j.state = 'running' AND j.queue > r.queue
            ORDER BY j.queue LIMIT 1)
    FROM running_queues AS r
    WHERE r.queue IS NOT NULL
)
SELECT queue FROM pending_queues WHERE queue IS NOT NULL
UNION
SELECT queue FROM running_queues WHERE queue IS NOT NULL
"""

QUEUE_OVERVIEW = """
-- Per queue: runnable, scheduled, running and dead jobs, each counted up to %(cap)s + 1
-- rows along an index (a count at the cap is estimated by the caller); the age of the
-- oldest runnable job in seconds, by the database clock; then the pending jobs that
-- were tried before (retrying) and the done ones (retained results), capped the same.
SELECT q.name,
       (SELECT count(*) FROM (SELECT 1 FROM pgjobs_job AS j
                              WHERE j.state = 'pending' AND j.queue = q.name
                                AND j.run_after <= now()
                              LIMIT %(cap)s + 1) AS c),
       (SELECT count(*) FROM (SELECT 1 FROM pgjobs_job AS j
                              WHERE j.state = 'pending' AND j.queue = q.name
                                AND j.run_after > now()
                              LIMIT %(cap)s + 1) AS c),
       (SELECT count(*) FROM (SELECT 1 FROM pgjobs_job AS j
                              WHERE j.state = 'running' AND j.queue = q.name
                              LIMIT %(cap)s + 1) AS c),
       (SELECT count(*) FROM (SELECT 1 FROM pgjobs_dead AS d WHERE d.queue = q.name
                              LIMIT %(cap)s + 1) AS c),
       (SELECT extract(epoch FROM now() - min(j.run_after))::float8 FROM pgjobs_job AS j
        WHERE j.state = 'pending' AND j.queue = q.name AND j.run_after <= now()),
       (SELECT count(*) FROM (SELECT 1 FROM pgjobs_job AS j
                              WHERE j.state = 'pending' AND j.attempts > 0
                                AND j.queue = q.name
                              LIMIT %(cap)s + 1) AS c),
       (SELECT count(*) FROM (SELECT 1 FROM pgjobs_job AS j
                              WHERE j.state = 'done' AND j.queue = q.name
                              LIMIT %(cap)s + 1) AS c)
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

ESTIMATE_RETRYING = """
-- The planner's estimate of a queue's retrying jobs (for counts past the cap).
EXPLAIN (FORMAT JSON)
SELECT 1 FROM pgjobs_job WHERE state = 'pending' AND attempts > 0 AND queue = %(queue)s
"""

ESTIMATE_RUNNING = """
-- The planner's estimate of a queue's running jobs (for counts past the cap).
EXPLAIN (FORMAT JSON)
SELECT 1 FROM pgjobs_job WHERE state = 'running' AND queue = %(queue)s
"""

ESTIMATE_DONE = """
-- The planner's estimate of a queue's done jobs (for counts past the cap).
EXPLAIN (FORMAT JSON)
SELECT 1 FROM pgjobs_job WHERE state = 'done' AND queue = %(queue)s
"""

BUSY_JOBS = """
-- How many jobs of %(queues)s can run now or are running (a test waits until none).
SELECT count(*) FROM pgjobs_job AS j
WHERE j.queue = ANY(%(queues)s::text[])
  AND (j.state = 'running' OR (j.state = 'pending' AND j.run_after <= now()))
"""
