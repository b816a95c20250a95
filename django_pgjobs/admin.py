"""The operators' view: jobs and dead letters with counts at a glance, queues (pause,
resume, limit) and schedules (enable, disable, run now), all with safe actions.

Nothing here runs queue SQL: actions call the models' managers. Jobs are never added or
edited by hand; viewers see everything, actions need the model's change (or delete)
permission, and every action says what it did.
"""

from __future__ import annotations

import json
from typing import Any

from django import forms
from django.contrib import admin, messages
from django.contrib.admin import helpers
from django.contrib.admin.views.main import ChangeList
from django.core.paginator import Paginator
from django.db.models import Count as DbCount
from django.db.models import (
    DurationField,
    ExpressionWrapper,
    F,
    OuterRef,
    Q,
    QuerySet,
    Subquery,
)
from django.db.models.functions import Coalesce, Now
from django.http import HttpRequest, HttpResponse
from django.template.response import TemplateResponse
from django.utils.functional import cached_property
from django.utils.html import format_html, format_html_join
from django.utils.safestring import SafeString, mark_safe
from django.utils.text import Truncator

from django_pgjobs import labels, options, registry
from django_pgjobs.exceptions import InvalidJobOption
from django_pgjobs.models import DeadJob, Job, JobStats, QueueControl, Schedule
from django_pgjobs.records import QueueStatus
from django_pgjobs.scheduler import Scheduler
from django_pgjobs.states import JobState


def pretty_json(value: Any) -> SafeString:
    return format_html("<pre>{}</pre>", json.dumps(value, indent=2, ensure_ascii=False))


def error_history(errors: list[dict[str, Any]] | None) -> SafeString:
    if not errors:
        return mark_safe("<p>No failed attempt.</p>")
    rows = format_html_join(
        "",
        "<tr><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td><pre>{}</pre></td></tr>",
        (
            (
                entry.get("attempt"),
                entry.get("at"),
                entry.get("worker_id") or "",
                entry.get("error"),
                entry.get("traceback") or "",
            )
            for entry in errors
        ),
    )
    return format_html(
        "<table><thead><tr><th>attempt</th><th>at</th><th>worker</th><th>error</th>"
        "<th>traceback</th></tr></thead><tbody>{}</tbody></table>",
        rows,
    )


#: The largest job id (bigint): a search for a larger number finds no id.
JOB_ID_MAX = 2**63 - 1


class CappedCountPaginator(Paginator):  # type: ignore[type-arg]
    """A paginator that never counts millions of rows: past a cap, it estimates."""

    @cached_property
    def count(self) -> int:
        return Job.objects.capped_count(self.object_list)  # type: ignore[arg-type]


class QueueFilter(admin.SimpleListFilter):
    """Queues present in the table, found by index skip scans rather than DISTINCT."""

    title = "queue"
    parameter_name = "queue"
    dead = False

    def lookups(self, request: HttpRequest, model_admin: Any) -> list[tuple[str, str]]:
        queues = Job.objects.queue_names(dead=self.dead)
        return [(queue, queue) for queue in queues]

    def queryset(self, request: HttpRequest, queryset: QuerySet[Any]) -> QuerySet[Any]:
        return queryset.filter(queue=self.value()) if self.value() else queryset


class DeadQueueFilter(QueueFilter):
    dead = True


class KindFilter(admin.SimpleListFilter):
    """Kinds this process knows (the registry), not a DISTINCT over the table."""

    title = "kind"
    parameter_name = "kind"

    def lookups(self, request: HttpRequest, model_admin: Any) -> list[tuple[str, str]]:
        return [(kind, kind) for kind in registry.registered_kinds()]

    def queryset(self, request: HttpRequest, queryset: QuerySet[Any]) -> QuerySet[Any]:
        return queryset.filter(kind=self.value()) if self.value() else queryset


class ReadinessFilter(admin.SimpleListFilter):
    """Pending jobs that may run now, against those scheduled later (database clock)."""

    title = "readiness"
    parameter_name = "readiness"

    def lookups(self, request: HttpRequest, model_admin: Any) -> list[tuple[str, str]]:
        return [("runnable", "runnable now"), ("scheduled", "scheduled later")]

    def queryset(self, request: HttpRequest, queryset: QuerySet[Any]) -> QuerySet[Any]:
        pending = Q(state=JobState.PENDING)
        if self.value() == "runnable":
            return queryset.filter(pending, run_after__lte=Now())
        if self.value() == "scheduled":
            return queryset.filter(pending, run_after__gt=Now())
        return queryset


