"""Statements that read a job's edges a page at a time, for its admin page (S29-S31): a
batch's callback has an edge per member, and a fan-out's parent one per child, so the
page shows the first of them and how many there are. (The rest of the edges' statements
are in `workflows`.)"""

from __future__ import annotations

FIRST_EDGES_OF_JOB = """
-- Up to %(limit)s of job %(id)s's parents (by id; not a batch's seal) and up to %(limit)s
-- of its children (by id), each with on_failure, how it ended and where that job is now
-- ('waiting', 'pending', 'running', 'done', 'dead', or NULL: acked or pruned).
SELECT e.side, e.other, e.on_failure, e.ended,
       coalesce(j.state, CASE WHEN x.id IS NOT NULL THEN 'dead' END)
FROM (
    (SELECT 'parent' AS side, d.parent_id AS other, d.on_failure, d.ended
     FROM pgjobs_dependency AS d WHERE d.child_id = %(id)s AND d.parent_id > 0
     ORDER BY d.parent_id LIMIT %(limit)s)
    UNION ALL
    (SELECT 'child', d.child_id, d.on_failure, d.ended
     FROM pgjobs_dependency AS d WHERE d.parent_id = %(id)s
     ORDER BY d.child_id LIMIT %(limit)s)
) AS e
LEFT JOIN pgjobs_job AS j ON j.id = e.other
LEFT JOIN pgjobs_dead AS x ON x.id = e.other
ORDER BY 1 DESC, 2
"""

EDGE_COUNTS_OF_JOB = """
-- How many parents (not a batch's seal) and children job %(id)s has, each counted up to
-- %(cap)s + 1 (more: "over %(cap)s").
SELECT (SELECT count(*) FROM (SELECT 1 FROM pgjobs_dependency AS d
                              WHERE d.child_id = %(id)s AND d.parent_id > 0
                              LIMIT %(cap)s + 1) AS p),
       (SELECT count(*) FROM (SELECT 1 FROM pgjobs_dependency AS d
                              WHERE d.parent_id = %(id)s
                              LIMIT %(cap)s + 1) AS c)
"""
