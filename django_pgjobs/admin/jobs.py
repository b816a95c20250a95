"""Jobs: search along the indexes, filters, actions, and object pages led by what went
wrong, with their buttons; what they share with the dead letters (`letters`)."""

from __future__ import annotations

from typing import Any

from django.contrib import admin, messages
from django.contrib.admin import helpers
from django.contrib.admin.views.main import ChangeList
from django.db.models import (
    DurationField,
    ExpressionWrapper,
    F,
    Q,
    QuerySet,
)
from django.db.models.functions import Now
from django.http import (
    HttpRequest,
    HttpResponse,
    HttpResponseRedirect,
)
from django.shortcuts import get_object_or_404
from django.urls import URLPattern, path
from django.utils.html import format_html, format_html_join
from django.utils.safestring import SafeString, mark_safe
from django.utils.translation import gettext

from django_pgjobs import labels
from django_pgjobs.admin import audit
from django_pgjobs.admin.common import (
    JOB_ID_MAX,
    CappedCountPaginator,
    ExactTimes,
    JobChangeList,
    OfferedFiltersOnly,
    all_matching,
    chosen_batches,
    confirmation,
    confirmed,
    error_history,
    exact_time,
    job_id_of,
    jobs_word,
    latest_traceback,
    pretty_json,
    progress_bar,
    progress_words,
    refuse_action,
    refuse_bad_params,
    refuse_unoffered_filters,
    relative_time,
)
from django_pgjobs.admin.databases import InChosenDatabase, console_url, current
from django_pgjobs.admin.filters import (
    KindFilter,
    QueueFilter,
    ReadinessFilter,
)
from django_pgjobs.admin.glance import glance_context
from django_pgjobs.admin.timeline import timeline
from django_pgjobs.admin.workflow import ChildrenOfFilter, ParentsOfFilter, WorkflowSection
from django_pgjobs.models import DeadJob, Job
from django_pgjobs.models import Worker as WorkerRow
from django_pgjobs.states import JobState

#: The longest search term worth sending: no kind, key or id is longer.
SEARCH_MAX_CHARS = 300


