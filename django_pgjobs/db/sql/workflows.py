"""Statements on dependencies (S29, S30): jobs written `after=` others, and what a
parent's end does to them.

The rule that makes a dependency sound under concurrency: whoever writes a child locks
its unfinished parents first (LOCK_FREE_PARENTS, which also marks them `has_children`
and never waits for one while it holds another: S41), and whoever ends a parent holds
that parent's row lock when it reads the parent's edges.
Inside one statement, though, READ COMMITTED reads with the snapshot the statement
started with, which may predate the child's commit the lock waited for. So the end of a
parent is recorded by a VOLATILE function, `pgjobs_end_parents`, whose every statement
reads with a fresh snapshot: called by the statement that ends the parent, after that
statement locked the parent's row, it sees every child whose writer held that lock
before. The function is installed by migration 0006 (its text frozen in workflows_0006)
and replaced by 0007, which adds the end of batches (S31, db/sql/batches.py) and finds
children by primary key whatever the planner's statistics say: END_PARENTS_FUNCTION is
the current text. A change to it comes with a migration that installs it again, and the
text that migration replaces is frozen beside workflows_0006 for its reverse.
"""

from __future__ import annotations

from django_pgjobs.db.sql.fragments import CANCELS_OF_MOVED, KEPT_COLUMNS, KEPT_COLUMNS_OF_J
from django_pgjobs.db.sql.jobs import DOCUMENT_COLUMNS, DOCUMENT_VALUES

