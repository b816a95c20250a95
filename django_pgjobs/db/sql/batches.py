"""Statements on batches (S31): member jobs and callbacks that fire once when the last
member ends.

A batch is built of what dependencies already guarantee (db/sql/workflows.py): each
callback is a waiting child of every member, with on_failure 'run', and of one more
parent, the batch's seal, whose id is minus the batch's. The statement that records the
last of those ends releases every callback at once, and `pgjobs_end_parents` then
records the batch's end and deletes the callbacks that do not match it (on_success when
a member failed, on_failure when none did), in that statement's transaction.

Locks, in the order the end of a member takes them: the batch's waiting callbacks (in id
order), then the batch's row. Adding members and sealing take them in the same order
(LOCK_BATCH_CALLBACKS first), so none of them can deadlock with an end.
"""

from __future__ import annotations

from django_pgjobs.db.sql.jobs import DOCUMENT_COLUMNS, DOCUMENT_VALUES

WRITE_BATCH = f"""
-- Write a batch (S31) in one statement: its row (open), its members (pending, woken)
-- and its callbacks (waiting), each callback a child of every member and of the batch's
-- seal (parent id: minus the batch's id), on_failure 'run'. The first %(members)s rows of
-- %(jobs)s (as ENQUEUE_JOBS reads them) are the members, the rest the callbacks, which
-- fire on %(fires_on)s in order. Returns the batch's id with each job's id, in order.
WITH batch AS (
    INSERT INTO pgjobs_batch (state, members) VALUES ('open', %(members)s) RETURNING id
),
given AS (
    SELECT i.row, i.n, nextval(pg_get_serial_sequence('pgjobs_job', 'id')) AS id,
           i.n > %(members)s AS callback
    FROM jsonb_array_elements(%(jobs)s::jsonb) WITH ORDINALITY AS i(row, n)
),
inserted AS (
    INSERT INTO pgjobs_job AS job (
        id, state, parents_left, has_parents, has_children, {DOCUMENT_COLUMNS})
    SELECT i.id, CASE WHEN i.callback THEN 'waiting' ELSE 'pending' END,
           CASE WHEN i.callback THEN %(members)s + 1 ELSE 0 END,
           i.callback, NOT i.callback, {DOCUMENT_VALUES}
    FROM given AS i
    ORDER BY i.n
    RETURNING job.id, job.queue, job.state = 'pending' AND job.run_after <= now() AS runnable
),
callbacks AS (
    INSERT INTO pgjobs_batch_callback (job_id, batch_id, fires_on)
    SELECT g.id, b.id, (%(fires_on)s::text[])[g.n - %(members)s]
    FROM given AS g CROSS JOIN batch AS b
    WHERE g.callback
),
edges AS (
    INSERT INTO pgjobs_dependency (child_id, parent_id, on_failure)
    SELECT c.id, p.id, 'run'
    FROM given AS c
    CROSS JOIN (SELECT g.id FROM given AS g WHERE NOT g.callback
                UNION ALL
                SELECT -b.id FROM batch AS b) AS p
    WHERE c.callback
),
woke AS (
    SELECT pg_notify(%(channel)s, q.queue)
    FROM (SELECT DISTINCT queue FROM inserted WHERE %(notify)s AND runnable) AS q
)
SELECT (SELECT b.id FROM batch AS b), g.id, (SELECT count(*) FROM woke)
FROM given AS g
ORDER BY g.n
"""

LOCK_BATCH_CALLBACKS = """
-- Lock the callbacks of batch %(batch)s that still wait (S31), in id order, for the rest
-- of the transaction: the first lock of whoever adds members to the batch or seals it
-- (see the module). Returns their ids; no row: the batch has ended, or every callback
-- of it was cancelled, or there is no such batch.
SELECT j.id
FROM pgjobs_batch_callback AS c
JOIN pgjobs_job AS j ON j.id = c.job_id
WHERE c.batch_id = %(batch)s AND j.state = 'waiting'
ORDER BY j.id
FOR NO KEY UPDATE OF j
"""

ADD_BATCH_MEMBERS = f"""
-- Add the jobs of %(jobs)s (as ENQUEUE_JOBS reads them) to batch %(batch)s (S31), whose
-- waiting callbacks %(callbacks)s this transaction locked (LOCK_BATCH_CALLBACKS): pending
-- (woken), each a parent of every callback, which waits for as many more. Returns the
-- jobs' ids in order.
WITH given AS (
    SELECT i.row, i.n, nextval(pg_get_serial_sequence('pgjobs_job', 'id')) AS id
    FROM jsonb_array_elements(%(jobs)s::jsonb) WITH ORDINALITY AS i(row, n)
),
inserted AS (
    INSERT INTO pgjobs_job AS job (id, state, has_children, {DOCUMENT_COLUMNS})
    SELECT i.id, 'pending', true, {DOCUMENT_VALUES}
    FROM given AS i
    ORDER BY i.n
    RETURNING job.id, job.queue, job.run_after <= now() AS runnable
),
edges AS (
    INSERT INTO pgjobs_dependency (child_id, parent_id, on_failure)
    SELECT c.id, g.id, 'run'
    FROM given AS g CROSS JOIN unnest(%(callbacks)s::bigint[]) AS c(id)
),
waiting AS (
    UPDATE pgjobs_job AS j
    SET parents_left = j.parents_left + (SELECT count(*) FROM given)
    WHERE j.id = ANY(%(callbacks)s::bigint[]) AND j.state = 'waiting'
),
tallied AS (
    UPDATE pgjobs_batch AS b
    SET members = b.members + (SELECT count(*) FROM given)
    WHERE b.id = %(batch)s
),
woke AS (
    SELECT pg_notify(%(channel)s, q.queue)
    FROM (SELECT DISTINCT queue FROM inserted WHERE %(notify)s AND runnable) AS q
)
SELECT g.id, (SELECT count(*) FROM woke) FROM given AS g ORDER BY g.n
"""

