"""The dashboard: every queue's counts (each a link to the filtered list) and their
totals, the workers, and over the last hour, day or week (`?span=`) the jobs finished and
their queue wait and run time at p50 and p95, over time, per queue and per kind (of one
queue or kind: `?queue=`, `?kind=`); its numbers refresh every few seconds from a small
JSON view behind the same permission, which takes the same parameters.

The page is the changelist of `Dashboard`, a proxy of the per-minute stats, so that it
sits in the admin's index beside Jobs and Dead letters. Whoever may view jobs may see it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import django
from django.contrib import admin
from django.http import HttpRequest, HttpResponse, HttpResponseBadRequest, JsonResponse
from django.template.loader import render_to_string
from django.template.response import TemplateResponse
from django.urls import URLPattern, path, reverse
from django.views.decorators.cache import never_cache

from django_pgjobs import labels, registry
from django_pgjobs.admin.charts import (
    THROUGHPUT_SPANS,
    latency_chart,
    latency_label,
    throughput_chart,
)
from django_pgjobs.admin.databases import PARAMETER as DATABASE_PARAMETER
from django_pgjobs.admin.databases import (
    InChosenDatabase,
    console_url,
    current,
    database_context,
)
from django_pgjobs.admin.filters import INTERNAL_KIND_PREFIX
from django_pgjobs.admin.glance import oldest_runnable_s, queue_links, total_of
from django_pgjobs.managers.stats import EVERY, SPANS
from django_pgjobs.managers.workers import unserved_queues
from django_pgjobs.models import Dashboard, Job, KindStats, QueueControl, Worker
from django_pgjobs.options import KIND_MAX_LENGTH, QUEUE_NAME_MAX_LENGTH
from django_pgjobs.records import Count, Latency, QueueStatus

#: Seconds between two refreshes of the dashboard's numbers.
REFRESH_S = 5

#: The counts of a queue the dashboard shows, in order, each with its heading.
COUNTS = (
    ("runnable", "runnable"),
    ("scheduled", "scheduled"),
    ("retrying", "retrying"),
    ("running", "running"),
    ("dead", "dead"),
    ("done", "done (kept)"),
)


@admin.register(Dashboard)
class DashboardAdmin(InChosenDatabase, admin.ModelAdmin):  # type: ignore[type-arg]
    """The dashboard page and its JSON, for staff who may view jobs."""

    def has_module_permission(self, request: HttpRequest) -> bool:
        return self.has_view_permission(request)

    def has_view_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        user = request.user
        return bool(user.is_active and user.is_staff and user.has_perm("django_pgjobs.view_job"))

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def get_urls(self) -> list[URLPattern]:
        data = never_cache(self.admin_site.admin_view(self.data_view))
        return [
            path("data/", data, name="django_pgjobs_dashboard_data"),
            *super().get_urls(),
        ]

    def changelist_view(
        self, request: HttpRequest, extra_context: dict[str, Any] | None = None
    ) -> HttpResponse:
        if not self.has_view_permission(request):
            return self._refused()
        scope = read_scope(request)
        if isinstance(scope, HttpResponse):
            return scope
        fragments = dashboard_fragments(scope)
        context = {
            **self.admin_site.each_context(request),
            "title": "Dashboard",
            "opts": self.model._meta,
            "counts": COUNTS,
            "refresh_s": REFRESH_S,
            # The JSON of what this page shows: its database, span, queue and kind.
            "data_url": data_url(request),
            # Django 6 writes its breadcrumbs as a list; 5.2 as links in a div.
            "breadcrumbs_as_list": django.VERSION >= (6, 0),
            "spans": list(SPANS),
            "scope_queues": sorted(
                {status.queue for status in fragments["queues"]} | _chosen(scope.queue)
            ),
            "scope_kinds": scope_kinds(scope.kind),
            **database_context(request),
            **fragments,
        }
        return TemplateResponse(request, "admin/django_pgjobs/dashboard.html", context)

    def data_view(self, request: HttpRequest) -> HttpResponse:
        """The dashboard's numbers as JSON (and its fragments, rendered, for the page)."""
        if not self.has_view_permission(request):
            return self._refused()
        scope = read_scope(request)
        if isinstance(scope, HttpResponse):
            return scope
        return JsonResponse(dashboard_data(scope))

    def _refused(self) -> HttpResponse:
        return JsonResponse(
            {"error": "The dashboard needs the permission to view jobs."}, status=403
        )


