"""The worker registry: every runjobs process, live, stopped or gone, and what it runs."""

from __future__ import annotations

from typing import Any

from django.contrib import admin, messages
from django.contrib.admin.views.main import ChangeList
from django.db.models import (
    DurationField,
    ExpressionWrapper,
    F,
    QuerySet,
)
from django.db.models.functions import Now
from django.http import (
    HttpRequest,
    HttpResponse,
)
from django.urls import reverse
from django.utils.html import format_html, format_html_join
from django.utils.safestring import SafeString

from django_pgjobs.admin import audit
from django_pgjobs.admin.common import (
    ExactTimes,
    OfferedFiltersOnly,
    refuse_action,
    refuse_bad_params,
    refuse_unoffered_filters,
    relative_time,
)
from django_pgjobs.conf import pgjobs_settings
from django_pgjobs.managers.workers import unserved_queues
from django_pgjobs.models import Job, QueueControl, Worker
from django_pgjobs.states import WorkerAsk


@admin.register(Worker)
class WorkerAdmin(ExactTimes, OfferedFiltersOnly, admin.ModelAdmin):  # type: ignore[type-arg]
    """The workers as they last reported themselves: live, stopped, or gone (3 missed
    heartbeats by the database clock), and what each runs now. Its rows are read only;
    with the control_worker permission, an operator asks workers to go quiet (claim no
    more jobs), to stop after their running jobs, or to run again, which each obeys at
    its next heartbeat."""

    list_display = (
        "id",
        "liveness",
        "queues_served",
        "running_now",
        "succeeded",
        "failed",
        "seen",
        "started",
    )
    list_filter = ("host",)
    search_fields = ("id",)
    actions = ("go_quiet", "stop_after_running", "run_again")
    fields = (
        "id",
        "liveness",
        "running_now",
        "queues_served",
        "host",
        "pid",
        "concurrency",
        "version",
        "started_at",
        "last_seen_at",
        "stopped_at",
        "succeeded",
        "failed",
        "abandoned",
        "claims_from_floors",
        "asked_by",
        "asked_at",
    )
    readonly_fields = ("liveness", "running_now", "queues_served")
    ordering = ("-started_at", "id")
    change_list_template = "admin/django_pgjobs/worker_change_list.html"

    def has_add_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False  # workers register themselves

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False  # the sweeper prunes workers gone for a day

    def get_changelist(self, request: HttpRequest, **kwargs: Any) -> type[ChangeList]:
        return WorkerChangeList

    def get_queryset(self, request: HttpRequest) -> QuerySet[Worker]:
        seen = ExpressionWrapper(Now() - F("last_seen_at"), output_field=DurationField())
        started = ExpressionWrapper(F("started_at") - Now(), output_field=DurationField())
        asked = ExpressionWrapper(F("asked_at") - Now(), output_field=DurationField())
        queryset: QuerySet[Worker] = super().get_queryset(request)
        return queryset.annotate(seen_ago=seen, started_in=started, asked_in=asked)

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
        unserved = unserved_queues(QueueControl.objects.status(), Worker.objects.status())
        context = {"title": "Workers", "unserved": unserved}
        return super().changelist_view(request, {**(extra_context or {}), **context})

    @admin.display(description="state")
    def liveness(self, obj: Worker) -> SafeString:
        state = worker_state(obj)
        shown = format_html('<span class="pgjobs-worker-{}">{}</span>', state, state)
        if not obj.asked or state == "stopped":
            return shown
        return format_html(
            '{} · <span class="pgjobs-asked">asked to {} by {}</span> {}',
            shown,
            "go quiet" if obj.asked == WorkerAsk.QUIET else "stop",
            obj.asked_by or "?",
            relative_time(obj.asked_at, getattr(obj, "asked_in", None)),
        )

    def has_control_permission(self, request: HttpRequest) -> bool:
        """The actions that ask workers something need a permission of their own."""
        return request.user.has_perm(f"{self.opts.app_label}.control_worker")

    @admin.action(
        description="Go quiet: claim no more jobs (at their next heartbeat)",
        permissions=["control"],
    )
    def go_quiet(self, request: HttpRequest, queryset: QuerySet[Worker]) -> None:
        self._ask(request, queryset, WorkerAsk.QUIET, "go quiet", "Asked {count} to go quiet")

    @admin.action(
        description="Stop after their running jobs (at their next heartbeat)",
        permissions=["control"],
    )
    def stop_after_running(self, request: HttpRequest, queryset: QuerySet[Worker]) -> None:
        self._ask(request, queryset, WorkerAsk.STOP, "stop", "Asked {count} to stop")

    @admin.action(description="Run again: claim jobs as before", permissions=["control"])
    def run_again(self, request: HttpRequest, queryset: QuerySet[Worker]) -> None:
        self._ask(request, queryset, None, "run again", "Asked {count} to run again")

    def _ask(
        self,
        request: HttpRequest,
        queryset: QuerySet[Worker],
        asked: str | None,
        what: str,
        logged: str,
    ) -> None:
        ids = list(queryset.values_list("id", flat=True))
        done = Worker.objects.ask(ids, asked, by=request.user.get_username())
        audit.log_bulk(request, Worker, logged, done, len(done), ("worker", "workers"))
        heartbeat = pgjobs_settings.WORKER_HEARTBEAT
        text = (
            f"{len(done)} {'worker' if len(done) == 1 else 'workers'} asked to {what}: each "
            f"obeys at its next heartbeat (every {heartbeat:g} s)."
        )
        if len(ids) > len(done):
            text += (
                f" {len(ids) - len(done)} had stopped, or were asked to stop already: left alone."
            )
        self.message_user(request, text, messages.SUCCESS if done else messages.WARNING)

    @admin.display(description="queues")
    def queues_served(self, obj: Worker) -> str:
        return ", ".join(obj.queues or [])

    @admin.display(description="started", ordering="started_at")
    def started(self, obj: Worker) -> SafeString:
        return format_html(
            "{} (version {})",
            relative_time(obj.started_at, getattr(obj, "started_in", None)),
            obj.version,
        )

    @admin.display(description="running (of its slots)")
    def running_now(self, obj: Worker) -> SafeString:
        if worker_state(obj) != "live":
            return format_html("- (of {})", obj.concurrency)
        ids = getattr(obj, "running_jobs", None)
        if ids is None:  # its own page: its first running jobs, read for it alone
            ids = Job.objects.running_of_workers([obj.id]).get(obj.id, [])
        links = format_html_join(
            ", ",
            '<a href="{}">{}#{}</a>',
            (
                (reverse("admin:django_pgjobs_job_change", args=[job_id]), kind, job_id)
                for job_id, kind in ids
            ),
        )
        more_n = obj.running - len(ids)
        more = f" and {more_n} more" if more_n > 0 else ""
        hung = f"; {obj.abandoned} abandoned at their timeout still run" if obj.abandoned else ""
        if not ids:
            return format_html("{} of {}{}", obj.running, obj.concurrency, hung)
        return format_html("{} of {}: {}{}{}", obj.running, obj.concurrency, links, more, hung)

    @admin.display(description="last seen", ordering="-last_seen_at")
    def seen(self, obj: Worker) -> SafeString:
        seen_ago = getattr(obj, "seen_ago", None)
        return relative_time(obj.last_seen_at, -seen_ago if seen_ago is not None else None)


class WorkerChangeList(ChangeList):
    """The page's workers, each live one with its first running jobs, read for the
    whole page at once (not a scan of the running jobs per row)."""

    def get_results(self, request: HttpRequest) -> None:
        super().get_results(request)
        live = [worker for worker in self.result_list if worker_state(worker) == "live"]
        running = Job.objects.running_of_workers([worker.id for worker in live])
        for worker in live:
            worker.running_jobs = running.get(worker.id, [])


def worker_state(obj: Worker) -> str:
    """live, stopped, or gone: 3 heartbeats late, measured by the database (seen_ago)."""
    if obj.stopped_at is not None:
        return "stopped"
    seen_ago = getattr(obj, "seen_ago", None)
    if seen_ago is None or seen_ago.total_seconds() > 3 * obj.heartbeat_s:
        return "gone"
    return "live"
