"""The counts at a glance above the lists, with their links and the last hour's chart."""

from __future__ import annotations

from typing import Any

from django.http import HttpRequest

from django_pgjobs import labels
from django_pgjobs.admin.charts import throughput_chart
from django_pgjobs.admin.databases import console_url
from django_pgjobs.managers.workers import unserved_queues
from django_pgjobs.models import QueueControl, Worker
from django_pgjobs.records import Count, QueueStatus

#: Where a request keeps its queues' statuses once read.
_STATUSES = "_pgjobs_queue_statuses"


def queue_statuses(request: HttpRequest) -> list[QueueStatus]:
    """Every queue's status, read once per request: the glance above a list and the
    list's queue filter show the same read, and the filter scans no job table of its own."""
    statuses: list[QueueStatus] | None = getattr(request, _STATUSES, None)
    if statuses is None:
        statuses = QueueControl.objects.status()
        setattr(request, _STATUSES, statuses)
    return statuses


def glance_context(request: HttpRequest) -> dict[str, Any]:
    """What a list shows above its rows: the warnings first ("No live worker serves …"),
    then the glance folded to one line of totals, its table and chart inside."""
    statuses = queue_statuses(request)
    return {
        "glance": [glance_row(status) for status in statuses],
        "glance_summary": glance_summary(statuses),
        # dashboard_warnings.html says it, as on the dashboard and the workers list.
        "unserved": unserved_queues(statuses, Worker.objects.status()),
        "chart": throughput_chart("hour", height=100),
    }


def total_of(statuses: list[QueueStatus], field: str) -> Count:
    """One count (`field` of QueueStatus) over every queue: an estimate if any is."""
    counts: list[Count] = [getattr(status, field) for status in statuses]
    return Count(sum(count.value for count in counts), any(c.estimated for c in counts))


def oldest_runnable_s(statuses: list[QueueStatus]) -> float | None:
    """The age of the oldest runnable job of any queue (None: none runnable)."""
    ages = [s.oldest_runnable_s for s in statuses if s.oldest_runnable_s is not None]
    return max(ages) if ages else None


def glance_summary(statuses: list[QueueStatus]) -> str:
    """The glance in one line: "3 queues · 12 runnable · 2 running · 5 dead · oldest
    runnable 4 s", estimates marked."""
    oldest = oldest_runnable_s(statuses)
    paused = sum(1 for status in statuses if status.paused)
    parts = [
        f"{len(statuses)} {'queue' if len(statuses) == 1 else 'queues'}",
        *(
            f"{labels.count(total_of(statuses, field))} {field}"
            for field in ("runnable", "scheduled", "running", "dead")
        ),
    ]
    if oldest is not None:
        parts.append(f"oldest runnable {labels.age(oldest)}")
    if paused:
        parts.append(f"{paused} paused")
    return " · ".join(parts)


def queue_links(queue: str) -> dict[str, str]:
    """Where each count of a queue leads: the list filtered on what it counts."""
    jobs = "admin:django_pgjobs_job_changelist"
    return {
        "runnable": console_url(jobs, query={"queue": queue, "readiness": "runnable"}),
        "scheduled": console_url(jobs, query={"queue": queue, "readiness": "scheduled"}),
        "retrying": console_url(jobs, query={"queue": queue, "readiness": "retrying"}),
        "running": console_url(jobs, query={"queue": queue, "state__exact": "running"}),
        "done": console_url(jobs, query={"queue": queue, "state__exact": "done"}),
        "dead": console_url("admin:django_pgjobs_deadjob_changelist", query={"queue": queue}),
    }


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
        "links": queue_links(status.queue),
    }
