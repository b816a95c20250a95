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
from django_pgjobs.models import DeadJob
from django_pgjobs.records import QueueStatus
from django_pgjobs.states import DeadCategory, JobState


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


#: Kinds of django_pgjobs's own (the chaos run's): left out of the kind filter, found by
#: the search.
INTERNAL_KIND_PREFIX = "pgjobs."


class KindFilter(admin.SimpleListFilter):
    """Kinds this process knows (the registry), not a DISTINCT over the table; a select,
    not a link per kind, and without the library's own kinds."""

    title = "kind"
    parameter_name = "kind"
    template = "admin/django_pgjobs/select_filter.html"

    def lookups(self, request: HttpRequest, model_admin: Any) -> list[tuple[str, str]]:
        return [
            (kind, kind)
            for kind in registry.registered_kinds()
            if not kind.startswith(INTERNAL_KIND_PREFIX) or kind == self.value()
        ]

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


#: The reason filter's value for letters without a category.
OTHER = "other"


class ReasonFilter(admin.SimpleListFilter):
    """Dead letters by the category stored with them (DeadCategory), never a DISTINCT
    over every reason text: "failed" is every `Fail("...")`, whatever its message.
    "other" is the letters that have none: older than the column, and not recognised
    by their reason when it was added."""

    title = "reason"
    parameter_name = "reason"

    def lookups(self, request: HttpRequest, model_admin: Any) -> list[tuple[str, str]]:
        return [(str(category.value), str(category.label)) for category in DeadCategory] + [
            (OTHER, "other (not recorded)")
        ]

    def queryset(self, request: HttpRequest, queryset: QuerySet[Any]) -> QuerySet[Any]:
        value = self.value()
        if value in DeadCategory.values:
            return queryset.filter(DeadJob.in_category(DeadCategory(value)))
        if value == OTHER:
            return queryset.filter(DeadJob.in_category(None))
        return queryset