END_PARENTS_FUNCTION = f"""
-- Install pgjobs_end_parents(done_ids, done_results, failed_ids, channel, notify,
-- acked_children) (S29-S31): record that parents ended, and delete the edges of acked
-- children (they no longer need their parents' results). A done parent's edges keep its
-- result, and a child whose last parent it was becomes pending (woken). A dead or
-- cancelled parent's children die with it as 'dependency failed: <id>' of the first job
-- that died (transitively), unless their edge says on_failure = 'run', which counts as
-- done. A released child that is a batch's callback ends its batch (S31, below).
-- Returns the children moved (pending or dead, less the callbacks deleted unfired).
-- Each statement locks what it changes, and the next reads with a fresh snapshot (see
-- the module's docstring).
--
-- Plans: every statement here finds its rows by key (ids, a parent's edges, a batch's
-- callbacks), so the function plans without sequential scans and with sorts, whatever
-- the session says (a worker's connection turns sorts off for its claims) and whatever
-- the statistics say: with an estimate of few waiting jobs, a scan of the job table
-- looks cheaper than probes, and without sorts, locking children in id order walks the
-- primary key from end to end; either costs every ack of a fan-out's children a read of
-- the whole table. Children are locked one primary-key probe each, in id order.
CREATE OR REPLACE FUNCTION pgjobs_end_parents(
    done_ids bigint[], done_results jsonb[], failed_ids bigint[], wake_channel text,
    wake boolean, acked_children bigint[] DEFAULT '{{}}'
) RETURNS integer
LANGUAGE plpgsql VOLATILE
SET enable_sort = on
SET enable_incremental_sort = on
SET enable_seqscan = off
AS $body$
#variable_conflict use_column
DECLARE
    freed bigint[];
    doomed bigint[];
    doomed_by bigint[];
    frontier bigint[] := coalesce(failed_ids, '{{}}');
    roots bigint[] := coalesce(failed_ids, '{{}}');
    moved integer := 0;
    released integer;
    fired_ids bigint[];
    dropped_ids bigint[];
BEGIN
    IF cardinality(acked_children) > 0 THEN
        DELETE FROM pgjobs_dependency AS d WHERE d.child_id = ANY(acked_children);
    END IF;
    WITH ended AS (
        UPDATE pgjobs_dependency AS d
        SET ended = 'done', parent_result = r.result
        FROM unnest(coalesce(done_ids, '{{}}'), coalesce(done_results, '{{}}'))
             AS r(id, result)
        WHERE d.parent_id = r.id AND d.ended IS NULL
        RETURNING d.child_id
    )
    SELECT coalesce(array_agg(e.child_id), '{{}}') INTO freed FROM ended AS e;
    LOOP
        IF cardinality(freed) > 0 THEN
            -- One fewer parent to wait for per edge ended; pending at none. The row
            -- lock orders the parents of one child ending at once; each sees the last.
            -- Children are locked in id order, so that parents of the same children
            -- ending at once never deadlock.
            WITH counted AS (
                SELECT c.id, count(*)::int AS n FROM unnest(freed) AS c(id) GROUP BY c.id
            ),
            locked AS (
                SELECT l.id, c.n
                FROM (SELECT * FROM counted ORDER BY id) AS c
                CROSS JOIN LATERAL (
                    SELECT j.id FROM pgjobs_job AS j
                    WHERE j.id = c.id AND j.state = 'waiting'
                    FOR NO KEY UPDATE
                ) AS l
            ),
            released_jobs AS (
                -- By id, not by the locked row's ctid: a row a concurrent end updated
                -- while this lock waited is a version this statement's snapshot does
                -- not see, and only an update of the version it sees follows the chain.
                UPDATE pgjobs_job AS j
                SET parents_left = j.parents_left - l.n,
                    state = CASE WHEN j.parents_left - l.n > 0 THEN 'waiting'
                                 ELSE 'pending' END
                FROM locked AS l
                WHERE j.id = l.id AND j.state = 'waiting'
                RETURNING j.id, j.queue, j.state, j.run_after
            ),
            woke AS (
                SELECT pg_notify(wake_channel, q.queue)
                FROM (SELECT DISTINCT r.queue FROM released_jobs AS r
                      WHERE r.state = 'pending' AND r.run_after <= now()) AS q
                WHERE wake
            )
            SELECT (SELECT count(*) FROM released_jobs WHERE state = 'pending')
                   + 0 * (SELECT count(*) FROM woke),
                   -- The batches' callbacks among them (S31), one key probe each.
                   (SELECT coalesce(array_agg(r.id), '{{}}') FROM released_jobs AS r
                    WHERE r.state = 'pending'
                      AND EXISTS (SELECT 1 FROM pgjobs_batch_callback AS c
                                  WHERE c.job_id = r.id))
            INTO released, fired_ids;
            moved := moved + released;
            IF cardinality(fired_ids) > 0 THEN
                -- S31: the batches whose callbacks were just released have ended. Every
                -- callback of a batch waits for the same parents (its members, and its
                -- seal: a parent whose id is minus the batch's), so they are released
                -- together, once, by the statement that records the last end. The
                -- tally is read from the edges of one callback; the callbacks that do
                -- not match (on_success when a member failed, on_failure when none
                -- did) are deleted with their edges before anyone can see them.
                WITH fired AS (
                    SELECT c.job_id, c.batch_id, c.fires_on
                    FROM pgjobs_batch_callback AS c
                    WHERE c.job_id = ANY(fired_ids)
                ),
                tally AS (
                    SELECT f.batch_id,
                           count(d.id) FILTER (WHERE d.ended = 'done') AS done,
                           count(d.id) FILTER (WHERE d.ended = 'failed') AS failed
                    FROM (SELECT DISTINCT ON (batch_id) batch_id, job_id
                          FROM fired ORDER BY batch_id, job_id) AS f
                    LEFT JOIN pgjobs_dependency AS d
                           ON d.child_id = f.job_id AND d.parent_id > 0
                    GROUP BY f.batch_id
                ),
                ended AS (
                    UPDATE pgjobs_batch AS b
                    SET state = CASE WHEN t.failed > 0 THEN 'failed' ELSE 'succeeded' END,
                        done = t.done, failed = t.failed, ended_at = now()
                    FROM tally AS t
                    WHERE b.id = t.batch_id
                    RETURNING b.id, b.state
                ),
                dropped AS (
                    DELETE FROM pgjobs_job AS j
                    USING fired AS f, ended AS e
                    WHERE j.id = f.job_id AND e.id = f.batch_id
                      AND ((f.fires_on = 'success' AND e.state = 'failed')
                           OR (f.fires_on = 'failure' AND e.state = 'succeeded'))
                    RETURNING j.id
                ),
                unhooked AS (
                    DELETE FROM pgjobs_dependency AS d
                    WHERE d.child_id IN (SELECT id FROM dropped)
                )
                SELECT coalesce(array_agg(id), '{{}}') INTO dropped_ids FROM dropped;
                moved := moved - cardinality(dropped_ids);
                -- A job written after a callback that does not fire ends as after a
                -- parent that died: its own dependents' turn comes with the frontier.
                frontier := frontier || dropped_ids;
                roots := roots || dropped_ids;
            END IF;
        END IF;
        EXIT WHEN cardinality(frontier) = 0;
        -- The edges out of the jobs that just died.
        WITH ended AS (
            UPDATE pgjobs_dependency AS d
            SET ended = 'failed'
            FROM unnest(frontier, roots) AS f(id, root)
            WHERE d.parent_id = f.id AND d.ended IS NULL
            RETURNING d.child_id, d.on_failure, f.root
        )
        SELECT coalesce(array_agg(e.child_id) FILTER (WHERE e.on_failure = 'cancel'), '{{}}'),
               coalesce(array_agg(e.root) FILTER (WHERE e.on_failure = 'cancel'), '{{}}'),
               coalesce(array_agg(e.child_id) FILTER (WHERE e.on_failure = 'run'), '{{}}')
        INTO doomed, doomed_by, freed
        FROM ended AS e;
        -- Their dependents die with them; the next round takes theirs.
        WITH fate AS (
            SELECT d.id, min(d.root) AS root
            FROM unnest(doomed, doomed_by) AS d(id, root)
            GROUP BY d.id
        ),
        locked AS (
            SELECT l.id, f.root
            FROM (SELECT * FROM fate ORDER BY id) AS f
            CROSS JOIN LATERAL (
                SELECT j.id FROM pgjobs_job AS j
                WHERE j.id = f.id AND j.state = 'waiting'
                FOR UPDATE
            ) AS l
        ),
        buried AS (
            DELETE FROM pgjobs_job AS j USING locked AS l
            WHERE j.id = l.id AND j.state = 'waiting'
            RETURNING j.*, l.root AS doomed_by
        ),
        dead AS (
            INSERT INTO pgjobs_dead (id, {KEPT_COLUMNS}, last_error, errors, reason, died_at)
            SELECT j.id, {KEPT_COLUMNS_OF_J}, j.last_error, j.errors,
                   'dependency failed: ' || j.doomed_by, now()
            FROM buried AS j
            RETURNING id
        )
        SELECT coalesce(array_agg(b.id), '{{}}'), coalesce(array_agg(b.doomed_by), '{{}}')
        INTO frontier, roots
        FROM buried AS b;
        moved := moved + cardinality(frontier);
    END LOOP;
    RETURN moved;
END
$body$
"""

