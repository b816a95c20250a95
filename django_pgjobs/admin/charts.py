"""The dashboard's charts, as inline SVG (no script, no library): the jobs finished per
bucket of time (stacked bars, one series per ending) and the queue wait and run time at
p50 and p95 over time (lines on the histograms' bucket bounds). Each over the last hour,
day or week, read from the counts the workers keep, never from the job table."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime

from django.utils import timezone
from django.utils.html import escape, format_html, format_html_join
from django.utils.safestring import SafeString, mark_safe

from django_pgjobs import labels
from django_pgjobs.managers.stats import LATENCY_BUCKETS_S
from django_pgjobs.models import JobStats
from django_pgjobs.records import Latency, LatencyReport, ThroughputPoint

#: The throughput chart's series: the ThroughputPoint field, its legend, its colour.
CHART_SERIES = (
    ("succeeded", "done", "#3a7"),
    ("retried", "retried", "#e90"),
    ("dead", "dead-lettered", "#c33"),
    ("cancelled", "cancelled", "#888"),
)

#: The latency chart's lines: the Latency field, its legend, its colour, its dashes.
LATENCY_SERIES = (
    ("wait_p50_s", "queue wait p50", "#79aec8", ""),
    ("wait_p95_s", "queue wait p95", "#264b5d", ""),
    ("run_p50_s", "run time p50", "#e9a23b", "4,3"),
    ("run_p95_s", "run time p95", "#a0522d", "4,3"),
)

#: How each span's throughput chart is read: buckets and their size in minutes (None: per
#: hour, from the sweeper's sums), its heading.
THROUGHPUT_SPANS = {
    "hour": (60, 1, "Finished, last hour, per minute"),
    "day": (96, 15, "Finished, last 24 hours, per 15 minutes"),
    "week": (168, None, "Finished, last 7 days, per hour"),
}

WIDTH, LEFT, RIGHT, TOP, BOTTOM = 640, 44, 16, 8, 20


def throughput_chart(
    span: str = "hour", *, queue: str | None = None, height: int = 150
) -> SafeString:
    """Jobs done, retried, dead-lettered and cancelled per bucket of the span ("hour",
    "day", "week"), of one queue if given, as stacked bars with a time axis, a count axis
    and a legend."""
    buckets, bucket_min, _heading = THROUGHPUT_SPANS[span]
    if bucket_min is None:
        series = JobStats.objects.throughput_hours(buckets, queue=queue)
        return render_throughput(series, 60, height)
    series = JobStats.objects.throughput(buckets, bucket_min=bucket_min, queue=queue)
    return render_throughput(series, bucket_min, height)


def render_throughput(series: list[ThroughputPoint], bucket_min: int, height: int) -> SafeString:
    plot_w, plot_h = WIDTH - LEFT - RIGHT, height - BOTTOM - TOP
    peak = max([sum(getattr(p, f) for f, _, _ in CHART_SERIES) for p in series] + [1])
    scale = _nice_ceiling(peak)
    step = plot_w / max(len(series), 1)
    bar = max(step * 0.7, 1.0)
    parts = _axes(plot_w, plot_h)
    for fraction in (0.0, 0.5, 1.0):
        y = TOP + plot_h - fraction * plot_h
        parts.append(
            _y_label(y, f"{round(scale * fraction):,}", grid=bool(fraction), plot_w=plot_w)
        )
    long_span = len(series) * bucket_min > 24 * 60
    for index, point in enumerate(series):
        x = LEFT + index * step + (step - bar) / 2
        y = TOP + plot_h
        title = [_time_label(point.at, long_span)]
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
        parts.append(_hover(index, step, plot_h, ", ".join(title)))
    parts.extend(_time_axis([p.at for p in series], step, height, long_span))
    totals = {field: sum(getattr(p, field) for p in series) for field, _, _ in CHART_SERIES}
    minutes = len(series) * bucket_min
    if minutes >= 2 * 24 * 60:
        span = f"last {minutes // (24 * 60)} days"
    else:
        span = f"last {minutes // 60} h" if minutes > 60 else f"last {minutes} min"
    legend = format_html_join(
        " ",
        '<span class="pgjobs-legend"><svg width="10" height="10"><rect width="10" '
        'height="10" fill="{}"/></svg> {}: {}</span>',
        ((colour, legend, f"{totals[field]:,}") for field, legend, colour in CHART_SERIES),
    )
    per = "minute" if bucket_min == 1 else "hour" if bucket_min == 60 else f"{bucket_min} min"
    return _svg(height, f"jobs per {per}, {span}", parts, format_html("{}: {}", span, legend))


def latency_chart(report: LatencyReport, height: int = 150) -> SafeString:
    """Queue wait and run time at p50 and p95 per bucket of the report's span, as four
    lines over the histograms' bucket bounds (a gap where no job ran)."""
    plot_w, plot_h = WIDTH - LEFT - RIGHT, height - BOTTOM - TOP
    series = report.series
    step = plot_w / max(len(series), 1)
    levels = len(LATENCY_BUCKETS_S) - 1  # the bound's index: 0 (≤ 5 ms) … 16 (> 1 h)
    # Only the bounds the span reached, and at least up to 1 s, so that the lines spread.
    reached = [
        LATENCY_BUCKETS_S.index(value)
        for _, latency in series
        for field, *_ in LATENCY_SERIES
        if (value := getattr(latency, field)) is not None
    ]
    top_level = min(max([*reached, LATENCY_BUCKETS_S.index(1)]) + 1, levels)

    def y_of(level: int) -> float:
        return TOP + plot_h - level / top_level * plot_h

    parts = _axes(plot_w, plot_h)
    for level in range(0, top_level + 1, max(top_level // 4, 1)):
        parts.append(
            _y_label(y_of(level), _bound(LATENCY_BUCKETS_S[level]), grid=bool(level), plot_w=plot_w)
        )
    for field, _legend, colour, dashes in LATENCY_SERIES:
        for line in _runs_of(series, field):
            points = " ".join(
                f"{LEFT + index * step + step / 2:.1f},{y_of(LATENCY_BUCKETS_S.index(value)):.1f}"
                for index, value in line
            )
            if len(line) == 1:  # one bucket alone: a dot
                ((index, value),) = line
                parts.append(
                    f'<circle cx="{LEFT + index * step + step / 2:.1f}" '
                    f'cy="{y_of(LATENCY_BUCKETS_S.index(value)):.1f}" r="3" fill="{colour}"/>'
                )
            else:
                parts.append(
                    f'<polyline points="{points}" fill="none" stroke="{colour}" '
                    f'stroke-width="1.5" stroke-dasharray="{dashes}" class="pgjobs-{field}"/>'
                )
    long_span = len(series) * report.bucket_min > 24 * 60
    for index, (at, latency) in enumerate(series):
        parts.append(_hover(index, step, plot_h, _latency_title(at, latency, long_span)))
    parts.extend(_time_axis([at for at, _ in series], step, height, long_span))
    runs = sum(latency.runs for _, latency in series)
    legend = format_html_join(
        " ",
        '<span class="pgjobs-legend"><svg width="14" height="10"><line x1="0" y1="5" '
        'x2="14" y2="5" stroke="{}" stroke-width="2" stroke-dasharray="{}"/></svg> {}</span>',
        ((colour, dashes, legend) for _, legend, colour, dashes in LATENCY_SERIES),
    )
    said = f"{runs:,} {'run' if runs == 1 else 'runs'}"
    return _svg(
        height,
        f"queue wait and run time, {report.span}",
        parts,
        format_html("{}: {}", said, legend),
    )


def latency_label(seconds: float | None) -> str:
    """A histogram bound as a person reads it: "≤ 25 ms", "≤ 2.5 s", "> 1 h"."""
    if seconds is None:
        return "-"
    if seconds == float("inf"):
        return "> 1 h"
    return f"≤ {_bound(seconds)}"


def _bound(seconds: float) -> str:
    if seconds == float("inf"):
        return "> 1 h"
    if seconds < 1:
        return f"{seconds * 1000:g} ms"
    return labels.age(seconds) if seconds >= 60 else f"{seconds:g} s"


def _latency_title(at: datetime, latency: Latency, long_span: bool) -> str:
    when = _time_label(at, long_span)
    if not latency.runs:
        return f"{when}: no run"
    return (
        f"{when}: {latency.runs:,} {'run' if latency.runs == 1 else 'runs'}; queue wait p50 "
        f"{latency_label(latency.wait_p50_s)}, p95 {latency_label(latency.wait_p95_s)}; run "
        f"time p50 {latency_label(latency.run_p50_s)}, p95 {latency_label(latency.run_p95_s)}"
    )


def _runs_of(
    series: Sequence[tuple[datetime, Latency]], field: str
) -> list[list[tuple[int, float]]]:
    """The stretches of consecutive buckets in which `field` has a value."""
    lines: list[list[tuple[int, float]]] = []
    current: list[tuple[int, float]] = []
    for index, (_, latency) in enumerate(series):
        value = getattr(latency, field)
        if value is None:
            if current:
                lines.append(current)
            current = []
        else:
            current.append((index, value))
    if current:
        lines.append(current)
    return lines


def _axes(plot_w: float, plot_h: float) -> list[str]:
    return [
        f'<line x1="{LEFT}" y1="{TOP + plot_h}" x2="{LEFT + plot_w}" y2="{TOP + plot_h}" '
        'stroke="#999"/>',
        f'<line x1="{LEFT}" y1="{TOP}" x2="{LEFT}" y2="{TOP + plot_h}" stroke="#999"/>',
    ]


def _y_label(y: float, text: str, *, grid: bool, plot_w: float) -> str:
    label = f'<text x="{LEFT - 4}" y="{y + 3:.1f}" text-anchor="end">{escape(text)}</text>'
    if not grid:
        return label
    return label + (
        f'<line x1="{LEFT}" y1="{y:.1f}" x2="{LEFT + plot_w}" y2="{y:.1f}" '
        'stroke="#ddd" stroke-dasharray="2,3"/>'
    )


def _hover(index: int, step: float, plot_h: float, title: str) -> str:
    """A bucket's whole height, transparent, whose title the browser shows on hover."""
    return (
        f'<rect x="{LEFT + index * step:.1f}" y="{TOP}" width="{step:.1f}" '
        f'height="{plot_h}" fill="transparent"><title>{escape(title)}</title></rect>'
    )


def _time_axis(times: list[datetime], step: float, height: int, long_span: bool) -> list[str]:
    label_every = max(len(times) // 6, 1)
    last = len(times) - 1
    labels_at = [
        i for i in range(len(times)) if i % label_every == 0 and last - i >= label_every // 2
    ]
    # The last bucket's label ends at the plot's right edge, so that it is not cut.
    return [
        f'<text x="{LEFT + index * step + step / 2 if index < last else WIDTH - RIGHT:.1f}" '
        f'y="{height - 5}" text-anchor="{"middle" if index < last else "end"}">'
        f"{escape(_time_label(times[index], long_span))}</text>"
        for index in [*labels_at, last]
        if index >= 0
    ]


def _time_label(at: datetime, long_span: bool) -> str:
    local = timezone.localtime(at)
    return f"{local:%a %H:%M}" if long_span else f"{local:%H:%M}"


def _svg(height: int, aria: str, parts: list[str], legend: SafeString) -> SafeString:
    return format_html(
        '<svg class="pgjobs-chart" viewBox="0 0 {} {}" width="{}" height="{}" role="img" '
        'aria-label="{}">{}</svg><div class="pgjobs-chart-legend">{}</div>',
        WIDTH,
        height,
        WIDTH,
        height,
        aria,
        mark_safe("".join(parts)),
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
