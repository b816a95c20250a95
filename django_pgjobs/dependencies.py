"""What `after=` may name (S29, S30), validated before anything is written.

    Job.objects.enqueue("report.build", after=[fetched, Parent(cleanup, on_failure="run")])

A parent is a job id, anything with an integer `id` (an EnqueueResult, a JobRecord, a
handle), a workflow's step, or a `Parent` that wraps one of those with its
`on_failure`: "cancel" (the default: the child dies with its parent, as
"dependency failed: <id>") or "run" (the parent's death counts as done).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Final

from django_pgjobs.exceptions import InvalidDependency

ON_FAILURE_MODES: Final = ("cancel", "run")
#: Most parents one job may name (a fan-in after a fan-out of as many children).
MAX_PARENTS: Final = 10_000
#: The largest id a job can have (bigint).
MAX_JOB_ID: Final = 2**63 - 1


@dataclass(frozen=True)
class Parent:
    """A parent with how its child takes the parent's death (`on_failure`)."""

    job: Any
    on_failure: str = "cancel"


@dataclass(frozen=True)
class Edge:
    """One validated dependency: on a job `parent_id`, or on the step of the same
    workflow at index `parent_row` (0-based), exactly one of them set."""

    on_failure: str
    parent_id: int | None = None
    parent_row: int | None = None


def resolve_after(after: Any, workflow: object | None = None) -> list[Edge]:
    """Validate `after` into its edges, one per parent, in the order given.

    Args:
        workflow: the workflow the job is added to: its steps (`step_of` it) are
            parents by their row; a step of a workflow written already is its job.

    Raises:
        InvalidDependency: naming what is wrong; nothing is written.
    """
    if after is None:
        return []
    if isinstance(after, (str, bytes, Mapping)) or not isinstance(after, Iterable):
        raise InvalidDependency(
            f"after= takes a list of jobs (ids, enqueue results, workflow steps), "
            f"not {_shown(after)}. Nothing was written."
        )
    edges: list[Edge] = []
    seen: dict[tuple[int | None, int | None], str] = {}
    for given in after:
        if len(edges) >= MAX_PARENTS:
            raise InvalidDependency(
                f"A job may name at most {MAX_PARENTS} parents in after=; use fewer "
                "(a batch's callback gathers more). Nothing was written."
            )
        edge = _edge(given, workflow)
        where = (edge.parent_id, edge.parent_row)
        if where in seen:
            if seen[where] != edge.on_failure:
                raise InvalidDependency(
                    f"after= names {_shown(given)} twice, with on_failure "
                    f"{seen[where]!r} and {edge.on_failure!r}. Nothing was written."
                )
            continue
        seen[where] = edge.on_failure
        edges.append(edge)
    return edges


def _edge(given: Any, workflow: object | None) -> Edge:
    on_failure = "cancel"
    job = given
    if isinstance(given, Parent):
        on_failure = given.on_failure
        job = given.job
        if on_failure not in ON_FAILURE_MODES or type(on_failure) is not str:
            raise InvalidDependency(
                f"on_failure must be one of {ON_FAILURE_MODES}, not {_shown(on_failure)}. "
                "Nothing was written."
            )
    if workflow is not None and getattr(job, "step_of", None) is workflow:
        return Edge(on_failure, parent_row=job.row)
    job_id = job if isinstance(job, int) else getattr(job, "id", None)
    if isinstance(job_id, bool) or not isinstance(job_id, int):
        hint = " (a step of an open workflow is a parent in that workflow only)"
        raise InvalidDependency(
            f"after= takes jobs: ids, enqueue results, workflow steps or Parent(...), not "
            f"{_shown(given)}{hint if hasattr(job, 'step_of') else ''}. Nothing was written."
        )
    if not 1 <= job_id <= MAX_JOB_ID:
        raise InvalidDependency(f"No job has the id {job_id}. Nothing was written.")
    return Edge(on_failure, parent_id=int(job_id))


def _shown(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 80 else f"{text[:77]}..."