DROP_END_PARENTS_FUNCTION = """
-- Remove pgjobs_end_parents (migration 0006 reversed).
DROP FUNCTION IF EXISTS pgjobs_end_parents(bigint[], jsonb[], bigint[], text, boolean, bigint[])
"""

LOCK_FREE_PARENTS = """
-- Lock the unfinished jobs among %(parents)s that no other transaction holds, for the
-- rest of the transaction, and mark them as having children (S29): their end, which
-- must wait for this lock, then finds the children this transaction writes. Never waits
-- (S41). Returns each unfinished parent with whether it was locked; the caller lets go
-- of them all when one was not (WAIT_FOR_PARENT), and tries again.
WITH unfinished AS (
    SELECT p.id FROM pgjobs_job AS p
    WHERE p.id = ANY(%(parents)s::bigint[]) AND p.state IN ('waiting', 'pending', 'running')
),
locked AS (
    SELECT p.id FROM pgjobs_job AS p
    WHERE p.id = ANY(%(parents)s::bigint[]) AND p.state IN ('waiting', 'pending', 'running')
    ORDER BY p.id
    FOR NO KEY UPDATE OF p SKIP LOCKED
),
marked AS (
    UPDATE pgjobs_job AS j
    SET has_children = true
    FROM locked AS l
    WHERE j.id = l.id
    RETURNING j.id
)
SELECT m.id, true FROM marked AS m
UNION ALL
SELECT u.id, false FROM unfinished AS u WHERE u.id NOT IN (SELECT id FROM marked)
"""