class ReadOnlyJobAdmin(admin.ModelAdmin):  # type: ignore[type-arg]
    """What both tables share: read-only detail pages, capped counts, plain search."""

    paginator = CappedCountPaginator
    show_full_result_count = False
    list_per_page = 50
    ordering = ("-id",)
    search_help_text = "A job id, a kind, or a key."
    change_list_template = "admin/django_pgjobs/change_list.html"

    def has_add_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        # A job's page is for reading; "change" is what the list's actions need.
        if obj is not None:
            return False
        return super().has_change_permission(request)

    def get_readonly_fields(self, request: HttpRequest, obj: Any = None) -> list[str]:
        return [field.name for field in self.model._meta.fields] + list(self.extra_readonly)

    extra_readonly: tuple[str, ...] = ("pretty_payload", "error_table")
    claim_fields = ("claimed_by", "claimed_at", "claimed_until", "started_at", "worker_id")
    trigger_fields = ("rerun_after", "rerun_payload", "rerun_expires_at")

    def get_search_results(
        self, request: HttpRequest, queryset: QuerySet[Any], search_term: str
    ) -> tuple[QuerySet[Any], bool]:
        term = search_term.strip()
        if not term:
            return queryset, False
        match = Q(kind=term) | Q(key=term)
        if term.isascii() and term.isdigit() and int(term) <= JOB_ID_MAX:
            match |= Q(id=int(term))
        return queryset.filter(match), False

    def save_model(self, *args: Any, **kwargs: Any) -> None:
        raise PermissionError("Jobs are not edited by hand.")

    @admin.display(description="payload")
    def pretty_payload(self, obj: Any) -> SafeString:
        return pretty_json(obj.payload)

    @admin.display(description="errors")
    def error_table(self, obj: Any) -> SafeString:
        return error_history(obj.errors)

    @admin.display(description="attempts")
    def attempts_of(self, obj: Any) -> str:
        return f"{obj.attempts}/{obj.max_attempts}"

    def changelist_view(
        self, request: HttpRequest, extra_context: dict[str, Any] | None = None
    ) -> HttpResponse:
        context = {"glance": glance(), "chart": throughput_chart()}
        return super().changelist_view(request, {**(extra_context or {}), **context})


@admin.register(Job)
class JobAdmin(ReadOnlyJobAdmin):
    list_display = (
        "id",
        "kind",
        "queue",
        "key",
        "state",
        "priority",
        "attempts_of",
        "runs",
        "claimed_until",
        "worker_id",
    )
    list_filter = ("state", ReadinessFilter, QueueFilter, KindFilter)
    extra_readonly = ("pretty_payload", "pretty_result", "error_table")
    actions = ("run_now", "cancel")
    fieldsets = (
        (None, {"fields": ("id", "kind", "queue", "key", "state", "priority")}),
        (
            "Schedule and limits",
            {
                "fields": (
                    "run_after",
                    "attempts",
                    "max_attempts",
                    "lease_s",
                    "expires_at",
                    "result_ttl_s",
                    "purge_at",
                    "created_at",
                    "finished_at",
                )
            },
        ),
        ("Current claim", {"fields": ReadOnlyJobAdmin.claim_fields}),
        ("Payload and result", {"fields": ("pretty_payload", "pretty_result")}),
        ("Errors", {"fields": ("last_error", "error_table")}),
        ("Trigger waiting for this run to end", {"fields": ReadOnlyJobAdmin.trigger_fields}),
    )

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False  # a live job is cancelled (to the dead letters), not deleted

    def get_queryset(self, request: HttpRequest) -> QuerySet[Job]:
        delta = ExpressionWrapper(F("run_after") - Now(), output_field=DurationField())
        queryset: QuerySet[Job] = super().get_queryset(request)
        return queryset.annotate(runs_in=delta)

    @admin.display(description="run after", ordering="run_after")
    def runs(self, obj: Job) -> str:
        return labels.ago(getattr(obj, "runs_in", None))

    @admin.display(description="result")
    def pretty_result(self, obj: Job) -> SafeString:
        return pretty_json(obj.result)

    @admin.action(description="Run now (pending jobs)", permissions=["change"])
    def run_now(self, request: HttpRequest, queryset: QuerySet[Job]) -> None:
        moved = Job.objects.run_now(list(queryset.values_list("id", flat=True)))
        self.message_user(request, f"{moved} {_jobs(moved)} set to run now.", messages.SUCCESS)

    @admin.action(description="Cancel (dead-letter as cancelled)", permissions=["change"])
    def cancel(self, request: HttpRequest, queryset: QuerySet[Job]) -> HttpResponse | None:
        ids = list(queryset.values_list("id", flat=True))
        if request.POST.get("confirmed") != "yes":
            return TemplateResponse(
                request,
                "admin/django_pgjobs/cancel_confirmation.html",
                {
                    **self.admin_site.each_context(request),
                    "title": "Cancel jobs?",
                    "opts": self.model._meta,
                    "jobs": queryset.order_by("id")[:100],
                    "count": len(ids),
                    "ids": ids,
                    "action_checkbox_name": helpers.ACTION_CHECKBOX_NAME,
                },
            )
        cancelled = Job.objects.cancel_many(ids)
        skipped = len(ids) - cancelled
        message = f"{cancelled} {_jobs(cancelled)} cancelled"
        if skipped:
            message += f", {skipped} skipped (already finished)"
        self.message_user(request, message + ".", messages.SUCCESS)
        return None