def data_url(request: HttpRequest) -> str:
    url = reverse("admin:django_pgjobs_dashboard_data")
    return f"{url}?{request.GET.urlencode()}" if request.GET else url


@dataclass(frozen=True)
class Scope:
    """What the dashboard's charts and tables show: a span, and optionally one queue and
    one kind."""

    span: str = "hour"
    queue: str | None = None
    kind: str | None = None


def read_scope(request: HttpRequest) -> Scope | HttpResponse:
    """The span, queue and kind a URL asks for, or a 400 that says what it takes."""
    unknown = set(request.GET) - {"span", "queue", "kind", DATABASE_PARAMETER}
    if unknown:
        return _bad(
            f"The dashboard takes span, queue, kind and db, not {', '.join(sorted(unknown))}."
        )
    span = request.GET.get("span") or "hour"
    if span not in SPANS:
        return _bad(f"span is one of {', '.join(SPANS)}.")
    queue = request.GET.get("queue") or None
    kind = request.GET.get("kind") or None
    for name, value, longest in (
        ("queue", queue, QUEUE_NAME_MAX_LENGTH),
        ("kind", kind, KIND_MAX_LENGTH),
    ):
        if value is not None and ("\x00" in value or len(value) > longest or value == EVERY):
            return _bad(
                f"No {name} has that name: at most {longest} characters, no NUL, not "
                f"{EVERY!r} (leave it out for every {name})."
            )
    return Scope(span, queue, kind)


def _bad(message: str) -> HttpResponse:
    return HttpResponseBadRequest(message, content_type="text/plain")


def _chosen(value: str | None) -> set[str]:
    return set() if value is None else {value}


def scope_kinds(chosen: str | None) -> list[str]:
    """The kinds the scope's select offers: those this process knows, without the
    library's own, and the chosen one."""
    kinds = {k for k in registry.registered_kinds() if not k.startswith(INTERNAL_KIND_PREFIX)}
    return sorted(kinds | _chosen(chosen))


def dashboard_data(scope: Scope | None = None) -> dict[str, Any]:
    """Every number of the dashboard, and its fragments rendered as the page shows them."""
    scope = scope or Scope()
    fragments = dashboard_fragments(scope)
    queues = fragments["queues"]
    return {
        "at": Job.objects.clock().isoformat(),
        "database": current(),
        "span": scope.span,
        "scope": {"queue": scope.queue, "kind": scope.kind},
        "queues": [queue_numbers(status) for status in queues],
        "totals": total_numbers(queues),
        "workers": {
            "live": sum(1 for worker in fragments["workers"] if worker.live),
            "registered": len(fragments["workers"]),
        },
        "unserved": fragments["unserved"],
        "kinds": [
            {key: value for key, value in row.items() if not key.endswith("_label")}
            for row in fragments["kinds"]
        ],
        "latency": {
            "queues": [
                {key: value for key, value in row.items() if not key.endswith("_label")}
                for row in fragments["latency_queues"]
            ],
            "series": [
                {"at": at.isoformat(), **latency_numbers(latency)}
                for at, latency in fragments["latency_report"].series
            ],
        },
        "html": {
            "queues": render_to_string(
                "admin/django_pgjobs/dashboard_queues.html", {"counts": COUNTS, **fragments}
            ),
            "warnings": render_to_string("admin/django_pgjobs/dashboard_warnings.html", fragments),
            "workers": render_to_string(
                "admin/django_pgjobs/dashboard_workers.html", {"counts": COUNTS, **fragments}
            ),
            "kinds": render_to_string("admin/django_pgjobs/dashboard_kinds.html", fragments),
            "throughput": str(fragments["throughput"]),
            "latency": str(fragments["latency"]),
        },
    }


