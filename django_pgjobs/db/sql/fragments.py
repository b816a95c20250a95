"""The pieces of SQL that several statements share because they state one rule.

Each is a plain string, spliced whole into the statements that use it; no statement is
built by a function. A rule written once cannot drift between the statements it governs.
"""

from __future__ import annotations

#: The S10 validity predicate, for a job row `j` and an input row `t` carrying the claim's
#: token. Wrapped in `IS TRUE`, the test can be neither an index condition nor proof of a
#: partial index's predicate, so the planner never trades the primary key for a walk of
#: the lease index, whose cost grows with the running jobs.
CLAIM_IS_CURRENT = (
    "(j.state = 'running' AND j.claimed_by = t.token AND j.claimed_until > now()) IS TRUE"
)

#: S38 for the lateral probe of a claim's row `j`: no cancel request binds its job. A
#: request binds the job, whatever claim it names: the claim the cancel saw, or one after
#: it, when a retry, a lapse or a hand-back put the job back in line as the cancel came
#: (that statement held the row and could not see the request). A claim with one cannot
#: ack, retry or be handed back: its worker dead-letters it with the request's reason
#: (CANCELS_REQUESTED tells which).
NOT_CANCEL_REQUESTED = "NOT EXISTS (SELECT 1 FROM pgjobs_cancel_request AS c WHERE c.job_id = j.id)"

#: S38 for a statement whose `buried` and `promoted` CTEs return the ids of the rows it
#: dead-lettered and of those whose pending trigger (S3) replaced the run: the cancel
#: requests those ends answer are deleted with them (a trigger is a run of its own).
CANCELS_ANSWERED = """answered AS (
    DELETE FROM pgjobs_cancel_request AS c
    WHERE c.job_id IN (SELECT b.id FROM buried AS b UNION ALL SELECT p.id FROM promoted AS p)
)"""

#: S38 for a statement whose `moved` CTE returns the dead letters it brought back to
#: life: a cancel request left for a letter's last run does not bind its new life.
CANCELS_OF_MOVED = """unbound AS (
    DELETE FROM pgjobs_cancel_request WHERE job_id IN (SELECT id FROM moved)
)"""

#: The cancel requests (S38) binding the jobs of the claims %(ids)s, as a JSON object of
#: reasons by job id ({} when none: one probe of an empty table, as a rule).
CANCELS_REQUESTED = """(SELECT coalesce(jsonb_object_agg(c.job_id, c.reason), '{}')
        FROM pgjobs_cancel_request AS c WHERE c.job_id = ANY(%(ids)s::bigint[]))"""

#: The columns a job keeps when it moves between the live and the dead table, and the
#: same of a job row `j`.
KEPT_COLUMNS = (
    "queue, kind, key, priority, run_after, attempts, max_attempts, lease_s, claimed_by,"
    " claimed_until, claimed_at, started_at, worker_id, expires_at, payload, result,"
    " rerun_after, rerun_payload, rerun_expires_at, result_ttl_s, created_at, timeout_s,"
    " progress, limit_key, concurrency_limit, rate_limit, rate_period_s, has_parents,"
    " has_children"
)
KEPT_COLUMNS_OF_J = (
    "j.queue, j.kind, j.key, j.priority, j.run_after, j.attempts, j.max_attempts, j.lease_s,"
    " j.claimed_by, j.claimed_until, j.claimed_at, j.started_at, j.worker_id, j.expires_at,"
    " j.payload, j.result, j.rerun_after, j.rerun_payload, j.rerun_expires_at,"
    " j.result_ttl_s, j.created_at, j.timeout_s, j.progress, j.limit_key, j.concurrency_limit,"
    " j.rate_limit, j.rate_period_s, j.has_parents, j.has_children"
)

#: S3: a pending trigger replaces the run that just ended, whatever way it ended: same
#: row, the trigger's payload, schedule and expiry, a fresh attempt budget.
PROMOTE_RERUN = """state = 'pending', payload = j.rerun_payload,
        run_after = coalesce(j.rerun_after, now()), expires_at = j.rerun_expires_at,
        attempts = 0, claimed_by = NULL, claimed_until = NULL,
        rerun_payload = NULL, rerun_after = NULL, rerun_expires_at = NULL"""

#: The live key index, as ON CONFLICT must name it (its predicate, verbatim).
ON_LIVE_KEY = "ON CONFLICT (kind, key) WHERE key IS NOT NULL AND state IN ('pending', 'running')"

