"""The counts at a glance above the lists, with their links, and the throughput chart
(inline SVG: axes, legend, one series per ending)."""

from __future__ import annotations

from typing import Any
from urllib.parse import urlencode

from django.http import HttpRequest
from django.urls import reverse
from django.utils import timezone
from django.utils.html import escape, format_html, format_html_join
from django.utils.safestring import SafeString, mark_safe

from django_pgjobs import labels
from django_pgjobs.managers.workers import unserved_queues
from django_pgjobs.models import JobStats, QueueControl, Worker
from django_pgjobs.records import Count, QueueStatus, ThroughputPoint

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
        "chart": throughput_chart(height=100),
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
    jobs = reverse("admin:django_pgjobs_job_changelist")
    dead = reverse("admin:django_pgjobs_deadjob_changelist")
    q = urlencode({"queue": queue})
    return {
        "runnable": f"{jobs}?{q}&readiness=runnable",
        "scheduled": f"{jobs}?{q}&readiness=scheduled",
        "retrying": f"{jobs}?{q}&readiness=retrying",
        "running": f"{jobs}?{q}&state__exact=running",
        "done": f"{jobs}?{q}&state__exact=done",
        "dead": f"{dead}?{q}",
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


#: The chart's series: the ThroughputPoint field, its legend, its colour.
CHART_SERIES = (
    ("succeeded", "done", "#3a7"),
    ("retried", "retried", "#e90"),
    ("dead", "dead-lettered", "#c33"),
    ("cancelled", "cancelled", "#888"),
)


def throughput_chart(buckets: int = 60, bucket_min: int = 1, height: int = 150) -> SafeString:
    """Jobs done, retried, dead-lettered and cancelled per bucket, as stacked bars in
    an inline SVG with a time axis, a count axis and a legend."""
    series = JobStats.objects.throughput(buckets, bucket_min=bucket_min)
    return render_chart(series, bucket_min, height)


def render_chart(series: list[ThroughputPoint], bucket_min: int, height: int) -> SafeString:
    width, left, bottom, top = 640, 36, 20, 8
    plot_w, plot_h = width - left - 24, height - bottom - top
    peak = max([sum(getattr(p, f) for f, _, _ in CHART_SERIES) for p in series] + [1])
    scale = _nice_ceiling(peak)
    step = plot_w / max(len(series), 1)
    bar = max(step * 0.7, 1.0)
    parts = [
        f'<line x1="{left}" y1="{top + plot_h}" x2="{left + plot_w}" y2="{top + plot_h}" '
        'stroke="#999"/>',
        f'<line x1="{left}" y1="{top}" x2="{left}" y2="{top + plot_h}" stroke="#999"/>',
    ]
    for fraction in (0.0, 0.5, 1.0):
        y = top + plot_h - fraction * plot_h
        parts.append(
            f'<text x="{left - 4}" y="{y + 3:.1f}" text-anchor="end">'
            f"{round(scale * fraction):,}</text>"
        )
        if fraction:
            parts.append(
                f'<line x1="{left}" y1="{y:.1f}" x2="{left + plot_w}" y2="{y:.1f}" '
                'stroke="#ddd" stroke-dasharray="2,3"/>'
            )
    label_every = max(len(series) // 6, 1)
    for index, point in enumerate(series):
        x = left + index * step + (step - bar) / 2
        y = top + plot_h
        title = [f"{timezone.localtime(point.at):%H:%M}"]
        for field, legend, colour in CHART_SERIES:
            value = getattr(point, field)
            title.append(f"{value:,} {legend}")
            if not value:
                continue
            h = value / scale * plot_h
            y -= h
            parts.append(
                f'<rect x="{x:.1f}" y="{y:.1f}" width="{bar:.1f}" height="{h:.1f}" '
                f'fill="{colour}" class="pgjobs-{field}"/>'
            )
        parts.append(
            f'<rect x="{left + index * step:.1f}" y="{top}" width="{step:.1f}" '
            f'height="{plot_h}" fill="transparent"><title>{escape(", ".join(title))}</title></rect>'
        )
        if index % label_every == 0 or index == len(series) - 1:
            parts.append(
                f'<text x="{left + index * step + step / 2:.1f}" y="{height - 5}" '
                f'text-anchor="middle">{timezone.localtime(point.at):%H:%M}</text>'
            )
    totals = {field: sum(getattr(p, field) for p in series) for field, _, _ in CHART_SERIES}
    span = (
        f"last {len(series) * bucket_min // 60} h" if bucket_min > 1 else f"last {len(series)} min"
    )
    legend = format_html_join(
        " ",
        '<span class="pgjobs-legend"><svg width="10" height="10"><rect width="10" '
        'height="10" fill="{}"/></svg> {}: {}</span>',
        ((colour, legend, f"{totals[field]:,}") for field, legend, colour in CHART_SERIES),
    )
    per = "minute" if bucket_min == 1 else f"{bucket_min} min"
    return format_html(
        '<svg class="pgjobs-chart" viewBox="0 0 {} {}" width="{}" height="{}" role="img" '
        'aria-label="jobs per {}, {}">{}</svg><div class="pgjobs-chart-legend">{}: {}</div>',
        width,
        height,
        width,
        height,
        per,
        span,
        mark_safe("".join(parts)),
        span,
        legend,
    )


def _nice_ceiling(value: int) -> int:
    """The smallest of 1, 2, 5 times 10^n at least `value`, so that the axis reads well."""
    magnitude = 1
    while True:
        for factor in (1, 2, 5):
            if factor * magnitude >= value:
                return factor * magnitude
        magnitude *= 10