def dashboard_fragments(scope: Scope | None = None) -> dict[str, Any]:
    """What the page and its JSON show: read once, rendered by both."""
    scope = scope or Scope()
    queues = QueueControl.objects.status()
    workers = Worker.objects.status()
    report = KindStats.objects.latency(scope.span, queue=scope.queue, kind=scope.kind)
    return {
        "queues": queues,
        "rows": [queue_row(status) for status in queues],
        "total": total_row(queues),
        "workers": workers,
        "live_workers": [worker for worker in workers if worker.live],
        "unserved": unserved_queues(queues, workers),
        "scope": scope,
        "span_label": SPAN_LABELS[scope.span],
        "throughput_heading": THROUGHPUT_SPANS[scope.span][2],
        "throughput": throughput_chart(scope.span, queue=scope.queue),
        "latency_report": report,
        "latency": latency_chart(report),
        "latency_per": per_bucket(report.bucket_min),
        "kinds": [latency_row("kind", name, value) for name, value in report.kinds.items()],
        "latency_queues": [
            latency_row("queue", name, value) for name, value in report.queues.items()
        ],
    }


def per_bucket(minutes: int) -> str:
    """A chart's bucket as its heading says it: "2 minutes", "hour", "6 hours"."""
    if minutes < 60:
        return f"{minutes} minutes" if minutes > 1 else "minute"
    hours = minutes // 60
    return f"{hours} hours" if hours > 1 else "hour"


#: How the dashboard names each span in its headings.
SPAN_LABELS = {"hour": "last hour", "day": "last 24 hours", "week": "last 7 days"}


def queue_numbers(status: QueueStatus) -> dict[str, Any]:
    numbers: dict[str, Any] = {"queue": status.queue, "paused": status.paused}
    for field, _ in COUNTS:
        value: Count = getattr(status, field)
        numbers[field] = value.value
        numbers[f"{field}_estimated"] = value.estimated
    numbers["oldest_runnable_s"] = status.oldest_runnable_s
    numbers["max_running"] = status.max_running
    return numbers


def total_numbers(queues: list[QueueStatus]) -> dict[str, Any]:
    totals: dict[str, Any] = {}
    for field, _ in COUNTS:
        total = total_of(queues, field)
        totals[field], totals[f"{field}_estimated"] = total.value, total.estimated
    totals["oldest_runnable_s"] = oldest_runnable_s(queues)
    return totals


def queue_row(status: QueueStatus) -> dict[str, Any]:
    links = queue_links(status.queue)
    return {
        "queue": status.queue,
        "paused": status.paused,
        "cells": [
            (field, _count_label(getattr(status, field), status, field), links[field])
            for field, _ in COUNTS
        ],
        "oldest_runnable": labels.age(status.oldest_runnable_s),
    }


def total_row(queues: list[QueueStatus]) -> dict[str, Any]:
    totals = total_numbers(queues)
    jobs = "admin:django_pgjobs_job_changelist"
    links = {
        "runnable": console_url(jobs, query={"readiness": "runnable"}),
        "scheduled": console_url(jobs, query={"readiness": "scheduled"}),
        "retrying": console_url(jobs, query={"readiness": "retrying"}),
        "running": console_url(jobs, query={"state__exact": "running"}),
        "dead": console_url("admin:django_pgjobs_deadjob_changelist"),
        "done": console_url(jobs, query={"state__exact": "done"}),
    }
    return {
        "cells": [
            (
                field,
                labels.count(Count(totals[field], totals[f"{field}_estimated"])),
                links[field],
            )
            for field, _ in COUNTS
        ],
        "oldest_runnable": labels.age(totals["oldest_runnable_s"]),
    }


def latency_row(field: str, name: str, latency: Latency) -> dict[str, Any]:
    """A queue's or kind's span: its runs, and its queue wait and run time at p50 and
    p95 (the numbers, and labels as the table shows them)."""
    row: dict[str, Any] = {field: name, **latency_numbers(latency)}
    for key in ("wait_p50_s", "wait_p95_s", "run_p50_s", "run_p95_s"):
        row[f"{key}_label"] = latency_label(getattr(latency, key))
    return row


def latency_numbers(latency: Latency) -> dict[str, Any]:
    """A Latency as JSON holds it: seconds, None where no job ran or past the last bound."""
    numbers: dict[str, Any] = {"runs": latency.runs}
    for key in ("wait_p50_s", "wait_p95_s", "run_p50_s", "run_p95_s"):
        seconds = getattr(latency, key)
        numbers[key] = None if seconds is None or seconds == float("inf") else seconds
    return numbers


def _count_label(value: Count, status: QueueStatus, field: str) -> str:
    if field == "running":
        return labels.running_of_limit(value, status.max_running)
    return labels.count(value)