class ReadOnlyJobAdmin(
    InChosenDatabase,
    ExactTimes,
    OfferedFiltersOnly,
    WorkflowSection,
    admin.ModelAdmin,  # type: ignore[type-arg]
):
    """What both tables share: read-only detail pages led by what went wrong, action
    buttons on them, capped counts, a search along the indexes."""

    paginator = CappedCountPaginator
    show_full_result_count = False
    list_per_page = 50
    ordering = ("-id",)
    # The box shows when search_fields is set; get_search_results does the matching.
    search_fields = ("kind",)
    search_help_text = "A job id (exact), or the start of a kind or a key."
    change_list_template = "admin/django_pgjobs/job_change_list.html"
    change_form_template = "admin/django_pgjobs/job_change_form.html"
    #: The object page's buttons: (name, label, what it does) in the order shown.
    buttons: tuple[tuple[str, str, str], ...] = ()

    def has_add_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def get_changelist(self, request: HttpRequest, **kwargs: Any) -> type[ChangeList]:
        return JobChangeList

    def action_checkbox(self, obj: Any) -> SafeString:
        """The row's checkbox, as Django's widget writes it, without a widget per row."""
        label = format_html(gettext("Select this object for an action - {}"), str(obj))
        return format_html(
            '<input type="checkbox" name="{}" value="{}" class="action-select" aria-label="{}">',
            helpers.ACTION_CHECKBOX_NAME,
            obj.pk,
            label,
        )

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        # A job's page is for reading; "change" is what the actions and buttons need.
        if obj is not None:
            return False
        return super().has_change_permission(request)

    def may_act(self, request: HttpRequest) -> bool:
        return super().has_change_permission(request)

    def get_readonly_fields(self, request: HttpRequest, obj: Any = None) -> list[str]:
        return [
            *super().get_readonly_fields(request, obj),
            *(field.name for field in self.model._meta.fields),
            *self.extra_readonly,
        ]

    def get_fieldsets(self, request: HttpRequest, obj: Any = None) -> Any:
        """The page's fieldsets without the rows that would read "-" on a job that never
        failed or reported progress."""
        fieldsets = super().get_fieldsets(request, obj)
        if obj is None:
            return fieldsets
        empty = set()
        if not obj.last_error:
            empty.add("last_error")
        if not obj.errors:
            empty |= {"traceback", "error_table"}
        if not obj.progress:
            empty.add("progress_wide")
        return [
            (name, {**options, "fields": [f for f in options["fields"] if f not in empty]})
            for name, options in fieldsets
        ]

    extra_readonly: tuple[str, ...] = (
        "workflow",
        "pretty_payload",
        "error_table",
        "traceback",
        "attempts_of",
        "lease",
        "timeout",
        "state_line",
        "progress_wide",
        "timeline_of",
    )
    claim_fields = ("claimed_by", "claimed_at", "claimed_until", "started_at", "worker_id")
    trigger_fields = ("rerun_after", "rerun_payload", "rerun_expires_at")

    def get_search_results(
        self, request: HttpRequest, queryset: QuerySet[Any], search_term: str
    ) -> tuple[QuerySet[Any], bool]:
        term = search_term.strip()
        if not term:
            return queryset, False
        if len(term) > SEARCH_MAX_CHARS:
            return queryset.none(), False
        match = Q(kind__startswith=term) | Q(key__startswith=term)
        if term.isascii() and term.isdigit() and int(term) <= JOB_ID_MAX:
            match |= Q(id=int(term))
        return queryset.filter(match), False

    def changelist_view(
        self, request: HttpRequest, extra_context: dict[str, Any] | None = None
    ) -> HttpResponse:
        refused = (
            refuse_bad_params(request)
            or refuse_unoffered_filters(self, request)
            or self.refuse_forged_action(request)
        )
        if refused is not None:
            return refused
        context = {
            **glance_context(request),
            "title": self.model._meta.verbose_name_plural.capitalize(),
        }
        return super().changelist_view(request, {**(extra_context or {}), **context})

    def refuse_forged_action(self, request: HttpRequest) -> HttpResponse | None:
        """An action this user may not run, or on rows that are no job ids: say it was
        refused, and change nothing."""
        refused = refuse_action(self, request)
        if refused is not None or request.method != "POST" or not request.POST.get("action"):
            return refused
        for value in request.POST.getlist(helpers.ACTION_CHECKBOX_NAME):
            if not job_id_of(value):
                self.message_user(
                    request,
                    f"Refused: {value[:40]!r} is not a job id; nothing was changed.",
                    messages.ERROR,
                )
                return HttpResponseRedirect(request.get_full_path())
        return None

    def change_view(
        self,
        request: HttpRequest,
        object_id: str,
        form_url: str = "",
        extra_context: dict[str, Any] | None = None,
    ) -> HttpResponse:
        obj = self.get_object(request, object_id)
        if (
            obj is None
            and request.method == "GET"
            and job_id_of(object_id)
            and self.has_view_or_change_permission(request)  # whether it exists is theirs
        ):
            return self.not_here(request, job_id_of(object_id))
        buttons = []
        if obj is not None and self.may_act(request):
            info = self.model._meta.app_label, self.model._meta.model_name
            buttons = [
                {
                    "name": name,
                    "label": label,
                    "help": help_text,
                    "url": console_url("admin:{}_{}_act".format(*info), [obj.pk, name]),
                }
                for name, label, help_text in self.buttons
                if self.button_applies(name, obj)
                and (name != "delete" or self.has_delete_permission(request))
            ]
        # The page's title is the job's name, once (Django would repeat it as a subtitle).
        context = {
            "buttons": buttons,
            "title": str(obj) if obj is not None else "",
            "subtitle": None,
        }
        return super().change_view(
            request, object_id, form_url, {**(extra_context or {}), **context}
        )

    def button_applies(self, name: str, obj: Any) -> bool:
        return True

    def not_here(self, request: HttpRequest, job_id: int) -> HttpResponse:
        """A link to a job that is not in this table: its page in the other one (a job
        that died, a letter requeued), or the list, with what became of it."""
        for model, name in ((Job, "job"), (DeadJob, "deadjob")):
            there = model.objects.using(current()).filter(pk=job_id)
            if model is not self.model and there.exists():
                page = console_url(f"admin:django_pgjobs_{name}_change", [job_id])
                return HttpResponseRedirect(page)
        self.message_user(
            request,
            f"Job #{job_id} is no longer here: it ended and was not kept (a done job stays "
            "only for its result retention, a dead letter until it is pruned, requeued or "
            "deleted), or there never was such a job.",
            messages.WARNING,
        )
        info = self.model._meta.app_label, self.model._meta.model_name
        return HttpResponseRedirect(console_url("admin:{}_{}_changelist".format(*info)))

    def get_urls(self) -> list[URLPattern]:
        info = self.model._meta.app_label, self.model._meta.model_name
        own = [
            path(
                "<path:object_id>/act/<str:name>/",
                self.admin_site.admin_view(self.act_view),
                name="{}_{}_act".format(*info),
            )
        ]
        return own + super().get_urls()

    def act_view(self, request: HttpRequest, object_id: str, name: str) -> HttpResponse:
        """One object page button: POST only, with the permission the list's action needs."""
        info = self.model._meta.app_label, self.model._meta.model_name
        page = console_url("admin:{}_{}_change".format(*info), [object_id])
        if request.method != "POST":
            return HttpResponseRedirect(page)
        obj = get_object_or_404(self.model.objects.using(current()), pk=job_id_of(object_id))
        allowed = self.may_act(request) and (
            name != "delete" or self.has_delete_permission(request)
        )
        if not allowed or name not in {button[0] for button in self.buttons}:
            self.message_user(
                request,
                f"Refused: you may not {name.replace('_', ' ')} {obj}; nothing was changed.",
                messages.ERROR,
            )
            return HttpResponseRedirect(page)
        return self.press(request, name, obj)

    def press(self, request: HttpRequest, name: str, obj: Any) -> HttpResponse:
        raise NotImplementedError

    @admin.display(description="payload")
    def pretty_payload(self, obj: Any) -> SafeString:
        return pretty_json(obj.payload)

    @admin.display(description="failed attempts")
    def error_table(self, obj: Any) -> SafeString:
        return error_history(obj.errors)

    @admin.display(description="traceback")
    def traceback(self, obj: Any) -> SafeString:
        return latest_traceback(obj.errors)

    @admin.display(description="attempts")
    def attempts_of(self, obj: Any) -> str:
        return f"{obj.attempts} of {obj.max_attempts}"

    @admin.display(description="lease")
    def lease(self, obj: Any) -> str:
        return f"{obj.lease_s:,} s"

    @admin.display(description="time limit")
    def timeout(self, obj: Any) -> str:
        return "none" if obj.timeout_s is None else f"{obj.timeout_s:g} s per attempt"

    @admin.display(description="state")
    def state_line(self, obj: Any) -> SafeString:
        return format_html("<strong>{}</strong>", self.state_of(obj))

    @admin.display(description="kind", ordering="kind")
    def kind_of(self, obj: Any) -> SafeString:
        """The kind, broken only at its dots when the column is narrow."""
        return format_html_join(
            mark_safe(".<wbr>"), "{}", ((part,) for part in obj.kind.split("."))
        )

    @admin.display(description="timeline")
    def timeline_of(self, obj: Any) -> SafeString:
        return timeline(obj)

    @admin.display(description="progress")
    def progress_wide(self, obj: Any) -> SafeString:
        """A running job's last report; a job that no longer runs (handed back, retried,
        dead) keeps the report of its last run, which says so."""
        bar = progress_bar(obj.progress, wide=True)
        if not bar:
            return mark_safe("-")
        if getattr(obj, "state", None) == JobState.RUNNING:
            return bar
        return format_html(
            '<span class="pgjobs-progress-past">as its last run (attempt {}) left it:</span> {}',
            obj.attempts,
            bar,
        )

    def state_of(self, obj: Any) -> str:
        raise NotImplementedError


