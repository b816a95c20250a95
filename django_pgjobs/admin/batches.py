"""Batches (S31): each with its progress (members done and failed of how many) and its
callbacks, linked to their jobs while they are live; a batch's page lists its members,
paged, each with its state and a link to its page. Read only: batches are written by
`batch()` and end with their last member."""

from __future__ import annotations

from typing import Any

from django.contrib import admin
from django.db.models import DurationField, ExpressionWrapper, F, QuerySet
from django.db.models.functions import Now
from django.http import HttpRequest, HttpResponse, HttpResponseBadRequest
from django.utils.html import format_html, format_html_join
from django.utils.safestring import SafeString, mark_safe

from django_pgjobs.admin.common import (
    ExactTimes,
    OfferedFiltersOnly,
    refuse_action,
    refuse_bad_params,
    refuse_unoffered_filters,
    relative_time,
)
from django_pgjobs.admin.databases import InChosenDatabase, console_url
from django_pgjobs.dependencies import MAX_JOB_ID
from django_pgjobs.managers.batches import read_batch
from django_pgjobs.models import Batch
from django_pgjobs.records import BatchMember, BatchRecord

#: Where a callback's job is, as the list says it.
CALLBACK_STATES = {
    "waiting": "waiting",
    "pending": "fired, pending",
    "running": "fired, running",
    "done": "fired, done",
    "dead": "dead",
}


#: Members a batch's page lists at a time.
MEMBERS_PER_PAGE = 50


def member_row(member: BatchMember) -> dict[str, Any]:
    """A member as the batch's page lists it: its link (none once acked and not kept),
    its kind, where it is and how its end was recorded."""
    if member.state is None:
        where, link = "acked, not kept", None
    else:
        where = member.state
        table = "deadjob" if member.state == "dead" else "job"
        link = console_url(f"admin:django_pgjobs_{table}_change", [member.job_id])
    return {
        "id": member.job_id,
        "kind": member.kind or "-",
        "state": where,
        "link": link,
        "ended": {"done": "done", "failed": "dead or cancelled"}.get(member.ended or "", "not yet"),
    }


