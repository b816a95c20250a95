"""`workflow()`: many jobs and their dependencies written at once (S29).

    from django_pgjobs.workflows import workflow

    with workflow() as wf:
        page = wf.add(fetch, url=url)
        chunks = [wf.add(embed, after=[page], part=n) for n in range(8)]
        wf.add(build_index.using(queue="slow"), after=chunks)
    # written: one statement for every job and edge, in one transaction

Nothing is written until the block ends without an exception; then every step's `id`
is set. A step is a parent for later steps of its workflow, and once written, for any
job (`after=[step]`). A handler reads its parents' results with `ctx.parent_results()`.
"""

from __future__ import annotations

from collections.abc import Iterable
from types import TracebackType
from typing import Any

from django_pgjobs import options, registry
from django_pgjobs.dependencies import Edge, resolve_after
from django_pgjobs.exceptions import InvalidJobOption

#: The options of a step that a workflow cannot honour (a waiting job has no key; one
#: statement writes to one database: the workflow's).
REFUSED_OPTIONS = ("key", "on_conflict", "using")


class WorkflowStep:
    """One job of a workflow: its `id` once the workflow is written (None before)."""

    __slots__ = ("id", "kind", "row", "step_of")

    def __init__(self, workflow: Workflow, row: int, kind: str) -> None:
        self.step_of = workflow
        self.row = row
        self.kind = kind
        self.id: int | None = None

    def __repr__(self) -> str:
        return f"<WorkflowStep {self.kind} row={self.row} id={self.id}>"


class Workflow:
    """The jobs of one `with workflow():` block, written together when it ends."""

    def __init__(self, *, using: str | None = None) -> None:
        self.using = using
        self.steps: list[WorkflowStep] = []
        self._jobs: list[options.ResolvedJob] = []
        self._edges: list[list[Edge]] = []
        self.written = False

    def add(
        self, target: Any, /, *, after: Iterable[Any] | None = None, **payload: Any
    ) -> WorkflowStep:
        """Add a job: `target` a @job function (or its `.using(...)`) or a kind's name,
        `payload` its keyword arguments, `after` its parents (steps of this workflow,
        or jobs written before).

        Raises:
            InvalidJobOption: a subclass naming what is wrong; nothing is written.
        """
        if self.written:
            raise InvalidJobOption("This workflow was written already; start another.")
        kind, given = kind_and_options(target, "a workflow's step")
        refused = [name for name in REFUSED_OPTIONS if name in given]
        if refused:
            raise InvalidJobOption(
                f"A workflow's step cannot take {refused}: a waiting job has no key, and a "
                "workflow writes to its own database (workflow(using=...))."
            )
        parents = list(given.pop("after", None) or []) + list(after or [])
        edges = resolve_after(parents, self)
        resolved = resolve_step(kind, given, payload)
        step = WorkflowStep(self, len(self.steps), resolved.kind)
        self.steps.append(step)
        self._jobs.append(resolved)
        self._edges.append(edges)
        return step

    def write(self) -> None:
        """Write every step and edge: one statement, one transaction (a savepoint in
        the caller's). Called when the `with` block ends."""
        from django_pgjobs.models import Job

        if self.written:
            return
        self.written = True
        if not self.steps:
            return
        from django_pgjobs.managers.enqueue import database_of_jobs

        using = self.using or database_of_jobs(self._jobs, "a workflow")
        results = Job.objects.enqueue_workflow(self._jobs, self._edges, using=using)
        for step, result in zip(self.steps, results, strict=True):
            step.id = result.id

    def __enter__(self) -> Workflow:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        if exc_type is None:
            self.write()
        else:
            self.written = True  # an exception in the block: nothing is written


def workflow(*, using: str | None = None) -> Workflow:
    """Start a workflow: `with workflow() as wf: wf.add(...)`; see the module."""
    return Workflow(using=using)


def kind_and_options(target: Any, what: str) -> tuple[str, dict[str, Any]]:
    """The kind and the `.using(...)` options of `target`: a @job function, its
    `.using(...)`, or a kind's name. `what` names the job in errors ("a workflow's step").

    Raises:
        InvalidJobOption: anything else, or a @job with a key function.
    """
    if isinstance(target, str):
        return target, {}
    definition = getattr(target, "definition", None)
    if definition is None or not hasattr(target, "enqueue_options"):
        raise InvalidJobOption(
            f"{what[0].upper()}{what[1:]} takes a @job function, its .using(...), or a "
            f"kind's name, not {target!r}."
        )
    if definition.key is not None:
        raise InvalidJobOption(
            f"{definition.kind!r} has a key function: a job written with dependencies "
            f"has no key, so it cannot be {what}."
        )
    return definition.kind, dict(target.enqueue_options)


def resolve_step(kind: str, given: dict[str, Any], payload: Any) -> options.ResolvedJob:
    """Resolve one job of a workflow or a batch as an enqueue would, decorator defaults
    and limits included, its payload fitted to its handler (S28).

    Raises:
        InvalidJobOption: a subclass naming what is wrong.
    """
    defaults = registry.decorator_defaults(kind)
    resolved = options.resolve_job(kind, payload, defaults=defaults, **given)
    from django_pgjobs.managers.enqueue import fit_payload, known_kind, with_limits

    known_kind(resolved.kind)
    fit_payload(resolved.kind, payload)
    return with_limits(resolved, payload)