@admin.register(DeadJob)
class DeadJobAdmin(ReadOnlyJobAdmin):
    list_display = (
        "id",
        "kind",
        "queue",
        "key",
        "reason",
        "attempts",
        "died_at",
        "last_error_line",
    )
    list_filter = ("reason", DeadQueueFilter, KindFilter)
    actions = ("requeue", "delete_selected")
    fieldsets = (
        (None, {"fields": ("id", "kind", "queue", "key", "reason", "died_at", "priority")}),
        (
            "History",
            {
                "fields": (
                    "attempts",
                    "max_attempts",
                    "lease_s",
                    "run_after",
                    "expires_at",
                    "created_at",
                    *ReadOnlyJobAdmin.claim_fields,
                )
            },
        ),
        ("Payload", {"fields": ("pretty_payload",)}),
        ("Errors", {"fields": ("last_error", "error_table")}),
    )
    ordering = ("-died_at", "-id")  # type: ignore[assignment]

    @admin.display(description="last error")
    def last_error_line(self, obj: DeadJob) -> str:
        first = (obj.last_error or "").strip().splitlines()
        return Truncator(first[0]).chars(90) if first else ""

    @admin.action(description="Requeue (back to pending, attempts reset)", permissions=["change"])
    def requeue(self, request: HttpRequest, queryset: QuerySet[DeadJob]) -> None:
        result = DeadJob.objects.requeue(list(queryset.values_list("id", flat=True)))
        message = f"{result.requeued} {_jobs(result.requeued)} requeued"
        if result.merged:
            message += f", {result.merged} merged into a live job"
        self.message_user(request, message + ".", messages.SUCCESS)


class QueueControlForm(forms.ModelForm):  # type: ignore[type-arg]
    """A queue's controls; a new queue's name is checked as an enqueue would check it."""

    class Meta:
        model = QueueControl
        fields = ("name", "paused", "max_running")

    def clean_name(self) -> str:
        try:
            return options.validate_queue_name(self.cleaned_data["name"])
        except InvalidJobOption as error:
            raise forms.ValidationError(str(error)) from None


class QueueChangeList(ChangeList):
    """The queues that have a row, and after them those that only have jobs, dead letters
    or settings: listed without making their rows, so that a GET writes nothing."""

    def get_results(self, request: HttpRequest) -> None:
        super().get_results(request)
        if self.get_filters_params() or self.page_num > 1:
            return
        with_rows = set(self.root_queryset.values_list("name", flat=True))
        term = self.query.strip()
        unlisted = [
            status
            for status in QueueControl.objects.status()
            if status.queue not in with_rows and term in status.queue
        ]
        virtual = []
        for status in unlisted:
            queue = QueueControl(name=status.queue, paused=False, limit_from_settings=False)
            queue.running = status.running.value  # type: ignore[attr-defined]
            virtual.append(queue)
        self.result_list = [*self.result_list, *virtual]
        self.result_count += len(unlisted)
        self.full_result_count = (self.full_result_count or 0) + len(unlisted)


