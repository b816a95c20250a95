"""The sidebars of the job and dead-letter lists: queues, kinds, readiness and reasons,
each from what the page has read already or from a bounded list, never a DISTINCT over a
job table. (A job's edges, `ParentsOfFilter` and `ChildrenOfFilter`: admin/workflow.py.)"""

from __future__ import annotations

from typing import Any

from django.contrib import admin
from django.db.models import Q, QuerySet
from django.db.models.functions import Now
from django.http import HttpRequest

from django_pgjobs import registry
from django_pgjobs.admin.glance import queue_statuses
from django_pgjobs.conf import pgjobs_settings
from django_pgjobs.records import QueueStatus
from django_pgjobs.states import JobState


class QueueFilter(admin.SimpleListFilter):
    """Queues with pending or running jobs, and the configured ones: taken from the
    statuses the glance above the list has read, not from a scan of their own."""

    title = "queue"
    parameter_name = "queue"

    def lookups(self, request: HttpRequest, model_admin: Any) -> list[tuple[str, str]]:
        return [(queue, queue) for queue in self.queues(queue_statuses(request))]

    def queues(self, statuses: list[QueueStatus]) -> list[str]:
        live = {
            status.queue
            for status in statuses
            if status.runnable.value or status.scheduled.value or status.running.value
        }
        return sorted(live | set(pgjobs_settings.QUEUES))

    def queryset(self, request: HttpRequest, queryset: QuerySet[Any]) -> QuerySet[Any]:
        return queryset.filter(queue=self.value()) if self.value() else queryset


class DeadQueueFilter(QueueFilter):
    """Queues with dead letters, from the glance's statuses as for the jobs."""

    def queues(self, statuses: list[QueueStatus]) -> list[str]:
        return [status.queue for status in statuses if status.dead.value]


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
        return [
            ("runnable", "runnable now"),
            ("scheduled", "scheduled later"),
            ("retrying", "retrying (tried before)"),
        ]

    def queryset(self, request: HttpRequest, queryset: QuerySet[Any]) -> QuerySet[Any]:
        pending = Q(state=JobState.PENDING)
        if self.value() == "runnable":
            return queryset.filter(pending, run_after__lte=Now())
        if self.value() == "scheduled":
            return queryset.filter(pending, run_after__gt=Now())
        if self.value() == "retrying":
            return queryset.filter(pending, attempts__gt=0)
        return queryset


#: Dead letters by why they died: a bounded list, however many distinct `Fail()`
#: messages there are. "other" is every reason none of the others matches.
REASON_CATEGORIES: dict[str, tuple[str, Q]] = {
    "max_attempts": ("max attempts exceeded", Q(reason="max attempts exceeded")),
    "failed": ("failed", Q(reason="failed")),
    "expired": ("expired", Q(reason="expired")),
    "cancelled": ("cancelled", Q(reason="cancelled")),
    "unknown_kind": ("unknown kind", Q(reason__startswith="unknown job kind")),
    "payload": ("payload does not fit", Q(reason__startswith="payload does not fit")),
}


class ReasonFilter(admin.SimpleListFilter):
    """Dead letters by category of reason, never a DISTINCT over every reason text."""

    title = "reason"
    parameter_name = "reason"

    def lookups(self, request: HttpRequest, model_admin: Any) -> list[tuple[str, str]]:
        return [(value, label) for value, (label, _) in REASON_CATEGORIES.items()] + [
            ("other", "other")
        ]

    def queryset(self, request: HttpRequest, queryset: QuerySet[Any]) -> QuerySet[Any]:
        value = self.value()
        if value in REASON_CATEGORIES:
            return queryset.filter(REASON_CATEGORIES[value][1])
        if value == "other":
            known = Q()
            for _, match in REASON_CATEGORIES.values():
                known |= match
            return queryset.exclude(known)
        return queryset
