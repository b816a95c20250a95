"""Dead letters: the jobs that failed, ran out of attempts, expired or were cancelled;
filtered by why, requeued or deleted, each page led by what went wrong."""

from __future__ import annotations

from django.contrib import admin, messages
from django.contrib.admin.models import DELETION
from django.db.models import DurationField, ExpressionWrapper, F, QuerySet
from django.db.models.functions import Now
from django.http import HttpRequest, HttpResponse, HttpResponseRedirect
from django.utils.html import format_html
from django.utils.safestring import SafeString

from django_pgjobs import labels
from django_pgjobs.admin import audit
from django_pgjobs.admin.common import (
    ACTION_BATCH,
    all_matching,
    chosen_batches,
    confirmation,
    confirmed,
    exact_time,
    jobs_word,
    relative_time,
)
from django_pgjobs.admin.databases import console_url
from django_pgjobs.admin.filters import DeadQueueFilter, KindFilter, ReasonFilter
from django_pgjobs.admin.jobs import ReadOnlyJobAdmin
from django_pgjobs.admin.workflow import ChildrenOfFilter, ParentsOfFilter
from django_pgjobs.models import DeadJob, Job
from django_pgjobs.states import DeadCategory

#: What a reason says that names a category and nothing more ("failed", "expired").
_CATEGORY_WORDS = frozenset(
    word for category in DeadCategory for word in (str(category.value), str(category.label))
)
#: How a log entry counts dead letters (one, many).
LETTER_NOUN = ("dead letter", "dead letters")