@admin.register(QueueControl)
class QueueControlAdmin(admin.ModelAdmin):  # type: ignore[type-arg]
    """Every queue with jobs, paused or limited: pause, resume, and its running limit."""

    form = QueueControlForm
    list_display = ("name", "paused", "running_of_limit", "limit_from_settings", "paused_at")
    list_filter = ("paused",)
    actions = ("pause", "resume")
    fields = ("name", "paused", "max_running", "limit_from_settings", "paused_at", "updated_at")
    change_list_template = "admin/django_pgjobs/change_list.html"
    search_fields = ("name",)

    def get_changelist(self, request: HttpRequest, **kwargs: Any) -> type[ChangeList]:
        return QueueChangeList

    def get_object(
        self, request: HttpRequest, object_id: str, from_field: str | None = None
    ) -> QueueControl | None:
        """A queue's row, or an unsaved one for a valid name without a row yet (its page
        can then set a limit or pause it, which makes the row)."""
        found: QueueControl | None = super().get_object(request, object_id, from_field)
        if found is not None or from_field is not None:
            return found
        try:
            name = options.validate_queue_name(object_id)
        except InvalidJobOption:
            return None
        return QueueControl(name=name, paused=False, limit_from_settings=False)

    def get_readonly_fields(self, request: HttpRequest, obj: Any = None) -> list[str]:
        readonly = ["limit_from_settings", "paused_at", "updated_at"]
        if obj is not None:
            readonly.append("name")
            if obj.limit_from_settings:
                readonly.append("max_running")
        return readonly

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False  # a row without pause or limit is a queue left alone: nothing to delete

    def changelist_view(
        self, request: HttpRequest, extra_context: dict[str, Any] | None = None
    ) -> HttpResponse:
        if request.method == "POST" and request.POST.get("action"):
            self._make_selected_rows(request)
        context = {"glance": glance(), "chart": throughput_chart()}
        return super().changelist_view(request, {**(extra_context or {}), **context})

    def _make_selected_rows(self, request: HttpRequest) -> None:
        """Before an action, give the selected queues that have none a row, so that the
        action finds them (only for those allowed to act)."""
        if not self.has_change_permission(request):
            return
        names = []
        for name in request.POST.getlist(helpers.ACTION_CHECKBOX_NAME):
            try:
                names.append(options.validate_queue_name(name))
            except InvalidJobOption:
                continue
        QueueControl.objects.ensure(names)

    def get_queryset(self, request: HttpRequest) -> QuerySet[QueueControl]:
        running = (
            Job.objects.filter(queue=OuterRef("name"), state=JobState.RUNNING)
            .order_by()
            .values("queue")
            .annotate(count=DbCount("id"))
            .values("count")
        )
        queryset: QuerySet[QueueControl] = super().get_queryset(request)
        return queryset.annotate(running=Coalesce(Subquery(running), 0))

    @admin.display(description="running (of limit)")
    def running_of_limit(self, obj: QueueControl) -> str:
        return labels.running_of_limit(getattr(obj, "running", 0), obj.max_running)

    def save_model(self, request: HttpRequest, obj: QueueControl, form: Any, change: bool) -> None:
        # Through the manager, so that a resume or a new limit wakes the workers.
        QueueControl.objects.ensure([obj.name])
        if "paused" in form.changed_data or not change:
            if obj.paused:
                QueueControl.objects.pause(obj.name)
            else:
                QueueControl.objects.resume(obj.name)
        if "max_running" in form.changed_data and not obj.limit_from_settings:
            QueueControl.objects.set_limit(obj.name, obj.max_running)
        obj.refresh_from_db()

    @admin.action(description="Pause (no worker claims their jobs)", permissions=["change"])
    def pause(self, request: HttpRequest, queryset: QuerySet[QueueControl]) -> None:
        paused = QueueControl.objects.pause(list(queryset.values_list("name", flat=True)))
        self.message_user(request, f"Paused: {', '.join(paused)}.", messages.SUCCESS)

    @admin.action(description="Resume (and wake the workers)", permissions=["change"])
    def resume(self, request: HttpRequest, queryset: QuerySet[QueueControl]) -> None:
        resumed = QueueControl.objects.resume(list(queryset.values_list("name", flat=True)))
        text = f"Resumed: {', '.join(resumed)}." if resumed else "None of them was paused."
        self.message_user(request, text, messages.SUCCESS)