#: S3 for INSERTs into pgjobs_job AS job: a live job of the same (kind, key) takes the new
#: trigger instead of a second row. Pending: payload (and schedule, for "replace")
#: replaced. Running: the trigger is stored and promoted when the run ends. "ignore": no
#: change, but the row still comes back so the caller learns the live job's id.
#: `xmax = 0` tells an inserted row from an updated one.
MERGE_INTO_LIVE_JOB = f"""{ON_LIVE_KEY}
    DO UPDATE SET
        payload = CASE WHEN job.state = 'pending' AND %(on_conflict)s <> 'ignore'
                       THEN excluded.payload ELSE job.payload END,
        run_after = CASE WHEN job.state = 'pending' AND %(on_conflict)s = 'replace'
                         THEN excluded.run_after ELSE job.run_after END,
        expires_at = CASE WHEN job.state = 'pending' AND %(on_conflict)s <> 'ignore'
                          THEN excluded.expires_at ELSE job.expires_at END,
        -- A traced trigger whose payload replaces a pending job's brings its trace (an
        -- untraced one keeps the job's); a rerun of a running job keeps the job's.
        trace_context = CASE WHEN job.state = 'pending' AND %(on_conflict)s <> 'ignore'
                             THEN coalesce(excluded.trace_context, job.trace_context)
                             ELSE job.trace_context END,
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
              job.state = 'pending' AND job.run_after <= now() AS runnable"""

#: Sets the statement's transaction to commit without waiting for the WAL flush when
#: %(synchronous_commit)s is 'off' (NULL: no change). synchronous_commit is read at
#: commit, so a transaction-local setting made while the statement runs applies to its
#: own commit. Placed where it runs whenever the statement changed a row: an
#: uncorrelated scalar subquery, evaluated once.
COMMIT_MODE = (
    "(SELECT set_config('synchronous_commit',"
    " coalesce(%(synchronous_commit)s, current_setting('synchronous_commit')), true))"
)

#: What each limited queue of %(limited)s admits now, for a statement with a `clock` CTE
#: (the moment its claims are stamped with, S37): up to %(limit)s, its max_running less
#: all its running jobs whose lease holds, keyed or not, and its rate less all its claims
#: within the rate's period (S35, S37). A limit that is not set is no bound.
QUEUE_ALLOWANCE = """queue_allowance AS (
    SELECT c.name, c.rate_limit IS NOT NULL AS rated, c.rate_period_s, greatest(least(
        c.max_running - (
            SELECT count(*) FROM pgjobs_job AS j, clock
            WHERE j.state = 'running' AND j.queue = c.name AND j.claimed_until > clock.at),
        c.rate_limit - (
            SELECT count(*) FROM pgjobs_rate_claim AS r, clock
            WHERE r.scope = 'queue:' || c.name
              AND r.at > clock.at - make_interval(secs => c.rate_period_s)),
        %(limit)s
    ), 0) AS free
    FROM pgjobs_queue AS c
    WHERE c.name = ANY(%(limited)s::text[]) AND NOT c.paused
      AND (c.max_running IS NOT NULL OR c.rate_limit IS NOT NULL)
)"""

#: A job a claim may take: runnable now and not expired.
CLAIMABLE = (
    "j.state = 'pending' AND j.run_after <= now()"
    " AND (j.expires_at IS NULL OR j.expires_at > now())"
)

#: A job of the kinds a claim takes: of %(only_kinds)s (NULL: any) and not of
#: %(not_kinds)s (NULL: none). A worker with an event loop claims its async kinds into the
#: loop's free places and the others into its free threads, each into capacity of its own.
OF_KINDS = (
    "(%(only_kinds)s::text[] IS NULL OR j.kind = ANY(%(only_kinds)s::text[]))"
    " AND (%(not_kinds)s::text[] IS NULL OR j.kind <> ALL(%(not_kinds)s::text[]))"
)

#: An unkeyed job: what the claim index holds (keyed jobs have a claim of their own, S34).
UNKEYED = "j.limit_key IS NULL"