@admin.register(Job)
class JobAdmin(ReadOnlyJobAdmin):
    list_display = (
        "id",
        "kind_of",
        "queue",
        "key_short",
        "state_and_progress",
        "attempts_of",
        "runs",
        "worker_short",
    )
    list_filter = (
        "state",
        ReadinessFilter,
        QueueFilter,
        KindFilter,
        ParentsOfFilter,
        ChildrenOfFilter,
    )
    extra_readonly = (*ReadOnlyJobAdmin.extra_readonly, "pretty_result")
    actions = ("run_now", "cancel")
    buttons = (
        ("run_now", "Run now", "A pending job becomes runnable at once."),
        ("cancel", "Cancel", "To the dead letters as cancelled; a running handler is told."),
    )
    fieldsets = (
        (
            None,
            {
                "fields": (
                    "state_line",
                    "progress_wide",
                    "attempts_of",
                    "last_error",
                    "traceback",
                    "error_table",
                )
            },
        ),
        ("Timeline", {"fields": ("timeline_of",)}),
        ("Payload and result", {"fields": ("pretty_payload", "pretty_result")}),
        (
            "Details",
            {
                "classes": ("collapse",),
                "fields": (
                    "id",
                    "kind",
                    "queue",
                    "key",
                    "priority",
                    "run_after",
                    "lease",
                    "timeout",
                    "expires_at",
                    "result_ttl_s",
                    "purge_at",
                    "created_at",
                    "finished_at",
                    *ReadOnlyJobAdmin.claim_fields,
                    "limit_key",
                    "concurrency_limit",
                    "rate_limit",
                    "rate_period_s",
                    *ReadOnlyJobAdmin.trigger_fields,
                ),
            },
        ),
    )

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False  # a live job is cancelled (to the dead letters), not deleted

    def get_queryset(self, request: HttpRequest) -> QuerySet[Job]:
        delta = ExpressionWrapper(F("run_after") - Now(), output_field=DurationField())
        lease = ExpressionWrapper(F("claimed_until") - Now(), output_field=DurationField())
        queryset: QuerySet[Job] = super().get_queryset(request)
        return queryset.annotate(runs_in=delta, lease_left=lease)

    def state_of(self, obj: Job) -> str:
        if obj.state == JobState.PENDING:
            runs_in = getattr(obj, "runs_in", None)
            if runs_in is not None and runs_in.total_seconds() > 0:
                return f"pending, scheduled: runs {labels.ago(runs_in)}"
            return "pending, runnable now" + (" (retrying)" if obj.errors else "")
        if obj.state == JobState.RUNNING:
            return running_on(obj)
        return str(obj.state)

    def button_applies(self, name: str, obj: Job) -> bool:
        if name == "run_now":
            return obj.state == JobState.PENDING
        return obj.state in (JobState.PENDING, JobState.RUNNING)

    def press(self, request: HttpRequest, name: str, obj: Job) -> HttpResponse:
        if name == "run_now":
            moved = Job.objects.run_now([obj.pk])
            text = (
                f"Job {obj} set to run now."
                if moved
                else f"Job {obj} is not pending: nothing to do."
            )
            self.message_user(request, text, messages.SUCCESS if moved else messages.WARNING)
            if moved:
                audit.log_one(request, Job, obj.pk, str(obj), "Set to run now.")
            return HttpResponseRedirect(console_url("admin:django_pgjobs_job_change", [obj.pk]))
        cancelled = Job.objects.cancel_many([obj.pk], reason=cancel_reason(request))
        if not cancelled:
            self.message_user(
                request, f"Job {obj} had finished: nothing to cancel.", messages.WARNING
            )
            return HttpResponseRedirect(console_url("admin:django_pgjobs_job_changelist"))
        audit.log_one(request, DeadJob, obj.pk, str(obj), f"Cancelled: {how_far(obj)}.")
        self.message_user(request, f"Job {obj} cancelled (now a dead letter).", messages.SUCCESS)
        if DeadJob.objects.using(current()).filter(pk=obj.pk).exists():
            return HttpResponseRedirect(console_url("admin:django_pgjobs_deadjob_change", [obj.pk]))
        return HttpResponseRedirect(console_url("admin:django_pgjobs_job_changelist"))

    @admin.display(description="key", ordering="key")
    def key_short(self, obj: Job) -> str:
        return labels.shortened(obj.key or "", 24)

    @admin.display(description="state", ordering="state")
    def state_and_progress(self, obj: Job) -> SafeString:
        if obj.state == JobState.RUNNING and obj.progress:
            return format_html("running {}", progress_bar(obj.progress))
        return format_html("{}", obj.state)

    @admin.display(description="worker", ordering="worker_id")
    def worker_short(self, obj: Job) -> str:
        return labels.shortened(obj.worker_id or "", 28)

    @admin.display(description="run after", ordering="run_after")
    def runs(self, obj: Job) -> SafeString:
        return relative_time(obj.run_after, getattr(obj, "runs_in", None))

    @admin.display(description="result")
    def pretty_result(self, obj: Job) -> SafeString:
        return pretty_json(obj.result)

    @admin.action(description="Run now (pending jobs)", permissions=["change"])
    def run_now(self, request: HttpRequest, queryset: QuerySet[Job]) -> HttpResponse | None:
        if all_matching(request) and not confirmed(request):
            return confirmation(
                self,
                request,
                queryset,
                action="run_now",
                question="Run {jobs} now",
                title="Run jobs now?",
                explanation="Each pending one becomes runnable at once; the others are skipped.",
                button="Yes, run them now",
            )
        batches = chosen_batches(self, request, queryset)
        if batches is None:
            return None
        acted = audit.Acted(batches)
        moved = sum(Job.objects.run_now(batch) for batch in acted)
        audit.log_bulk(
            request, Job, "Set {count} to run now", acted.ids, moved, JOB_NOUN, chosen=acted.chosen
        )
        self.message_user(
            request, f"{moved:,} {jobs_word(moved)} set to run now.", messages.SUCCESS
        )
        return None

    @admin.action(description="Cancel (dead-letter as cancelled)", permissions=["change"])
    def cancel(self, request: HttpRequest, queryset: QuerySet[Job]) -> HttpResponse | None:
        if not confirmed(request):
            return confirmation(
                self,
                request,
                queryset,
                action="cancel",
                question="Cancel {jobs}",
                title="Cancel jobs?",
                explanation="Each moves to the dead letters with the reason cancelled; a "
                "running one's handler is told and can no longer record anything. A "
                "cancelled job can be requeued from the dead letters.",
                button="Yes, cancel them",
            )
        batches = chosen_batches(self, request, queryset)
        if batches is None:
            return None
        cancelled = chosen = 0
        acted = audit.Acted(batches)
        for batch in acted:
            chosen += len(batch)
            cancelled += Job.objects.cancel_many(batch, reason=cancel_reason(request))
        audit.log_bulk(
            request, Job, "Cancelled {count}", acted.ids, cancelled, JOB_NOUN, chosen=acted.chosen
        )
        skipped = chosen - cancelled
        message = f"{cancelled:,} {jobs_word(cancelled)} cancelled"
        if skipped:
            message += f", {skipped:,} skipped (already finished)"
        self.message_user(request, message + ".", messages.SUCCESS)
        return None