@admin.register(Schedule)
class ScheduleAdmin(admin.ModelAdmin):  # type: ignore[type-arg]
    """Periodic jobs as declared in code and settings: when they run next, how the last
    run went; enable, disable, or run one now."""

    list_display = (
        "name",
        "kind",
        "cron",
        "timezone",
        "enabled",
        "next_run",
        "last_run",
        "last_job",
        "runs",
        "declared",
    )
    list_filter = ("enabled", "declared")
    search_fields = ("name", "kind")
    actions = ("enable", "disable", "run_now")
    ordering = ("name",)

    def has_add_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False  # declared in code (@job(schedule=...)) or PGJOBS["SCHEDULES"]

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False  # a schedule no longer declared is disabled and kept, with its history

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        if obj is not None:
            return False  # read-only page; the actions change it
        return super().has_change_permission(request)

    def get_readonly_fields(self, request: HttpRequest, obj: Any = None) -> list[str]:
        return [field.name for field in Schedule._meta.fields]

    def get_queryset(self, request: HttpRequest) -> QuerySet[Schedule]:
        delta = ExpressionWrapper(F("next_run_at") - Now(), output_field=DurationField())
        last = ExpressionWrapper(F("last_run_at") - Now(), output_field=DurationField())
        queryset: QuerySet[Schedule] = super().get_queryset(request)
        return queryset.annotate(next_in=delta, last_in=last)

    @admin.display(description="next run", ordering="next_run_at")
    def next_run(self, obj: Schedule) -> str:
        return labels.ago(getattr(obj, "next_in", None)) if obj.enabled else "disabled"

    @admin.display(description="last run", ordering="last_run_at")
    def last_run(self, obj: Schedule) -> str:
        return labels.ago(getattr(obj, "last_in", None))

    @admin.display(description="last job")
    def last_job(self, obj: Schedule) -> str:
        if obj.last_job_id is None:
            return "-"
        record = Job.objects.get_job(obj.last_job_id)
        if record is None:
            return f"#{obj.last_job_id} (finished)"
        return f"#{obj.last_job_id} ({'dead' if record.is_dead else record.state})"

    @admin.action(description="Enable (from the next tick on)", permissions=["change"])
    def enable(self, request: HttpRequest, queryset: QuerySet[Schedule]) -> None:
        count = Scheduler().enable(list(queryset.values_list("name", flat=True)))
        self.message_user(request, f"{count} enabled.", messages.SUCCESS)

    @admin.action(description="Disable", permissions=["change"])
    def disable(self, request: HttpRequest, queryset: QuerySet[Schedule]) -> None:
        count = Schedule.objects.disable(list(queryset.values_list("name", flat=True)))
        self.message_user(request, f"{count} disabled.", messages.SUCCESS)

    @admin.action(description="Run now (one job each; the next tick stays)", permissions=["change"])
    def run_now(self, request: HttpRequest, queryset: QuerySet[Schedule]) -> None:
        job_ids = Schedule.objects.run_now(list(queryset.values_list("name", flat=True)))
        self.message_user(
            request,
            f"{len(job_ids)} {_jobs(len(job_ids))} enqueued: "
            + ", ".join(f"#{job_id}" for job_id in job_ids),
            messages.SUCCESS,
        )


def glance() -> list[dict[str, Any]]:
    """Every queue at a glance, as the change lists show it above themselves."""
    return [glance_row(status) for status in QueueControl.objects.status()]


def glance_row(status: QueueStatus) -> dict[str, Any]:
    return {
        "queue": status.queue,
        "runnable": labels.count(status.runnable),
        "scheduled": labels.count(status.scheduled),
        "running_of_limit": labels.running_of_limit(status.running, status.max_running),
        "dead": labels.count(status.dead),
        "oldest_runnable": labels.age(status.oldest_runnable_s),
        "paused": status.paused,
        "status": status,
    }


def throughput_chart(minutes: int = 60) -> SafeString:
    """Jobs finished and failed per minute over the last hour, as a small SVG."""
    series = JobStats.objects.throughput(minutes)
    peak = max([max(point.succeeded, point.failed) for point in series] + [1])
    width, height, bar = 4, 40, 2
    bars = []
    for index, point in enumerate(series):
        x = index * width
        ok = point.succeeded / peak * height
        bad = point.failed / peak * height
        bars.append(
            f'<rect x="{x}" y="{height - ok:.1f}" width="{bar}" height="{ok:.1f}" '
            f'fill="#3a7"><title>{point.minute:%H:%M} {point.succeeded} done</title></rect>'
            f'<rect x="{x + bar}" y="{height - bad:.1f}" width="{bar}" height="{bad:.1f}" '
            f'fill="#c33"><title>{point.minute:%H:%M} {point.failed} failed</title></rect>'
        )
    total_ok = sum(point.succeeded for point in series)
    total_bad = sum(point.failed for point in series)
    return mark_safe(
        f'<svg class="pgjobs-chart" width="{minutes * width}" height="{height}" '
        f'role="img" aria-label="jobs per minute">{"".join(bars)}</svg>'
        f'<span class="pgjobs-chart-legend">last {minutes} min: {total_ok} done, '
        f"{total_bad} failed</span>"
    )


def _jobs(count: int) -> str:
    return "job" if count == 1 else "jobs"