#: Seconds from the statement's start until a job of %(queues)s next becomes claimable:
#: the earliest scheduled pending job, the earliest running job whose lease will lapse,
#: or the next slot of a rated queue whose runnable jobs wait for its rate (S37: its
#: workers wake when the slot opens, not at the next poll) (NULL: none of these). With a
#: %(lease_floor)s (CLAIM_FLOORS: the horizon is held), leases are left out: the entries
#: of every job acked within a lease's length lie before the first live one, and none
#: can be marked dead; a lapse is then found by the next claim's probe, from the floor.
NEXT_DUE_SECONDS = """extract(epoch FROM least(
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
       AND %(lease_floor)s::timestamptz IS NULL
       AND j.queue = ANY(%(queues)s::text[])
     ORDER BY j.claimed_until
     LIMIT 1),
    (SELECT min(coalesce(
         -- The claim whose leaving the window makes room for one more; with room in the
         -- window already (a claim came up short for another reason, or one left the
         -- window since), the oldest: the next change of the window, never "now", so a
         -- worker whose jobs wait for something else than the rate never spins.
         (SELECT r.at + make_interval(secs => c.rate_period_s)
          FROM pgjobs_rate_claim AS r
          WHERE r.scope = 'queue:' || c.name
            AND r.at > statement_timestamp() - make_interval(secs => c.rate_period_s)
          ORDER BY r.at DESC
          OFFSET greatest(least(c.rate_limit, (
              SELECT count(*) FROM pgjobs_rate_claim AS w
              WHERE w.scope = 'queue:' || c.name
                AND w.at > statement_timestamp() - make_interval(secs => c.rate_period_s)
          )) - 1, 0)
          LIMIT 1),
         -- An empty window (its last claim left it while the worker was between its
         -- claim and this question), and an unkeyed job waits, which nothing but the
         -- rate holds back (a keyed one may wait for its key's limit): a slot is open.
         -- One slot's spacing from now, at least 50 ms, not "now", for the same reason;
         -- not never, or the worker would sleep to its poll.
         CASE WHEN (SELECT j.run_after FROM pgjobs_job AS j
                    WHERE j.state = 'pending' AND j.queue = c.name AND j.limit_key IS NULL
                    ORDER BY j.run_after LIMIT 1) <= now()
              THEN statement_timestamp()
                   + make_interval(secs => greatest(c.rate_period_s / c.rate_limit, 0.05))
         END))
     FROM pgjobs_queue AS c
     WHERE c.name = ANY(%(queues)s::text[]) AND c.rate_limit IS NOT NULL AND NOT c.paused
       -- Not held back by its running limit, which a completion lifts instead.
       AND (c.max_running IS NULL
            OR c.max_running > (SELECT count(*) FROM pgjobs_job AS j
                                WHERE j.state = 'running' AND j.queue = c.name
                                  AND j.claimed_until > now()))
       -- Its earliest pending job (one probe of the schedule index) is runnable.
       AND (SELECT j.run_after FROM pgjobs_job AS j
            WHERE j.state = 'pending' AND j.queue = c.name
            ORDER BY j.run_after LIMIT 1) <= now())
) - statement_timestamp())::float8"""

#: The end of every claim statement: claim the rows of its `picked` (S8), and return,
#: after its lapsed_waiting and keyed_waiting flags, what the caller reads into a
#: JobHandle, then `due_in`: when %(due)s and the claim took fewer than %(limit)s,
#: NEXT_DUE_SECONDS ('Infinity': nothing is due), so that a worker whose queues ran dry
#: need not ask (NULL when the claim was full, or not asked: a claim whose answer would
#: cover part of the worker's queues only). An empty claim still returns one row, for
#: the flags.
CLAIM_PICKED = f"""claimed AS (
    -- Claim the rows of `picked` (S8), stamped with this statement's start: a claim
    -- that waited for its queue's or key's turn (a transaction of two statements) is
    -- stamped when it had it, the moment its rate counts (S37), not when it began to
    -- wait. A claim of one statement starts with its transaction: the same moment.
    UPDATE pgjobs_job AS j
    SET state = 'running',
        attempts = j.attempts + 1,
        claimed_by = gen_random_uuid(),
        claimed_at = statement_timestamp(),
        started_at = coalesce(j.started_at, statement_timestamp()),
        claimed_until = statement_timestamp() + make_interval(secs => j.lease_s),
        worker_id = %(worker_id)s
    -- By primary key, one probe a row: a join with `picked` is planned from statistics,
    -- and with those of a table that was small (a generic plan, made when a worker
    -- started) it became a hash of the whole primary key, every row of it visited (the
    -- dead ones too, 52,000 buffers a claim two minutes into a held horizon).
    WHERE j.id = ANY(ARRAY(SELECT p.id FROM picked AS p))
    RETURNING j.id, j.queue, j.kind, j.key, j.priority, j.run_after, j.attempts,
              j.max_attempts, j.lease_s, j.claimed_by, j.claimed_at, j.claimed_until,
              j.worker_id, j.expires_at, j.created_at, j.payload, j.timeout_s,
              j.limit_key IS NOT NULL, j.trace_context
),
flags AS (
    SELECT EXISTS (
        SELECT 1 FROM pgjobs_job AS j
        WHERE j.state = 'running' AND j.claimed_until <= now()
          AND j.claimed_until >= coalesce(%(lease_floor)s::timestamptz, '-infinity')
          AND j.queue = ANY(%(queues)s::text[])
    ) AS lapsed_waiting,
    -- Whether keyed jobs wait in these queues (S34): one probe of the keyed index each.
    EXISTS (
        SELECT 1 FROM unnest(%(queues)s::text[]) AS q(name)
        WHERE EXISTS (SELECT 1 FROM pgjobs_job AS j
                      WHERE j.state = 'pending' AND j.limit_key IS NOT NULL
                        AND j.queue = q.name)
    ) AS keyed_waiting,
    {COMMIT_MODE} AS commit_mode,
    -- Which of these queues have a limit or a rate (LIMITED_QUEUES): claimed only by
    -- CLAIM_LIMITED_JOBS, skipped by CLAIM_JOBS. The claimer keeps its list of them
    -- from these answers, without a statement of its own before a wake-up's claim.
    ARRAY(SELECT c.name FROM pgjobs_queue AS c
          WHERE c.name = ANY(%(queues)s::text[])
            AND (c.max_running IS NOT NULL OR c.rate_limit IS NOT NULL)) AS limited,
    -- S38: cancel requests that bind jobs just claimed (NULL: none, as a rule). A retry,
    -- a lapse or a hand-back put such a job back in line as its cancel came; the claimer
    -- dead-letters it with the request's reason instead of running it.
    (SELECT jsonb_object_agg(r.job_id, r.reason) FROM pgjobs_cancel_request AS r
     WHERE r.job_id = ANY(ARRAY(SELECT k.id FROM claimed AS k))) AS cancels,
    CASE WHEN %(due)s AND (SELECT count(*) FROM claimed) < %(limit)s
         THEN coalesce({NEXT_DUE_SECONDS}, 'Infinity'::float8) END AS due_in
)
SELECT f.lapsed_waiting, f.keyed_waiting, c.*, f.limited, f.cancels, f.due_in
FROM flags AS f
LEFT JOIN claimed AS c ON true"""