#: How a log entry counts jobs (one, many).
JOB_NOUN = ("job", "jobs")


def cancel_reason(request: HttpRequest) -> str:
    """A cancel's reason, which its dead letter keeps: who cancelled it, from here."""
    return f"cancelled by {request.user.get_username()} in the console"


def running_on(job: Job) -> str:
    """A running job's state: its worker, and when that worker is gone (stopped, silent
    past 3 heartbeats, or no longer registered), when the lease lapses and what then."""
    worker = WorkerRow.objects.status_of(job.worker_id or "", using=job._state.db)
    if worker is not None and worker.live:
        return f"running on {job.worker_id}"
    if worker is None:
        gone = "a worker no longer registered"
    elif worker.stopped_at is not None:
        gone = f"a worker that stopped {exact_time(worker.stopped_at)}"
    else:
        gone = f"a worker not heard from since {exact_time(worker.last_seen_at)}"
    left = getattr(job, "lease_left", None)
    lapse = "its lease lapses" if left is None else f"its lease lapses {labels.ago(left)}"
    if left is not None and left.total_seconds() <= 0:
        lapse = f"its lease lapsed {labels.ago(left)}"
    then = (
        f"then it runs again (attempt {job.attempts + 1} of {job.max_attempts})"
        if job.attempts < job.max_attempts
        else "then it is dead-lettered (no attempt left)"
    )
    return f"running on {job.worker_id}, {gone}: {lapse}, {then}"


def how_far(job: Job) -> str:
    """How far a job had got when it was cancelled, as its page last read it."""
    if job.state == JobState.RUNNING:
        progress = progress_words(job.progress)
        at = f", at {progress}" if progress else ""
        return (
            f"it was running on {job.worker_id} (attempt {job.attempts} of {job.max_attempts}{at})"
        )
    tried = f", {job.attempts} of {job.max_attempts} attempts spent" if job.attempts else ""
    return f"it was pending{tried}"
