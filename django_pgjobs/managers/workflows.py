"""Dependencies (S29, S30): writing jobs `after=` others, and reading them back.

Jobs with parents are written in one transaction (a savepoint in the caller's) of three
statements: lock the unfinished parents (LOCK_FREE_PARENTS, which never waits: see
`_standing_unwaited`), read where the others stand
(PARENT_STANDING, a fresh snapshot once the locks are held), then write every job and
edge at once (ENQUEUE_DEPENDENT_JOBS). A locked parent cannot end before this
transaction commits, and its end then sees the child (see db/sql/workflows.py); a parent
that ended before is taken as it ended, as far as a trace of it says (S40): done (kept
by result retention) or dead; one that left no trace is refused.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from typing import Any, NamedTuple, TypeVar

from django_pgjobs import exceptions
from django_pgjobs.db import connection as db
from django_pgjobs.db import sql
from django_pgjobs.dependencies import Edge
from django_pgjobs.options import ResolvedJob
from django_pgjobs.records import COUNT_CAP, EnqueueResult

Entry = TypeVar("Entry", bound=tuple[Any, ...])


def enqueue_dependent(
    jobs: Sequence[ResolvedJob], edges: Sequence[Sequence[Edge]], using: str | None
) -> list[EnqueueResult]:
    """Write `jobs`, each after its `edges`, in one statement and one transaction.

    Raises:
        InvalidDependency: a parent that names no job, or a job that left no trace
            (S40: acked without result retention, cancelled, deleted, pruned, rolled
            back), a dead parent without on_failure="run", a keyed job; nothing is
            written.
    """
    for index, job in enumerate(jobs):
        if job.key is not None:
            where = f"jobs[{index}]: " if len(jobs) > 1 else ""
            raise exceptions.InvalidDependency(
                f"{where}A job written with after= or in a workflow cannot have a key "
                f"(key={job.key!r}): a waiting job is outside the live key index. "
                "Nothing was written."
            )
    parents = sorted({edge.parent_id for row in edges for edge in row if edge.parent_id})
    document = "[" + ",".join(job.as_json_row() for job in jobs) + "]"
    for _ in range(LOCK_ROUNDS):
        try:
            with db.atomic(using):
                standing = _standing_unwaited(parents, using)
                return _write(document, edges, standing, using)
        except _ParentHeld as held:  # rolled back: this enqueue holds none of them now
            db.rolled_back(sql.WAIT_FOR_PARENT, {"id": held.parent_id}, using)
    with db.atomic(using):  # the last resort: wait for each in id order
        return _write(document, edges, _standing(parents, using), using)


#: Rounds of taking the parents' locks without waiting (S41) before an enqueue waits for
#: them in id order instead: each round but the first follows the end of a transaction
#: that held one of them, so that many hold them in turn only under a storm.
LOCK_ROUNDS = 50


class _ParentHeld(Exception):
    """A parent another transaction holds: let go of the others, then wait for it."""

    def __init__(self, parent_id: int) -> None:
        super().__init__(parent_id)
        self.parent_id = parent_id


def _write(
    document: str,
    edges: Sequence[Sequence[Edge]],
    standing: dict[int, tuple[str, str | None]],
    using: str | None,
) -> list[EnqueueResult]:
    rows = []
    for child, row in enumerate(edges, start=1):
        for edge in row:
            rows.append(
                [
                    child,
                    edge.parent_id,
                    None if edge.parent_row is None else edge.parent_row + 1,
                    edge.on_failure,
                    "open" if edge.parent_id is None else _edge_standing(edge, standing),
                ]
            )
    params = {"jobs": document, "edges": json.dumps(rows), **db.enqueue_params()}
    written = db.fetchall(sql.ENQUEUE_DEPENDENT_JOBS, params, using)
    return [EnqueueResult(id=row[0], inserted=True) for row in written]


def _standing_unwaited(parents: list[int], using: str | None) -> dict[int, tuple[str, str | None]]:
    """Each parent's standing as `_standing` reads it, its unfinished ones locked
    without waiting for any (S41).

    Why not wait in id order: a worker's ack, retry or fail of several parents locks
    them, then their waiting children; an enqueue after one of those children and
    another of those parents locks both as parents, so id order alone cannot keep the
    two apart. Holding no parent while it waits for one, an enqueue closes no cycle.

    Raises:
        _ParentHeld: another transaction holds an unfinished parent; the caller rolls
            back what this took and waits for that one alone.
    """
    if not parents:
        return {}
    rows = db.fetchall(sql.LOCK_FREE_PARENTS, {"parents": parents}, using)
    held = [parent for parent, locked in rows if not locked]
    if held:
        raise _ParentHeld(min(held))
    return _with_the_rest(parents, {parent for parent, _ in rows}, using)


def _standing(parents: list[int], using: str | None) -> dict[int, tuple[str, str | None]]:
    """Each parent's standing: "open" for the unfinished ones, now locked (waiting for
    each in id order); else what PARENT_STANDING reads once the locks are held."""
    if not parents:
        return {}
    locked = {row[0] for row in db.fetchall(sql.LOCK_PARENTS, {"parents": parents}, using)}
    return _with_the_rest(parents, locked, using)


def _with_the_rest(
    parents: list[int], locked: set[int], using: str | None
) -> dict[int, tuple[str, str | None]]:
    standing: dict[int, tuple[str, str | None]] = dict.fromkeys(locked, ("open", None))
    rest = [parent for parent in parents if parent not in locked]
    if rest:
        for parent, where, reason in db.fetchall(sql.PARENT_STANDING, {"parents": rest}, using):
            standing[parent] = (where, reason)
    return standing


def _edge_standing(edge: Edge, standing: dict[int, tuple[str, str | None]]) -> str:
    assert edge.parent_id is not None
    where, reason = standing[edge.parent_id]
    if where in ("open", "done"):
        return where
    if where == "dead":
        if edge.on_failure == "run":
            return "failed"
        raise exceptions.InvalidDependency(
            f"Parent job {edge.parent_id} is a dead letter ({reason}): requeue it first, or "
            "name it as Parent(job, on_failure='run'). Nothing was written."
        )
    if where == "live":  # requeued between the lock and the read: not locked
        raise exceptions.InvalidDependency(
            f"Parent job {edge.parent_id} came back to life while this job was written "
            "(a requeue); try again. Nothing was written."
        )
    if where == "gone":  # S40: only a parent that was done counts as done
        raise exceptions.InvalidDependency(
            f"Parent job {edge.parent_id} has ended and left no trace: it was acked without "
            "result retention, cancelled, deleted or pruned, or a batch's callback that did "
            "not fire, or its enqueue rolled back; whether it succeeded cannot be told. "
            "Write the child before its parent can end (in the transaction that writes the "
            "parent, or in one workflow()), or give the parent result_retention= so that "
            "its success is kept until the child is written. Nothing was written."
        )
    raise exceptions.InvalidDependency(f"No job has the id {edge.parent_id}. Nothing was written.")


def parent_results(job_id: int, using: str | None) -> dict[int, Any]:
    """The results of a job's parents that are done, by parent id (S29)."""
    rows = db.fetchall(sql.PARENT_RESULTS, {"id": job_id}, using)
    return {parent: db.json_value(result) for parent, result in rows}