@admin.register(Batch)
class BatchAdmin(InChosenDatabase, ExactTimes, OfferedFiltersOnly, admin.ModelAdmin):  # type: ignore[type-arg]
    """Every batch, newest first: its state, progress and callbacks. Read only."""

    list_display = ("id", "state", "progress", "callbacks", "created", "ended")
    list_filter = ("state",)
    fields = ("id", "state", "progress", "members_of", "callbacks", "created_at", "ended_at")
    readonly_fields = ("progress", "members_of", "callbacks")
    ordering = ("-id",)
    list_per_page = 50
    change_form_template = "admin/django_pgjobs/batch_change_form.html"
    change_list_template = "admin/django_pgjobs/plain_change_list.html"

    def has_add_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False  # batch() writes batches

    def get_queryset(self, request: HttpRequest) -> QuerySet[Batch]:
        created = ExpressionWrapper(F("created_at") - Now(), output_field=DurationField())
        ended = ExpressionWrapper(F("ended_at") - Now(), output_field=DurationField())
        queryset: QuerySet[Batch] = super().get_queryset(request)
        return queryset.annotate(created_in=created, ended_in=ended)

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False  # the sweeper prunes ended batches

    def changelist_view(
        self, request: HttpRequest, extra_context: dict[str, Any] | None = None
    ) -> HttpResponse:
        refused = (
            refuse_bad_params(request)
            or refuse_unoffered_filters(self, request)
            or refuse_action(self, request)
        )
        if refused is not None:
            return refused
        return super().changelist_view(request, extra_context)

    def change_view(
        self,
        request: HttpRequest,
        object_id: str,
        form_url: str = "",
        extra_context: dict[str, Any] | None = None,
    ) -> HttpResponse:
        """The batch's page, with a page of its members after `?after=` (a member's id)."""
        after_text = request.GET.get("after", "0")
        if not (after_text.isascii() and after_text.isdigit()) or int(after_text) > MAX_JOB_ID:
            return HttpResponseBadRequest(
                "after is the id of the last member shown: a whole number.",
                content_type="text/plain",
            )
        context = dict(extra_context or {})
        if object_id.isascii() and object_id.isdigit() and 1 <= int(object_id) <= MAX_JOB_ID:
            after = int(after_text)
            page = Batch.objects.members(int(object_id), after=after, limit=MEMBERS_PER_PAGE + 1)
            context["members_page"] = [member_row(member) for member in page[:MEMBERS_PER_PAGE]]
            context["members_after"] = after
            here = "admin:django_pgjobs_batch_change"
            context["members_first_url"] = console_url(here, [object_id])
            if len(page) > MEMBERS_PER_PAGE:
                last = page[MEMBERS_PER_PAGE - 1].job_id
                context["members_next_url"] = console_url(here, [object_id], {"after": last})
        return super().change_view(request, object_id, form_url, context)

    def _record(self, obj: Batch) -> BatchRecord | None:
        """The batch with its live tally and callbacks (one indexed read per row shown)."""
        cached: BatchRecord | None = getattr(obj, "_record", None)
        if cached is None:
            cached = read_batch(obj.pk, obj._state.db)
            obj._record = cached  # type: ignore[attr-defined]
        return cached

    @admin.display(description="progress")
    def progress(self, obj: Batch) -> str:
        record = self._record(obj)
        if record is None:
            return "-"
        ended = record.done + record.failed
        text = f"{ended} of {record.members} ended: {record.done} done, {record.failed} failed"
        return text if record.ended or obj.state == "sealed" else f"{text} (open)"

    @admin.display(description="members")
    def members_of(self, obj: Batch) -> SafeString:
        """Links to the batch's members in the job and dead-letter lists (paged there):
        the parents of a callback of the batch, while a callback's edges remain."""
        record = self._record(obj)
        if record is None:
            return mark_safe("-")
        waiting = [c.job_id for c in record.callbacks if c.job_state is not None]
        counted = f"{record.members:,} {'member' if record.members == 1 else 'members'}"
        if not waiting:
            return format_html(
                "{}; their list went with the batch's callbacks (each acked or deleted). "
                "A member's page links its batch.",
                counted,
            )
        query = {"parents_of": waiting[0]}
        return format_html(
            '{}: <a href="{}">those not ended, or done and kept</a> · '
            '<a href="{}">those that died</a>',
            counted,
            console_url("admin:django_pgjobs_job_changelist", query=query),
            console_url("admin:django_pgjobs_deadjob_changelist", query=query),
        )

    @admin.display(description="callbacks")
    def callbacks(self, obj: Batch) -> SafeString:
        record = self._record(obj)
        if record is None:
            return mark_safe("-")
        fired = {callback.job_id for callback in record.fired}
        rows = []
        for callback in record.callbacks:
            if callback.job_state is None:  # gone: acked, or deleted unfired
                state = "fired, acked" if callback.job_id in fired else "not fired"
                rows.append(format_html("on {}: #{} {}", callback.fires_on, callback.job_id, state))
                continue
            table = "deadjob" if callback.job_state == "dead" else "job"
            link = console_url(f"admin:django_pgjobs_{table}_change", [callback.job_id])
            state = CALLBACK_STATES.get(callback.job_state, callback.job_state)
            rows.append(
                format_html(
                    "on {}: <a href='{}'>#{}</a> {}",
                    callback.fires_on,
                    link,
                    callback.job_id,
                    state,
                )
            )
        return format_html_join(mark_safe("<br>"), "{}", ((row,) for row in rows))

    @admin.display(description="created", ordering="created_at")
    def created(self, obj: Batch) -> SafeString:
        return relative_time(obj.created_at, getattr(obj, "created_in", None))

    @admin.display(description="ended", ordering="ended_at")
    def ended(self, obj: Batch) -> SafeString:
        return relative_time(obj.ended_at, getattr(obj, "ended_in", None))
