"""`JobStats.objects`: the per-minute counts the workers keep, and what the chart reads."""

from __future__ import annotations

import json
from bisect import bisect_left
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import timedelta
from typing import TYPE_CHECKING, Any

from django.db import models

from django_pgjobs.db import connection as db
from django_pgjobs.db import sql
from django_pgjobs.records import Latency, LatencyReport, ThroughputPoint

if TYPE_CHECKING:
    from django_pgjobs.models import JobStats, KindStats  # noqa: F401

#: The upper bounds (seconds) of the latency histograms' buckets; the last is unbounded.
LATENCY_BUCKETS_S: tuple[float, ...] = (
    0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300, 900, 3600,
    float("inf"),
)  # fmt: skip

#: Hours the sweeper keeps of the per-hour sums (a week and a day).
STATS_HOURS_KEPT = 8 * 24


@dataclass(frozen=True)
class Span:
    """A span the dashboard offers: its length, the size of a bucket of its chart, and
    whether it reads the sweeper's per-hour sums (the minutes are kept a day)."""

    minutes: int
    bucket_min: int
    hourly: bool


#: The spans of the dashboard's charts, by the name its URL carries.
SPANS: dict[str, Span] = {
    "hour": Span(60, 2, hourly=False),
    "day": Span(24 * 60, 60, hourly=True),
    "week": Span(7 * 24 * 60, 6 * 60, hourly=True),
}


class JobStatsManager(models.Manager["JobStats"]):
    """The per-minute rollup the admin's chart reads."""

    def record(
        self, counts: Mapping[str, tuple[int, int, int, int]], *, using: str | None = None
    ) -> None:
        """Add (succeeded, retried, dead, cancelled) per queue to the current minute."""
        if not counts:
            return
        queues = sorted(counts)
        params = {
            "queues": queues,
            "succeeded": [counts[queue][0] for queue in queues],
            "retried": [counts[queue][1] for queue in queues],
            "dead": [counts[queue][2] for queue in queues],
            "cancelled": [counts[queue][3] for queue in queues],
        }
        db.rowcount(sql.RECORD_STATS, params, using)

    def throughput(
        self,
        buckets: int = 60,
        *,
        bucket_min: int = 1,
        queue: str | None = None,
        using: str | None = None,
    ) -> list[ThroughputPoint]:
        """Jobs done, retried, dead-lettered and cancelled per bucket of `bucket_min`
        minutes (a divisor of 60), the last `buckets` of them, oldest first; of one queue
        if given."""
        if bucket_min < 1 or 60 % bucket_min:
            raise ValueError("bucket_min must divide an hour: 1, 2, 3, 5, 10, 15, 30 or 60.")
        params = {"buckets": int(buckets), "bucket_min": int(bucket_min), "queue": queue}
        rows = db.fetchall(sql.THROUGHPUT, params, using)
        return [ThroughputPoint(at, *(int(n) for n in counts)) for at, *counts in rows]

    def throughput_hours(
        self, hours: int = 168, *, queue: str | None = None, using: str | None = None
    ) -> list[ThroughputPoint]:
        """Jobs done, retried, dead-lettered and cancelled per hour, the last `hours` of
        them, oldest first, of one queue if given: the sweeper's per-hour sums and the
        minutes after them."""
        params = {"hours": int(hours), "queue": queue}
        rows = db.fetchall(sql.THROUGHPUT_HOURS, params, using)
        return [ThroughputPoint(at, *(int(n) for n in counts)) for at, *counts in rows]

    def sum_hours(self, *, using: str | None = None) -> int:
        """Sum the minutes of each ended hour not yet summed, counts and histograms, into
        the per-hour tables (the sweeper's; once per hour). Returns the rows written."""
        return db.rowcount(sql.SUM_STATS_HOURS, {}, using) + db.rowcount(
            sql.SUM_KIND_STATS_HOURS, {}, using
        )

    def prune(self, limit: int, *, using: str | None = None) -> int:
        """Delete up to `limit` minutes older than a day, and up to `limit` hours older
        than STATS_HOURS_KEPT, of each table."""
        hours = {"limit": limit, "hours": STATS_HOURS_KEPT}
        return (
            db.rowcount(sql.PRUNE_STATS, {"limit": limit}, using)
            + db.rowcount(sql.PRUNE_KIND_STATS, {"limit": limit}, using)
            + db.rowcount(sql.PRUNE_STATS_HOURS, hours, using)
            + db.rowcount(sql.PRUNE_KIND_STATS_HOURS, hours, using)
        )


