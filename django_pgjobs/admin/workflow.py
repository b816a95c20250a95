"""A job's place in a workflow on its own page (S29-S31): its parents (how each
dependency takes a death, whether it ended), its children, and its batch (progress and
callbacks), each linked to where that job is now; the first of them only, with a link
to the lists filtered on its edges (`ParentsOfFilter`, `ChildrenOfFilter`)."""

from __future__ import annotations

from typing import Any

from django.contrib import admin
from django.db.models import QuerySet
from django.http import HttpRequest
from django.utils.html import format_html, format_html_join
from django.utils.safestring import SafeString, mark_safe

from django_pgjobs.admin.common import job_id_of
from django_pgjobs.admin.databases import console_url, current
from django_pgjobs.managers.batches import batch_of_job
from django_pgjobs.managers.workflows import EdgeOf, first_edges_of
from django_pgjobs.models import Dependency
from django_pgjobs.records import COUNT_CAP

#: The parents, and the children, a job's page shows at most (a batch's callback has a
#: parent per member): the rest are a link away.
EDGES_SHOWN = 20

#: How an edge ended, as the page says it.
ENDED = {None: "not yet", "done": "done", "failed": "dead or cancelled"}


class EdgeFilter(admin.SimpleListFilter):
    """The jobs at the other end of one job's edges (S29), for the link under its page's
    first few: shown only while it is set, since no list of every job fits a sidebar."""

    #: The side of the named job's edges the listed jobs are at: "parent" or "child".
    side = ""

    def lookups(self, request: HttpRequest, model_admin: Any) -> list[tuple[str, str]]:
        value = self.value()
        return [(value, f"#{value[:20]}")] if value else []

    def queryset(self, request: HttpRequest, queryset: QuerySet[Any]) -> QuerySet[Any]:
        if not self.value():
            return queryset
        job_id = job_id_of(self.value() or "")
        if not job_id:
            return queryset.none()
        if self.side == "parent":
            parents = (
                Dependency.objects.using(current()).filter(child_id=job_id).values("parent_id")
            )
            return queryset.filter(id__in=parents)
        children = Dependency.objects.using(current()).filter(parent_id=job_id).values("child_id")
        return queryset.filter(id__in=children)


class ParentsOfFilter(EdgeFilter):
    title = "parents of"
    parameter_name = "parents_of"
    side = "parent"


class ChildrenOfFilter(EdgeFilter):
    title = "children of"
    parameter_name = "children_of"
    side = "child"


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
    url = console_url(f"admin:django_pgjobs_{table}_change", [job_id])
    return format_html("<a href='{}'>#{}</a> ({})", url, job_id, state)


def has_workflow(obj: Any) -> bool:
    """Whether the job has parents, children or a batch worth a section of its page: its
    flags say, with no query (a batch's member has children, its callbacks, and a
    callback has parents, its members and its seal)."""
    return obj is not None and bool(obj.has_parents or obj.has_children)


def workflow_html(obj: Any) -> SafeString:
    """The job's parents, children and batch as the page shows them."""
    using = obj._state.db
    found = first_edges_of(obj.pk, EDGES_SHOWN, using)
    parts = []
    parents = [edge for edge in found.edges if edge.side == "parent"]
    children = [edge for edge in found.edges if edge.side == "child"]
    if parents:
        heading = _heading("Waits for", found.parents, len(parents), "parents_of", obj.pk)
        parts.append(format_html("{}{}", heading, _edges(parents, True)))
    if children:
        heading = _heading("Waited for by", found.children, len(children), "children_of", obj.pk)
        parts.append(format_html("{}{}", heading, _edges(children)))
    batch = batch_of_job(obj.pk, using)
    if batch is not None:
        ended = batch.done + batch.failed
        url = console_url("admin:django_pgjobs_batch_change", [batch.id])
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


def _heading(title: str, total: int, shown: int, parameter: str, job_id: int) -> SafeString:
    """ "Waits for 3 jobs", and, past the ones shown, which they are and where the rest
    are: the live and the dead lists filtered on this job's edges."""
    many = f"over {COUNT_CAP:,}" if total > COUNT_CAP else f"{total:,}"
    text = format_html("<strong>{} {} {}</strong>", title, many, "job" if total == 1 else "jobs")
    if total <= shown:
        return format_html("<p>{}</p>", text)
    live = console_url("admin:django_pgjobs_job_changelist", query={parameter: job_id})
    dead = console_url("admin:django_pgjobs_deadjob_changelist", query={parameter: job_id})
    return format_html(
        "<p>{} (the first {} by id; every one: <a href='{}'>live</a>, "
        "<a href='{}'>dead letters</a>)</p>",
        text,
        shown,
        live,
        dead,
    )


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