def with_dependencies(values: dict[str, Any], using: str | None) -> dict[str, Any]:
    """A job's row values with its parents' and children's ids, if it has any."""
    if values["has_parents"] or values["has_children"]:
        edges = edges_of(values["id"], using)
        values["parents"] = tuple(edge.other for edge in edges if edge.side == "parent")
        values["children"] = tuple(edge.other for edge in edges if edge.side == "child")
    return values


class EdgeOf(NamedTuple):
    """One edge of a job, seen from it: the other job ("parent" or "child"), the
    dependency's on_failure and how it ended (None: not yet), and where the other job is
    now ("waiting", "pending", "running", "done", "dead"; None: acked or pruned)."""

    side: str
    other: int
    on_failure: str
    ended: str | None
    other_state: str | None


def edges_of(job_id: int, using: str | None) -> list[EdgeOf]:
    """A job's parents then children (S29), by id, for get_job and the admin."""
    return [EdgeOf(*row) for row in db.fetchall(sql.JOB_DEPENDENCIES, {"id": job_id}, using)]


class EdgesPage(NamedTuple):
    """The first of a job's parents and children (`edges`, as edges_of returns them),
    and how many of each it has (counted up to COUNT_CAP + 1)."""

    edges: list[EdgeOf]
    parents: int
    children: int


def first_edges_of(job_id: int, limit: int, using: str | None) -> EdgesPage:
    """Up to `limit` of a job's parents and of its children, by id, with their counts:
    for a page that cannot show a batch's million edges."""
    rows = db.fetchall(sql.FIRST_EDGES_OF_JOB, {"id": job_id, "limit": limit}, using)
    ((parents, children),) = db.fetchall(
        sql.EDGE_COUNTS_OF_JOB, {"id": job_id, "cap": COUNT_CAP}, using
    )
    return EdgesPage([EdgeOf(*row) for row in rows], int(parents), int(children))


def revive_dependents(job_id: int, using: str | None) -> int:
    """Bring back to waiting the dependents the death of `job_id` took (S30), those
    that no other dead parent holds (S40). Inside the requeue's transaction."""
    if not db.fetchall(sql.LOCK_LOST_EDGES, {"id": job_id}, using):
        return 0
    ((revived,),) = db.fetchall(sql.REVIVE_DEPENDENTS, {"id": job_id}, using)
    return int(revived)


def in_id_order(entries: Iterable[Entry]) -> list[Entry]:
    """`entries` (each a tuple starting with a handle) by job id: the order in which the
    queue's statements lock job rows (S41), so that two batches ending some of the same
    jobs at the same moment cannot deadlock."""
    return sorted(entries, key=lambda entry: entry[0].id)
