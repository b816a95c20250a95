"""The worker registry: every runjobs process, live, stopped or gone, and what it runs."""

from __future__ import annotations

from typing import Any

from django.contrib import admin, messages
from django.contrib.admin.utils import quote, unquote
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
    HttpResponseBadRequest,
    HttpResponseRedirect,
)
from django.shortcuts import get_object_or_404
from django.urls import URLPattern, path
from django.utils.dateparse import parse_datetime
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
from django_pgjobs.admin.databases import (
    ConsoleChangeList,
    InChosenDatabase,
    console_url,
    current,
)
from django_pgjobs.conf import pgjobs_settings
from django_pgjobs.managers.workers import paused_queues, queue_list, unserved_queues
from django_pgjobs.models import Job, QueueControl, Worker
from django_pgjobs.states import WorkerAsk


@admin.register(Worker)
class WorkerAdmin(InChosenDatabase, ExactTimes, OfferedFiltersOnly, admin.ModelAdmin):  # type: ignore[type-arg]
    """The workers as they last reported themselves: live, stopped, or gone (3 missed
    heartbeats by the database clock), and what each runs now. Its rows are read only;
    with the control_worker permission, an operator asks workers to go quiet (claim no
    more jobs), to stop after their running jobs, or to run again, and, on a worker's
    page, pauses one of its queues on it alone (Oban's per-node pause); each obeys at
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
    change_form_template = "admin/django_pgjobs/worker_change_form.html"

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

    def get_urls(self) -> list[URLPattern]:
        own = [
            path(
                "<path:object_id>/queues/",
                self.admin_site.admin_view(self.queue_here_view),
                name="django_pgjobs_worker_queues",
            )
        ]
        return own + super().get_urls()

    def change_view(
        self,
        request: HttpRequest,
        object_id: str,
        form_url: str = "",
        extra_context: dict[str, Any] | None = None,
    ) -> HttpResponse:
        context = dict(extra_context or {})
        status = Worker.objects.status_of(unquote(object_id))  # the admin's quoted pk
        if status is not None:
            may = self.has_control_permission(request) and status.stopped_at is None
            context["queues_here"] = [
                queue_here(status.paused_queues, queue, may) for queue in status.queues
            ]
            context["queues_url"] = console_url(
                "admin:django_pgjobs_worker_queues", [quote(status.id)]
            )
        return super().change_view(request, object_id, form_url, context)

    def queue_here_view(self, request: HttpRequest, object_id: str) -> HttpResponse:
        """Pause one of a worker's queues on it alone, or resume it there: POST only,
        with the control_worker permission, logged."""
        page = console_url("admin:django_pgjobs_worker_change", [object_id])
        if request.method != "POST":
            return HttpResponseRedirect(page)
        worker = get_object_or_404(Worker.objects.using(current()), pk=unquote(object_id))
        if not self.has_control_permission(request):
            self.message_user(
                request,
                f"Refused: you may not pause or resume queues on worker {worker.id}; "
                "that needs the permission to control workers.",
                messages.ERROR,
            )
            return HttpResponseRedirect(page)
        queue, paused = request.POST.get("queue", ""), request.POST.get("paused")
        if queue not in queue_list(worker.queues) or paused not in ("0", "1"):
            return HttpResponseBadRequest(
                "Give one of the worker's queues (queue) and paused=1 or paused=0.",
                content_type="text/plain",
            )
        pause = paused == "1"
        who = request.user.get_username()
        done = Worker.objects.pause_on([worker.id], queue, paused=pause, by=who)
        what = "paused" if pause else "resumed"
        if not done:
            self.message_user(
                request,
                f"Queue {queue} was already {what} on worker {worker.id}, or the worker "
                "has stopped: nothing was changed.",
                messages.WARNING,
            )
            return HttpResponseRedirect(page)
        audit.log_one(
            request, Worker, worker.id, worker.id, f"{what.capitalize()} queue {queue} here."
        )
        heartbeat = pgjobs_settings.WORKER_HEARTBEAT
        self.message_user(
            request,
            f"Queue {queue} {what} on worker {worker.id} alone: it obeys at its next "
            f"heartbeat (every {heartbeat:g} s)"
            + ("; the other workers still claim its jobs." if pause else "."),
            messages.SUCCESS,
        )
        return HttpResponseRedirect(page)

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
    def queues_served(self, obj: Worker) -> SafeString:
        paused = paused_queues(obj.paused_queues)
        return format_html_join(
            ", ",
            "{}{}",
            (
                (queue, " (paused here)" if queue in paused else "")
                for queue in queue_list(obj.queues)
            ),
        )

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
                (console_url("admin:django_pgjobs_job_change", [job_id]), kind, job_id)
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


class WorkerChangeList(ConsoleChangeList):
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


def queue_here(paused: dict[str, dict[str, str]], queue: str, may_control: bool) -> dict[str, Any]:
    """A row of a worker's page's queues: claimed from here, or paused here by whom and
    since when, with the button that turns it (for those who may)."""
    how = paused.get(queue)
    if how is None:
        state: SafeString | str = "claiming"
    else:
        try:
            at = parse_datetime(how.get("at", "") or "")
        except ValueError:  # a value edited by hand that looks like a date and is none
            at = None
        state = format_html(
            "paused here by {} since {}",
            how.get("by") or "?",
            relative_time(at, None) if at else "?",
        )
    return {
        "queue": queue,
        "state": state,
        "paused": how is not None,
        "may": may_control,
        "to": "0" if how is not None else "1",
        "button": "Resume here" if how is not None else "Pause here",
    }