WAIT_FOR_PARENT = """
-- Wait until no other transaction holds job %(id)s as LOCK_FREE_PARENTS would lock it
-- (S41): run in a savepoint rolled back at once, holding nothing else of the enqueue's,
-- so that the wait closes no cycle of locks.
SELECT p.id FROM pgjobs_job AS p WHERE p.id = %(id)s FOR NO KEY UPDATE
"""

LOCK_PARENTS = """
-- Lock the unfinished jobs among %(parents)s for the rest of the transaction, waiting
-- for each in id order, and mark them as having children (S29): LOCK_FREE_PARENTS' last
-- resort, when other transactions held its parents round after round. Returns the ids
-- locked.
UPDATE pgjobs_job AS j
SET has_children = true
FROM (
    SELECT p.id FROM pgjobs_job AS p
    WHERE p.id = ANY(%(parents)s::bigint[]) AND p.state IN ('waiting', 'pending', 'running')
    ORDER BY p.id
    FOR NO KEY UPDATE OF p
) AS l
WHERE j.id = l.id
RETURNING j.id
"""

PARENT_STANDING = """
-- Where each of %(parents)s stands (S29, S40), read after LOCK_FREE_PARENTS in the same
-- transaction: 'live' (not ended), 'done', 'dead' (with its reason), 'gone' (its id was
-- handed out by the job table's sequence, and it is in neither table: acked without
-- result retention, cancelled, deleted, pruned, or rolled back: whether it was done
-- cannot be told), or 'unknown' (no job ever had that id).
SELECT p.id,
       CASE WHEN j.state = 'done' THEN 'done'
            WHEN j.id IS NOT NULL THEN 'live'
            WHEN d.id IS NOT NULL THEN 'dead'
            WHEN p.id >= 1 AND p.id <= coalesce(pg_sequence_last_value(
                pg_get_serial_sequence('pgjobs_job', 'id')::regclass), 0) THEN 'gone'
            ELSE 'unknown' END,
       d.reason
FROM unnest(%(parents)s::bigint[]) AS p(id)
LEFT JOIN pgjobs_job AS j ON j.id = p.id
LEFT JOIN pgjobs_dead AS d ON d.id = p.id
"""