SEAL_BATCH = """
-- Mark batch %(batch)s sealed (S31), its waiting callbacks locked (LOCK_BATCH_CALLBACKS).
-- Returns its id if it was open; END_BATCH_SEAL then ends the seal.
UPDATE pgjobs_batch AS b SET state = 'sealed'
WHERE b.id = %(batch)s AND b.state = 'open'
RETURNING b.id
"""

END_BATCH_SEAL = """
-- End batch %(batch)s's seal, the parent its callbacks wait for beside its members (S31):
-- a sealed batch whose members have all ended ends here, its callbacks released.
SELECT pgjobs_end_parents(ARRAY[-%(batch)s::bigint], ARRAY[NULL::jsonb], '{}'::bigint[],
                          %(channel)s, %(notify)s)
"""

BATCH = """
-- Batch %(batch)s as get_batch shows it (S31): its row; the tally (done, failed) as
-- recorded at its end or, before, counted on the edges of its first waiting callback (a
-- cancelled one lost its edges); and its
-- callbacks: what each fires on, its job id, and where that job is now ('waiting',
-- 'pending', 'running', 'done', 'dead', or null: acked, or deleted unfired).
SELECT b.id, b.state, b.members, coalesce(b.done, t.done), coalesce(b.failed, t.failed),
       b.created_at, b.ended_at,
       (SELECT coalesce(jsonb_agg(jsonb_build_array(
                   c.fires_on, c.job_id,
                   coalesce(j.state, CASE WHEN x.id IS NOT NULL THEN 'dead' END))
                ORDER BY c.job_id), '[]'::jsonb)
        FROM pgjobs_batch_callback AS c
        LEFT JOIN pgjobs_job AS j ON j.id = c.job_id
        LEFT JOIN pgjobs_dead AS x ON x.id = c.job_id
        WHERE c.batch_id = b.id)
FROM pgjobs_batch AS b
LEFT JOIN LATERAL (
    SELECT count(*) FILTER (WHERE d.ended = 'done') AS done,
           count(*) FILTER (WHERE d.ended = 'failed') AS failed
    FROM pgjobs_dependency AS d
    WHERE d.child_id = (SELECT min(c.job_id) FROM pgjobs_batch_callback AS c
                        JOIN pgjobs_job AS w ON w.id = c.job_id AND w.state = 'waiting'
                        WHERE c.batch_id = b.id)
      AND d.parent_id > 0
) AS t ON b.done IS NULL
WHERE b.id = %(batch)s
"""

BATCH_MEMBERS = """
-- A page of batch %(batch)s's members (S31), in id order after %(after)s, %(limit)s of
-- them: the parents of its first callback that still has its edges (a callback's edges go
-- when it is acked), each with its kind and state where it is now ('dead' in the dead
-- table; null: acked and not kept), and how its edge recorded its end.
SELECT d.parent_id, coalesce(j.kind, x.kind), coalesce(j.state, CASE WHEN x.id IS NOT NULL
                                                             THEN 'dead' END), d.ended
FROM pgjobs_dependency AS d
LEFT JOIN pgjobs_job AS j ON j.id = d.parent_id
LEFT JOIN pgjobs_dead AS x ON x.id = d.parent_id
WHERE d.child_id = (SELECT min(c.job_id) FROM pgjobs_batch_callback AS c
                    WHERE c.batch_id = %(batch)s
                      AND EXISTS (SELECT 1 FROM pgjobs_dependency AS e
                                  WHERE e.child_id = c.job_id))
  AND d.parent_id > %(after)s
ORDER BY d.parent_id
LIMIT %(limit)s
"""

BATCH_OF_JOB = """
-- The batch job %(id)s belongs to (S31) and how: 'callback', or 'member' (found by its
-- edge to a callback, kept until the batch ends). No row: none.
(SELECT c.batch_id, 'callback' FROM pgjobs_batch_callback AS c WHERE c.job_id = %(id)s)
UNION ALL
(SELECT c.batch_id, 'member'
 FROM pgjobs_dependency AS d
 JOIN pgjobs_batch_callback AS c ON c.job_id = d.child_id
 WHERE d.parent_id = %(id)s
 LIMIT 1)
LIMIT 1
"""

PRUNE_BATCHES = """
-- Delete the batches that ended more than %(older_than_s)s seconds ago (S31) and whose
-- callbacks are not still to run, with their callbacks' rows, at most %(limit)s at a
-- time. Returns how many.
WITH pruned AS (
    DELETE FROM pgjobs_batch AS b
    WHERE b.id IN (SELECT o.id FROM pgjobs_batch AS o
                   WHERE o.ended_at < now() - make_interval(secs => %(older_than_s)s)
                     AND NOT EXISTS (  -- its callbacks ran: ctx.batch() still reads it
                         SELECT 1 FROM pgjobs_batch_callback AS c
                         JOIN pgjobs_job AS j ON j.id = c.job_id
                         WHERE c.batch_id = o.id AND j.state IN ('pending', 'running'))
                   ORDER BY o.ended_at
                   LIMIT %(limit)s)
    RETURNING b.id
),
callbacks AS (
    DELETE FROM pgjobs_batch_callback AS c WHERE c.batch_id IN (SELECT id FROM pruned)
)
SELECT count(*) FROM pruned
"""
