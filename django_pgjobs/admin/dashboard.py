"""The dashboard: every queue's counts (each a link to the filtered list) and their
totals, the workers, and the throughput over the last hour and day; its numbers refresh
every few seconds from a small JSON view behind the same permission.

The page is the changelist of `Dashboard`, a proxy of the per-minute stats, so that it
sits in the admin's index beside Jobs and Dead letters. Whoever may view jobs may see it.
"""

from __future__ import annotations

from typing import Any

import django
from django.contrib import admin
from django.http import HttpRequest, HttpResponse, JsonResponse
from django.template.loader import render_to_string
from django.template.response import TemplateResponse
from django.urls import URLPattern, path, reverse
from django.views.decorators.cache import never_cache

from django_pgjobs import labels
from django_pgjobs.admin.glance import (
    oldest_runnable_s,
    queue_links,
    throughput_chart,
    total_of,
)
from django_pgjobs.managers.workers import unserved_queues
from django_pgjobs.models import Dashboard, Job, KindStats, QueueControl, Worker
from django_pgjobs.records import Count, KindLatency, QueueStatus

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
class DashboardAdmin(admin.ModelAdmin):  # type: ignore[type-arg]
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
        context = {
            **self.admin_site.each_context(request),
            "title": "Dashboard",
            "opts": self.model._meta,
            "counts": COUNTS,
            "refresh_s": REFRESH_S,
            "data_url": reverse("admin:django_pgjobs_dashboard_data"),
            # Django 6 writes its breadcrumbs as a list; 5.2 as links in a div.
            "breadcrumbs_as_list": django.VERSION >= (6, 0),
            **dashboard_fragments(),
        }
        return TemplateResponse(request, "admin/django_pgjobs/dashboard.html", context)

    def data_view(self, request: HttpRequest) -> HttpResponse:
        """The dashboard's numbers as JSON (and its fragments, rendered, for the page)."""
        if not self.has_view_permission(request):
            return self._refused()
        return JsonResponse(dashboard_data())

    def _refused(self) -> HttpResponse:
        return JsonResponse(
            {"error": "The dashboard needs the permission to view jobs."}, status=403
        )


def dashboard_data() -> dict[str, Any]:
    """Every number of the dashboard, and its fragments rendered as the page shows them."""
    fragments = dashboard_fragments()
    queues = fragments["queues"]
    return {
        "at": Job.objects.clock().isoformat(),
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
        "html": {
            "queues": render_to_string(
                "admin/django_pgjobs/dashboard_queues.html", {"counts": COUNTS, **fragments}
            ),
            "warnings": render_to_string("admin/django_pgjobs/dashboard_warnings.html", fragments),
            "workers": render_to_string(
                "admin/django_pgjobs/dashboard_workers.html", {"counts": COUNTS, **fragments}
            ),
            "kinds": render_to_string("admin/django_pgjobs/dashboard_kinds.html", fragments),
            "hour": str(fragments["hour"]),
            "day": str(fragments["day"]),
        },
    }


def dashboard_fragments() -> dict[str, Any]:
    """What the page and its JSON show: read once, rendered by both."""
    queues = QueueControl.objects.status()
    workers = Worker.objects.status()
    return {
        "queues": queues,
        "rows": [queue_row(status) for status in queues],
        "total": total_row(queues),
        "workers": workers,
        "live_workers": [worker for worker in workers if worker.live],
        "unserved": unserved_queues(queues, workers),
        "hour": throughput_chart(60, 1),
        "day": throughput_chart(96, 15),
        "kinds": [kind_row(latency) for latency in KindStats.objects.latency(60)],
    }


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
    jobs = reverse("admin:django_pgjobs_job_changelist")
    dead = reverse("admin:django_pgjobs_deadjob_changelist")
    links = {
        "runnable": f"{jobs}?readiness=runnable",
        "scheduled": f"{jobs}?readiness=scheduled",
        "retrying": f"{jobs}?readiness=retrying",
        "running": f"{jobs}?state__exact=running",
        "dead": dead,
        "done": f"{jobs}?state__exact=done",
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


def kind_row(latency: KindLatency) -> dict[str, Any]:
    """A kind's last hour: its runs, and its queue wait and run time at p50 and p95."""
    row: dict[str, Any] = {"kind": latency.kind, "runs": latency.runs}
    for name in ("wait_p50_s", "wait_p95_s", "run_p50_s", "run_p95_s"):
        seconds = getattr(latency, name)
        row[name] = None if seconds is None or seconds == float("inf") else seconds
        row[f"{name}_label"] = latency_label(seconds)
    return row


def latency_label(seconds: float | None) -> str:
    """A histogram bound as a person reads it: "≤ 25 ms", "≤ 2.5 s", "> 1 h"."""
    if seconds is None:
        return "-"
    if seconds == float("inf"):
        return "> 1 h"
    if seconds < 1:
        return f"≤ {seconds * 1000:g} ms"
    return f"≤ {labels.age(seconds)}" if seconds >= 60 else f"≤ {seconds:g} s"


def _count_label(value: Count, status: QueueStatus, field: str) -> str:
    if field == "running":
        return labels.running_of_limit(value, status.max_running)
    return labels.count(value)