ENQUEUE_DEPENDENT_JOBS = f"""
-- Insert jobs with dependencies in one statement (S29), in input order: each row of
-- %(jobs)s as ENQUEUE_JOBS reads it; each edge of %(edges)s a JSON array [child row
-- (1-based), parent id or null, parent row or null, on_failure, standing], a parent row
-- being an earlier job of this document, and standing what PARENT_STANDING found
-- ('open': not ended, the child waits for it; 'done': done and retained; 'failed': dead,
-- on_failure 'run'). A job with an open edge is written waiting, the others pending
-- (woken).
WITH given AS (
    SELECT i.row, i.n, nextval(pg_get_serial_sequence('pgjobs_job', 'id')) AS id
    FROM jsonb_array_elements(%(jobs)s::jsonb) WITH ORDINALITY AS i(row, n)
),
edges AS (
    SELECT c.id AS child_id, coalesce((e.edge ->> 1)::bigint, p.id) AS parent_id,
           e.edge ->> 3 AS on_failure, e.edge ->> 4 AS standing
    FROM jsonb_array_elements(%(edges)s::jsonb) AS e(edge)
    JOIN given AS c ON c.n = (e.edge ->> 0)::bigint
    LEFT JOIN given AS p ON p.n = (e.edge ->> 2)::bigint
),
inserted AS (
    INSERT INTO pgjobs_job AS job (
        id, state, parents_left, has_parents, has_children, {DOCUMENT_COLUMNS})
    SELECT i.id, CASE WHEN w.open > 0 THEN 'waiting' ELSE 'pending' END, w.open,
           w.edges > 0, EXISTS (SELECT 1 FROM edges AS e WHERE e.parent_id = i.id),
           {DOCUMENT_VALUES}
    FROM given AS i
    CROSS JOIN LATERAL (
        SELECT count(*) FILTER (WHERE e.standing = 'open') AS open, count(*) AS edges
        FROM edges AS e WHERE e.child_id = i.id
    ) AS w
    ORDER BY i.n
    RETURNING job.id, job.queue, job.state = 'pending' AND job.run_after <= now() AS runnable
),
recorded AS (
    INSERT INTO pgjobs_dependency (child_id, parent_id, on_failure, ended, parent_result)
    SELECT e.child_id, e.parent_id, e.on_failure, nullif(e.standing, 'open'),
           (SELECT j.result FROM pgjobs_job AS j
            WHERE j.id = e.parent_id AND j.state = 'done' AND e.standing = 'done')
    FROM edges AS e
),
woke AS (
    SELECT pg_notify(%(channel)s, q.queue)
    FROM (SELECT DISTINCT queue FROM inserted WHERE %(notify)s AND runnable) AS q
)
SELECT g.id, (SELECT count(*) FROM woke) FROM given AS g ORDER BY g.n
"""

#: The dependents the death of job %(id)s may have taken (S30): every dead letter that
#: died of a dependency and is reachable by edges from %(id)s, through such letters.
#: Some of them may have died of another parent, still dead: REVIVE_DEPENDENTS tells.
LOST_DEPENDENTS = """lost (id) AS (
    SELECT x.id
    FROM pgjobs_dependency AS d
    JOIN pgjobs_dead AS x ON x.id = d.child_id
    WHERE d.parent_id = %(id)s AND starts_with(x.reason, 'dependency failed: ')
    UNION
    SELECT x.id
    FROM lost AS l
    JOIN pgjobs_dependency AS d ON d.parent_id = l.id
    JOIN pgjobs_dead AS x ON x.id = d.child_id
    WHERE starts_with(x.reason, 'dependency failed: ')
)"""

LOCK_LOST_EDGES = f"""
-- Lock every edge into the dependents the death of the requeued job %(id)s may have
-- taken (S30), in id order, for the rest of the transaction: a parent ending meanwhile
-- then waits for REVIVE_DEPENDENTS, whose fresh snapshot sees every end recorded
-- before, and finds the dependents it revives live. Returns the edges' ids.
WITH RECURSIVE {LOST_DEPENDENTS}
SELECT d.id FROM pgjobs_dependency AS d
WHERE d.child_id IN (SELECT id FROM lost)
ORDER BY d.id
FOR UPDATE
"""

