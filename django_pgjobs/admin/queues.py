"""Queues (pause, resume, limit) and schedules (enable, disable, run now)."""

from __future__ import annotations

from typing import Any

from django import forms
from django.contrib import admin, messages
from django.contrib.admin import helpers
from django.contrib.admin.views.main import ChangeList
from django.db.models import Count as DbCount
from django.db.models import (
    DurationField,
    ExpressionWrapper,
    F,
    OuterRef,
    QuerySet,
    Subquery,
)
from django.db.models.functions import Coalesce, Now
from django.http import (
    HttpRequest,
    HttpResponse,
)
from django.utils.html import format_html
from django.utils.safestring import SafeString, mark_safe

from django_pgjobs import labels, options
from django_pgjobs.admin import audit
from django_pgjobs.admin.common import (
    OfferedFiltersOnly,
    jobs_word,
    refuse_action,
    refuse_bad_params,
    refuse_unoffered_filters,
    relative_time,
)
from django_pgjobs.admin.databases import ConsoleChangeList, InChosenDatabase
from django_pgjobs.admin.glance import glance_context, queue_statuses
from django_pgjobs.exceptions import InvalidJobOption
from django_pgjobs.models import Job, QueueControl, Schedule
from django_pgjobs.scheduler import Scheduler
from django_pgjobs.states import JobState


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


class QueueChangeList(ConsoleChangeList):
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
            for status in queue_statuses(request)
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
class QueueControlAdmin(InChosenDatabase, OfferedFiltersOnly, admin.ModelAdmin):  # type: ignore[type-arg]
    """Every queue with jobs, paused or limited: pause, resume, and its running limit."""

    form = QueueControlForm
    # In words: a healthy system's list was a column of red crosses ("not paused").
    list_display = ("name", "claims", "running_of_limit", "limit_source")
    list_filter = ("paused",)
    actions = ("pause", "resume")
    fields = ("name", "paused", "max_running", "limit_from_settings", "paused_at", "updated_at")
    change_list_template = "admin/django_pgjobs/glance_change_list.html"
    change_form_template = "admin/django_pgjobs/plain_change_form.html"
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

    def get_fields(self, request: HttpRequest, obj: Any = None) -> Any:
        if obj is None:  # a new queue: what can be set (the rest has database defaults)
            return ["name", "paused", "max_running"]
        return super().get_fields(request, obj)

    def get_readonly_fields(self, request: HttpRequest, obj: Any = None) -> list[str]:
        if obj is None:
            return []
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
        refused = (
            refuse_bad_params(request)
            or refuse_unoffered_filters(self, request)
            or refuse_action(self, request)
        )
        if refused is not None:
            return refused
        if request.method == "POST" and request.POST.get("action"):
            self._make_selected_rows(request)
        context = {
            **glance_context(request),
            "title": "Queues",
        }
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
        paused = ExpressionWrapper(F("paused_at") - Now(), output_field=DurationField())
        queryset: QuerySet[QueueControl] = super().get_queryset(request)
        return queryset.annotate(running=Coalesce(Subquery(running), 0), paused_in=paused)

    @admin.display(description="claims", ordering="paused")
    def claims(self, obj: QueueControl) -> SafeString:
        if not obj.paused:
            return mark_safe("open")
        return format_html(
            '<strong class="pgjobs-paused">paused</strong> {}',
            relative_time(obj.paused_at, getattr(obj, "paused_in", None)),
        )

    @admin.display(description="limit set in")
    def limit_source(self, obj: QueueControl) -> str:
        if obj.max_running is None:
            return "-"
        return "settings" if obj.limit_from_settings else "the console"

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
        for name in paused:
            audit.log_one(request, QueueControl, name, name, "Paused.")
        self.message_user(request, f"Paused: {', '.join(paused)}.", messages.SUCCESS)

    @admin.action(description="Resume (and wake the workers)", permissions=["change"])
    def resume(self, request: HttpRequest, queryset: QuerySet[QueueControl]) -> None:
        resumed = QueueControl.objects.resume(list(queryset.values_list("name", flat=True)))
        for name in resumed:
            audit.log_one(request, QueueControl, name, name, "Resumed.")
        text = f"Resumed: {', '.join(resumed)}." if resumed else "None of them was paused."
        self.message_user(request, text, messages.SUCCESS)


#: How a log entry counts schedules.
SCHEDULE_NOUN = ("schedule", "schedules")


@admin.register(Schedule)
class ScheduleAdmin(OfferedFiltersOnly, admin.ModelAdmin):  # type: ignore[type-arg]
    """Periodic jobs as declared in code and settings: when they run next, how the last
    run went; enable, disable, or run one now."""

    list_display = (
        "name",
        "kind",
        "when",
        "enabled",
        "next_run",
        "last_run",
        "last_job",
        "runs",
    )
    list_filter = ("enabled", "declared")
    change_list_template = "admin/django_pgjobs/plain_change_list.html"
    search_fields = ("name", "kind")
    actions = ("enable", "disable", "run_now")
    ordering = ("name",)

    def has_add_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False  # declared in code (@job(schedule=...)) or PGJOBS["SCHEDULES"]

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
        return super().changelist_view(request, {**(extra_context or {}), "title": "Schedules"})

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

    @admin.display(description="cron", ordering="cron")
    def when(self, obj: Schedule) -> str:
        return f"{obj.cron} ({obj.timezone})"

    @admin.display(description="next run", ordering="next_run_at")
    def next_run(self, obj: Schedule) -> SafeString:
        if not obj.enabled:
            return mark_safe("disabled")
        return relative_time(obj.next_run_at, getattr(obj, "next_in", None))

    @admin.display(description="last run", ordering="last_run_at")
    def last_run(self, obj: Schedule) -> SafeString:
        return relative_time(obj.last_run_at, getattr(obj, "last_in", None))

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
        names = list(queryset.values_list("name", flat=True))
        count = Scheduler().enable(names)
        audit.log_bulk(
            request, Schedule, "Enabled {count}", names, count, SCHEDULE_NOUN, chosen=len(names)
        )
        self.message_user(request, f"{count} enabled.", messages.SUCCESS)

    @admin.action(description="Disable", permissions=["change"])
    def disable(self, request: HttpRequest, queryset: QuerySet[Schedule]) -> None:
        names = list(queryset.values_list("name", flat=True))
        count = Schedule.objects.disable(names)
        audit.log_bulk(
            request, Schedule, "Disabled {count}", names, count, SCHEDULE_NOUN, chosen=len(names)
        )
        self.message_user(request, f"{count} disabled.", messages.SUCCESS)

    @admin.action(description="Run now (one job each; the next tick stays)", permissions=["change"])
    def run_now(self, request: HttpRequest, queryset: QuerySet[Schedule]) -> None:
        names = list(queryset.values_list("name", flat=True))
        job_ids = Schedule.objects.run_now(names)
        audit.log_bulk(
            request,
            Schedule,
            "Ran {count} now (jobs " + ", ".join(f"#{job_id}" for job_id in job_ids) + ")",
            names,
            len(job_ids),
            SCHEDULE_NOUN,
            chosen=len(names),
        )
        self.message_user(
            request,
            f"{len(job_ids)} {jobs_word(len(job_ids))} enqueued: "
            + ", ".join(f"#{job_id}" for job_id in job_ids),
            messages.SUCCESS,
        )