#: S30 for a statement whose `buried` CTE returns the rows (`j.*`) it dead-lettered or
#: deleted: their dependents die with them, or run, as each dependency says. Only rows
#: that have children call the function (see workflows), so a job without any costs
#: nothing here. The statement must read `dependents` for it to run.
DEPENDENTS_OF_BURIED = """dependents AS (
    SELECT pgjobs_end_parents('{}'::bigint[], '{}'::jsonb[], array_agg(b.id),
                              %(channel)s, %(notify)s) AS moved
    FROM buried AS b
    WHERE b.has_children
    HAVING count(*) > 0
)"""


def in_target(condition: str) -> str:
    """The rows of a statement's `target` CTE that meet `condition` (on `target AS k`), as
    the whole WHERE of a DELETE or UPDATE of `pgjobs_job AS j` that needs nothing else of
    them: one primary-key probe per row, whatever the plan was made from. A join with the
    CTE is planned from the table's statistics, and with a generic plan made while the
    table was small it walked the whole primary key for every statement, dead entries
    included (ACK_JOBS: 78,000 buffers and 120-180 ms an ack two minutes into a held xmin
    horizon). Kept beside a join instead, as a second condition, it was probed once per
    row of the join on an analyzed table (a third of the drain's rate). CLAIM_PICKED
    probes the same way."""
    return f"j.id = ANY(ARRAY(SELECT k.id FROM target AS k WHERE {condition}))"


#: S29 for ACK_JOBS, whose `target` holds the acked rows with their results: the
#: parents' ends free their children (in this statement), and an acked child's own
#: edges, whose parents' results it no longer needs, are deleted with its row (a
#: retained one keeps them until it is pruned, for get_job). A rerun promoted (S3) is
#: no end. Only rows with parents or children call the function, so an ack of jobs
#: without any touches no table of dependencies.
DEPENDENTS_OF_ACKED = """dependents AS (
    SELECT pgjobs_end_parents(
               coalesce(array_agg(t.id) FILTER (WHERE t.has_children), '{}'),
               coalesce(array_agg(t.result) FILTER (WHERE t.has_children), '{}'),
               '{}'::bigint[], %(channel)s, %(notify)s,
               coalesce(array_agg(t.id) FILTER (WHERE t.has_parents
                                                  AND t.result_ttl_s IS NULL), '{}')
           ) AS moved
    FROM target AS t
    WHERE (t.has_children OR t.has_parents) AND NOT t.has_rerun
    HAVING count(*) > 0
)"""

#: A pruned child's edges go with it; `pruned` returns the rows' id and has_parents.
EDGES_OF_PRUNED = """edges AS (
    DELETE FROM pgjobs_dependency AS d
    WHERE d.child_id IN (SELECT p.id FROM pruned AS p WHERE p.has_parents)
)"""
