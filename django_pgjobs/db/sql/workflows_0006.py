# ruff: noqa: E501 - frozen text, byte for byte as 0006 installed it
"""The text of `pgjobs_end_parents` as migration 0006 installed it, kept verbatim: a
migration must install what it always did, and 0007 reverses to it. Never edit it; the
function's current text is db/sql/workflows.py's END_PARENTS_FUNCTION."""

from __future__ import annotations

END_PARENTS_FUNCTION_0006 = """
-- Install pgjobs_end_parents(done_ids, done_results, failed_ids, channel, notify,
-- acked_children) (S29, S30): record that parents ended, and delete the edges of acked
-- children (they no longer need their parents' results). A done parent's edges keep
-- its result, and a child
-- whose last parent it was becomes pending (woken). A dead or cancelled parent's
-- children die with it as 'dependency failed: <id>' of the first job that died
-- (transitively), unless their edge says on_failure = 'run', which counts as done.
-- Returns the children moved (pending or dead). Each statement locks what it changes,
-- and the next one reads with a fresh snapshot (see the module's docstring).
CREATE OR REPLACE FUNCTION pgjobs_end_parents(
    done_ids bigint[], done_results jsonb[], failed_ids bigint[], wake_channel text,
    wake boolean, acked_children bigint[] DEFAULT '{}'
) RETURNS integer
LANGUAGE plpgsql VOLATILE
AS $body$
#variable_conflict use_column
DECLARE
    freed bigint[];
    doomed bigint[];
    doomed_by bigint[];
    frontier bigint[] := coalesce(failed_ids, '{}');
    roots bigint[] := coalesce(failed_ids, '{}');
    moved integer := 0;
    released integer;
BEGIN
    IF cardinality(acked_children) > 0 THEN
        DELETE FROM pgjobs_dependency AS d WHERE d.child_id = ANY(acked_children);
    END IF;
    WITH ended AS (
        UPDATE pgjobs_dependency AS d
        SET ended = 'done', parent_result = r.result
        FROM unnest(coalesce(done_ids, '{}'), coalesce(done_results, '{}'))
             AS r(id, result)
        WHERE d.parent_id = r.id AND d.ended IS NULL
        RETURNING d.child_id
    )
    SELECT coalesce(array_agg(e.child_id), '{}') INTO freed FROM ended AS e;
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
                SELECT j.id FROM pgjobs_job AS j
                WHERE j.id IN (SELECT id FROM counted) AND j.state = 'waiting'
                ORDER BY j.id
                FOR NO KEY UPDATE
            ),
            released_jobs AS (
                UPDATE pgjobs_job AS j
                SET parents_left = j.parents_left - c.n,
                    state = CASE WHEN j.parents_left - c.n > 0 THEN 'waiting'
                                 ELSE 'pending' END
                FROM counted AS c
                WHERE j.id = c.id AND j.id IN (SELECT id FROM locked) AND j.state = 'waiting'
                RETURNING j.queue, j.state, j.run_after
            ),
            woke AS (
                SELECT pg_notify(wake_channel, q.queue)
                FROM (SELECT DISTINCT r.queue FROM released_jobs AS r
                      WHERE r.state = 'pending' AND r.run_after <= now()) AS q
                WHERE wake
            )
            SELECT (SELECT count(*) FROM released_jobs WHERE state = 'pending')
                   + 0 * (SELECT count(*) FROM woke)
            INTO released;
            moved := moved + released;
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
        SELECT coalesce(array_agg(e.child_id) FILTER (WHERE e.on_failure = 'cancel'), '{}'),
               coalesce(array_agg(e.root) FILTER (WHERE e.on_failure = 'cancel'), '{}'),
               coalesce(array_agg(e.child_id) FILTER (WHERE e.on_failure = 'run'), '{}')
        INTO doomed, doomed_by, freed
        FROM ended AS e;
        -- Their dependents die with them; the next round takes theirs.
        WITH fate AS (
            SELECT d.id, min(d.root) AS root
            FROM unnest(doomed, doomed_by) AS d(id, root)
            GROUP BY d.id
        ),
        locked AS (
            SELECT j.id FROM pgjobs_job AS j
            WHERE j.id IN (SELECT id FROM fate) AND j.state = 'waiting'
            ORDER BY j.id
            FOR UPDATE
        ),
        buried AS (
            DELETE FROM pgjobs_job AS j USING fate AS f
            WHERE j.id = f.id AND j.id IN (SELECT id FROM locked) AND j.state = 'waiting'
            RETURNING j.*, f.root AS doomed_by
        ),
        dead AS (
            INSERT INTO pgjobs_dead (id, queue, kind, key, priority, run_after, attempts, max_attempts, lease_s, claimed_by, claimed_until, claimed_at, started_at, worker_id, expires_at, payload, result, rerun_after, rerun_payload, rerun_expires_at, result_ttl_s, created_at, timeout_s, progress, limit_key, concurrency_limit, rate_limit, rate_period_s, has_parents, has_children, last_error, errors, reason, died_at)
            SELECT j.id, j.queue, j.kind, j.key, j.priority, j.run_after, j.attempts, j.max_attempts, j.lease_s, j.claimed_by, j.claimed_until, j.claimed_at, j.started_at, j.worker_id, j.expires_at, j.payload, j.result, j.rerun_after, j.rerun_payload, j.rerun_expires_at, j.result_ttl_s, j.created_at, j.timeout_s, j.progress, j.limit_key, j.concurrency_limit, j.rate_limit, j.rate_period_s, j.has_parents, j.has_children, j.last_error, j.errors,
                   'dependency failed: ' || j.doomed_by, now()
            FROM buried AS j
            RETURNING id
        )
        SELECT coalesce(array_agg(b.id), '{}'), coalesce(array_agg(b.doomed_by), '{}')
        INTO frontier, roots
        FROM buried AS b;
        moved := moved + cardinality(frontier);
    END LOOP;
    RETURN moved;
END
$body$
"""