REVIVE_DEPENDENTS = f"""
-- Bring back the dependents the death of the requeued job %(id)s took with it (S30,
-- S40), their edges locked (LOCK_LOST_EDGES): waiting again for the parents whose end
-- is not recorded. A dependent that has another parent still dead, whose failure
-- cancels it (or a dead parent that stays dead so), stays dead, and so do its
-- dependents: the requeue of that parent brings them back. The edges from %(id)s and
-- from every job back to life are open again, into the dependents that stay dead too,
-- so that those wait for them when they come back.
WITH RECURSIVE {LOST_DEPENDENTS},
held (id) AS (
    SELECT l.id
    FROM lost AS l
    JOIN pgjobs_dependency AS d ON d.child_id = l.id
    WHERE d.ended = 'failed' AND d.on_failure = 'cancel' AND d.parent_id <> %(id)s
      AND d.parent_id NOT IN (SELECT id FROM lost)
    UNION
    SELECT l.id
    FROM held AS h
    JOIN pgjobs_dependency AS d ON d.parent_id = h.id
    JOIN lost AS l ON l.id = d.child_id
    WHERE d.ended = 'failed' AND d.on_failure = 'cancel'
),
back (id) AS (
    SELECT %(id)s::bigint
    UNION ALL
    SELECT l.id FROM lost AS l WHERE l.id NOT IN (SELECT id FROM held)
),
reopened AS (
    UPDATE pgjobs_dependency AS d
    SET ended = CASE WHEN d.parent_id IN (SELECT id FROM back) THEN NULL ELSE d.ended END,
        parent_result = CASE WHEN d.parent_id IN (SELECT id FROM back)
                             THEN NULL ELSE d.parent_result END
    WHERE d.child_id IN (SELECT id FROM lost)
    RETURNING d.child_id, d.ended
),
moved AS (
    DELETE FROM pgjobs_dead AS x
    WHERE x.id IN (SELECT id FROM back) AND x.id <> %(id)s
    RETURNING x.*
),
revived AS (
    INSERT INTO pgjobs_job (id, state, parents_left, {KEPT_COLUMNS}, last_error, errors)
    SELECT j.id, 'waiting',
           (SELECT count(*) FROM reopened AS r WHERE r.child_id = j.id AND r.ended IS NULL),
           {KEPT_COLUMNS_OF_J}, j.last_error, j.errors
    FROM moved AS j
    RETURNING id
),
{CANCELS_OF_MOVED}
SELECT count(*) FROM revived
"""

PARENT_RESULTS = """
-- The results of a job's parents that are done (S29: ctx.parent_results()), by id.
SELECT d.parent_id, d.parent_result
FROM pgjobs_dependency AS d
WHERE d.child_id = %(id)s AND d.ended = 'done' AND d.parent_id > 0  -- not a batch's seal
ORDER BY d.parent_id
"""

JOB_DEPENDENCIES = """
-- A job's parents (with on_failure and whether and how each ended) and its children,
-- each with where that job is now ('waiting', 'pending', 'running', 'done', 'dead', or
-- NULL: acked or pruned), for get_job and the admin.
SELECT e.side, e.other, e.on_failure, e.ended,
       coalesce(j.state, CASE WHEN x.id IS NOT NULL THEN 'dead' END)
FROM (
    SELECT 'parent' AS side, d.parent_id AS other, d.on_failure, d.ended
    FROM pgjobs_dependency AS d WHERE d.child_id = %(id)s AND d.parent_id > 0  -- no seal
    UNION ALL
    SELECT 'child', d.child_id, d.on_failure, d.ended
    FROM pgjobs_dependency AS d WHERE d.parent_id = %(id)s
) AS e
LEFT JOIN pgjobs_job AS j ON j.id = e.other
LEFT JOIN pgjobs_dead AS x ON x.id = e.other
ORDER BY 1 DESC, 2
"""

EDGES_FILLFACTOR = """
-- Leave half of each page of pgjobs_dependency free (migration 0007): an edge is updated
-- once, when its parent ends (ended, parent_result, neither indexed), and with room in
-- its page that update is HOT, so it writes no index entries (a fan-in's acks: a third of
-- the time of the edges' update).
ALTER TABLE pgjobs_dependency SET (fillfactor = 50)
"""

RESET_EDGES_FILLFACTOR = """
-- Back to the default fillfactor of pgjobs_dependency (migration 0007 reversed).
ALTER TABLE pgjobs_dependency RESET (fillfactor)
"""
