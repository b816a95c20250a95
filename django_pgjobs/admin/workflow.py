"""A job's place in a workflow on its own page (S29-S31): its parents (how each
dependency takes a death, whether it ended), its children, and its batch (progress and
callbacks), each linked to where that job is now."""

from __future__ import annotations

from typing import Any

from django.contrib import admin
from django.http import HttpRequest
from django.urls import reverse
from django.utils.html import format_html, format_html_join
from django.utils.safestring import SafeString, mark_safe

from django_pgjobs.managers.batches import batch_of_job
from django_pgjobs.managers.workflows import EdgeOf, edges_of

#: How an edge ended, as the page says it.
ENDED = {None: "not yet", "done": "done", "failed": "dead or cancelled"}


class WorkflowSection:
    """A job admin's page gains a "Workflow" section (S29-S31), after its first, when the
    job has parents, children or a batch; `workflow` must be among its readonly fields."""

    def get_fieldsets(self, request: HttpRequest, obj: Any = None) -> Any:
        fieldsets = list(super().get_fieldsets(request, obj))  # type: ignore[misc]
        if has_workflow(obj):
            fieldsets.insert(1, ("Workflow", {"fields": ("workflow",)}))
        return fieldsets

    @admin.display(description="parents, children, batch")
    def workflow(self, obj: Any) -> SafeString:
        return workflow_html(obj)


def job_link(job_id: int, state: str | None) -> SafeString:
    """`#id`, linked to the job's page where it is now (live or dead), with its state."""
    if state is None:
        return format_html("#{} (acked or pruned)", job_id)
    table = "deadjob" if state == "dead" else "job"
    url = reverse(f"admin:django_pgjobs_{table}_change", args=[job_id])
    return format_html("<a href='{}'>#{}</a> ({})", url, job_id, state)


def has_workflow(obj: Any) -> bool:
    """Whether the job has parents, children or a batch worth a section of its page: its
    flags say, with no query (a batch's member has children, its callbacks, and a
    callback has parents, its members and its seal)."""
    return obj is not None and bool(obj.has_parents or obj.has_children)


def workflow_html(obj: Any) -> SafeString:
    """The job's parents, children and batch as the page shows them."""
    using = obj._state.db
    edges = edges_of(obj.pk, using)
    parts = []
    parents = [edge for edge in edges if edge.side == "parent"]
    children = [edge for edge in edges if edge.side == "child"]
    if parents:
        parts.append(format_html("<p><strong>Waits for</strong></p>{}", _edges(parents, True)))
    if children:
        parts.append(format_html("<p><strong>Waited for by</strong></p>{}", _edges(children)))
    batch = batch_of_job(obj.pk, using)
    if batch is not None:
        ended = batch.done + batch.failed
        url = reverse("admin:django_pgjobs_batch_change", args=[batch.id])
        callbacks = format_html_join(
            mark_safe(", "),
            "on {}: {}",
            ((c.fires_on, job_link(c.job_id, c.job_state)) for c in batch.callbacks),
        )
        parts.append(
            format_html(
                "<p><strong>Batch</strong> <a href='{}'>#{}</a>, {}: {} of {} ended ({} done, "
                "{} failed); callbacks {}</p>",
                url,
                batch.id,
                batch.state,
                ended,
                batch.members,
                batch.done,
                batch.failed,
                callbacks,
            )
        )
    return format_html_join(mark_safe(""), "{}", ((part,) for part in parts)) or mark_safe("-")


def _edges(edges: list[EdgeOf], parents: bool = False) -> SafeString:
    rows = (
        (
            job_link(edge.other, edge.other_state),
            ENDED.get(edge.ended, edge.ended),
            f"; if it dies: {'run anyway' if edge.on_failure == 'run' else 'die with it'}"
            if parents
            else "",
        )
        for edge in edges
    )
    return format_html(
        "<ul>{}</ul>", format_html_join(mark_safe(""), "<li>{}, ended: {}{}</li>", rows)
    )