class KindStatsManager(models.Manager["KindStats"]):
    """Per minute, queue and kind, runs and their latency histograms (the dashboard's
    p50/p95)."""

    def record(
        self,
        kinds: Mapping[tuple[str, str], tuple[int, Sequence[int], Sequence[int]]],
        *,
        using: str | None = None,
    ) -> None:
        """Add (runs, wait histogram, run histogram) per (queue, kind) to the current
        minute."""
        if not kinds:
            return
        document = [
            {"queue": queue, "kind": kind, "runs": runs, "wait": list(wait), "run": list(run)}
            for (queue, kind), (runs, wait, run) in sorted(kinds.items())
        ]
        db.rowcount(sql.RECORD_KIND_STATS, {"kinds": json.dumps(document)}, using)

    def latency(
        self,
        span: str = "hour",
        *,
        queue: str | None = None,
        kind: str | None = None,
        using: str | None = None,
    ) -> LatencyReport:
        """Queue wait and run time over the last hour, day or week (`span`, one of SPANS):
        over time, per queue and per kind; of one queue and of one kind if given. Read from
        the workers' histograms (the day and the week from the sweeper's per-hour sums),
        never from the job table."""
        shape = SPANS[span]
        [(since, _now)] = db.fetchall(
            sql.SPAN_START, {"minutes": shape.minutes, "hours": shape.hourly}, using
        )
        rows = db.fetchall(
            sql.KIND_STATS_SINCE,
            {"since": since, "hourly": shape.hourly, "queue": queue, "kind": kind},
            using,
        )
        buckets = -(-shape.minutes // shape.bucket_min)
        bucket_s = shape.bucket_min * 60
        width = len(LATENCY_BUCKETS_S)
        over_time = [_Sums(width) for _ in range(buckets)]
        by_queue: dict[str, _Sums] = {}
        by_kind: dict[str, _Sums] = {}
        for at, row_queue, row_kind, wait, run in rows:
            index = int((at - since).total_seconds() // bucket_s)
            for sums in (
                over_time[min(max(index, 0), buckets - 1)],
                by_queue.setdefault(row_queue, _Sums(width)),
                by_kind.setdefault(row_kind, _Sums(width)),
            ):
                sums.add(wait, run)
        return LatencyReport(
            span=span,
            since=since,
            bucket_min=shape.bucket_min,
            series=[
                (since + timedelta(minutes=i * shape.bucket_min), sums.latency())
                for i, sums in enumerate(over_time)
            ],
            queues={name: by_queue[name].latency() for name in sorted(by_queue)},
            kinds={name: by_kind[name].latency() for name in sorted(by_kind)},
            queue=queue,
            kind=kind,
        )


class _Sums:
    """Two histograms summed bucket by bucket (a row's shorter list adds to its first
    buckets; a longer one's extra buckets go to the last)."""

    __slots__ = ("run", "wait")

    def __init__(self, width: int) -> None:
        self.wait = [0] * width
        self.run = [0] * width

    def add(self, wait: Any, run: Any) -> None:
        for into, stored in ((self.wait, wait), (self.run, run)):
            counts = _histogram(stored)
            if counts is None:
                continue  # a row edited by hand: no histogram
            last = len(into) - 1
            for index, count in enumerate(counts):
                into[min(index, last)] += _count(count)

    def latency(self) -> Latency:
        return Latency(
            runs=sum(self.wait),
            wait_p50_s=percentile(self.wait, 0.50),
            wait_p95_s=percentile(self.wait, 0.95),
            run_p50_s=percentile(self.run, 0.50),
            run_p95_s=percentile(self.run, 0.95),
        )


def _histogram(stored: Any) -> list[Any] | None:
    """A stored histogram as a list (Django's connections read jsonb as its text), or
    None if it is not one."""
    if isinstance(stored, str | bytes):
        try:
            stored = json.loads(stored)
        except ValueError:
            return None
    return stored if isinstance(stored, list) else None


def _count(value: Any) -> int:
    """A histogram's count as stored; a row edited by hand may hold anything: what is not
    a count of runs (a negative, a string, a float, null) counts none."""
    if type(value) is int and value > 0:
        return value
    return 0


def bucket_of(seconds: float) -> int:
    """The histogram bucket of a latency: the first whose bound holds it."""
    return bisect_left(LATENCY_BUCKETS_S, seconds)


def percentile(histogram: Sequence[int], fraction: float) -> float | None:
    """The bound of the bucket holding the `fraction` quantile of a histogram."""
    total = sum(histogram)
    if not total:
        return None
    wanted, seen = fraction * total, 0
    for index, count in enumerate(histogram):
        seen += count
        if seen >= wanted:
            return LATENCY_BUCKETS_S[min(index, len(LATENCY_BUCKETS_S) - 1)]
    return LATENCY_BUCKETS_S[-1]