@admin.register(DeadJob)
class DeadJobAdmin(ReadOnlyJobAdmin):
    list_display = ("id", "kind_of", "queue", "why", "attempts", "died")
    list_filter = (ReasonFilter, DeadQueueFilter, KindFilter, ParentsOfFilter, ChildrenOfFilter)
    actions = ("requeue", "delete_selected")
    buttons = (
        ("requeue", "Requeue", "Back to pending with fresh attempts."),
        ("delete", "Delete", "Forget this dead letter."),
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
        ("Payload", {"fields": ("pretty_payload",)}),
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
                    "created_at",
                    "died_at",
                    *ReadOnlyJobAdmin.claim_fields,
                    "limit_key",
                ),
            },
        ),
    )
    ordering = ("-died_at", "-id")  # type: ignore[assignment]

    def get_queryset(self, request: HttpRequest) -> QuerySet[DeadJob]:
        delta = ExpressionWrapper(F("died_at") - Now(), output_field=DurationField())
        queryset: QuerySet[DeadJob] = super().get_queryset(request)
        return queryset.annotate(died_in=delta)

    @admin.display(description="died", ordering="died_at")
    def died(self, obj: DeadJob) -> SafeString:
        return relative_time(obj.died_at, getattr(obj, "died_in", None))

    def state_of(self, obj: DeadJob) -> str:
        return f"dead ({obj.reason}) since {exact_time(obj.died_at)}"

    @admin.display(description="state")
    def state_line(self, obj: DeadJob) -> SafeString:
        category = obj.filed_category
        if category is None:
            return super().state_line(obj)
        return format_html(
            '<strong>{}</strong> <span class="pgjobs-category" title="category">{}</span>',
            self.state_of(obj),
            category.label,
        )

    def press(self, request: HttpRequest, name: str, obj: DeadJob) -> HttpResponse:
        if name == "delete":
            if DeadJob.objects.delete_letters([obj.pk]):
                audit.log_one(request, DeadJob, obj.pk, str(obj), "Deleted.", flag=DELETION)
            self.message_user(request, f"Dead letter {obj} deleted.", messages.SUCCESS)
            return HttpResponseRedirect(console_url("admin:django_pgjobs_deadjob_changelist"))
        result = DeadJob.objects.requeue([obj.pk])
        text = (
            f"Dead letter {obj} requeued."
            if result.requeued
            else f"Dead letter {obj} merged into the live job of its key."
        )
        done = "Requeued" if result.requeued else "Merged into the live job of its key"
        if result.requeued or result.merged:
            audit.log_one(
                request, Job, obj.pk, str(obj), f"{done}, from the dead letters ({obj.reason})."
            )
        self.message_user(request, text, messages.SUCCESS)
        return HttpResponseRedirect(
            console_url("admin:django_pgjobs_job_changelist", query={"q": obj.pk})
        )

    @admin.display(description="why", ordering="category")
    def why(self, obj: DeadJob) -> SafeString:
        """The category as a chip, then what was said, once: the reason where it says more
        than a category's name ("the remote said no"), else the last error's first line
        (an unknown kind's letter reads "max attempts exceeded": its error names the kind)."""
        category = obj.filed_category
        chip = category.label if category is not None else "other"
        said = obj.reason
        if said in _CATEGORY_WORDS:
            lines = (obj.last_error or "").strip().splitlines()
            said = lines[0] if lines and lines[0] not in _CATEGORY_WORDS else ""
        return format_html(
            '<span class="pgjobs-category">{}</span> <span title="{}">{}</span>',
            chip,
            said,
            labels.shortened(said, 80),
        )

    def delete_model(self, request: HttpRequest, obj: DeadJob) -> None:
        DeadJob.objects.delete_letters([obj.pk])  # with its edges, as pruning

    def delete_queryset(self, request: HttpRequest, queryset: QuerySet[DeadJob]) -> None:
        ids = list(queryset.order_by("id").values_list("id", flat=True))
        for start in range(0, len(ids), ACTION_BATCH):
            DeadJob.objects.delete_letters(ids[start : start + ACTION_BATCH])

    @admin.action(description="Delete (forget these dead letters)", permissions=["delete"])
    def delete_selected(
        self, request: HttpRequest, queryset: QuerySet[DeadJob]
    ) -> HttpResponse | None:
        """Django's delete_selected, as the other actions go: asked, in batches, on the
        letters counted, each with its edges (not a page listing every row, then a
        delete of whatever matches by then)."""
        if not confirmed(request):
            return confirmation(
                self,
                request,
                queryset,
                action="delete_selected",
                question="Delete {jobs}",
                title="Delete dead letters?",
                explanation="Each is forgotten for good, with its edges: it can no longer "
                "be requeued.",
                button="Yes, delete them",
            )
        batches = chosen_batches(self, request, queryset)
        if batches is None:
            return None
        acted = audit.Acted(batches)
        deleted = sum(DeadJob.objects.delete_letters(batch) for batch in acted)
        audit.log_bulk(
            request,
            DeadJob,
            "Deleted {count}",
            acted.ids,
            deleted,
            LETTER_NOUN,
            chosen=acted.chosen,
            flag=DELETION,
        )
        word = "dead letter" if deleted == 1 else "dead letters"
        self.message_user(request, f"{deleted:,} {word} deleted.", messages.SUCCESS)
        return None

    @admin.action(description="Requeue (back to pending, attempts reset)", permissions=["change"])
    def requeue(self, request: HttpRequest, queryset: QuerySet[DeadJob]) -> HttpResponse | None:
        if all_matching(request) and not confirmed(request):
            return confirmation(
                self,
                request,
                queryset,
                action="requeue",
                question="Requeue {jobs}",
                title="Requeue dead letters?",
                explanation="Each goes back to pending with fresh attempts; one whose key "
                "has a live job is merged into it.",
                button="Yes, requeue them",
            )
        batches = chosen_batches(self, request, queryset)
        if batches is None:
            return None
        requeued = merged = 0
        acted = audit.Acted(batches)
        for batch in acted:
            result = DeadJob.objects.requeue(batch)
            requeued, merged = requeued + result.requeued, merged + result.merged
        message = f"{requeued:,} {jobs_word(requeued)} requeued"
        if merged:
            message += f", {merged:,} merged into a live job"
        audit.log_bulk(
            request,
            DeadJob,
            "Requeued {count}" + (f" ({merged:,} merged into a live job)" if merged else ""),
            acted.ids,
            requeued + merged,
            LETTER_NOUN,
            chosen=acted.chosen,
        )
        self.message_user(request, message + ".", messages.SUCCESS)
        return None
