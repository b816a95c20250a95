"""`JobStats.objects`: the per-minute counts the workers keep, and what the chart reads."""

from __future__ import annotations

import json
import threading
from bisect import bisect_left
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
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

#: The queue or kind of the sums kept beside each pair's histograms (the statements'
#: own, where they read them).
EVERY = sql.EVERY

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
        """Sum the minutes of each ended hour not yet summed into `pgjobs_stats_hour`
        (the sweeper's; once per hour). Returns the rows written."""
        return db.rowcount(sql.SUM_STATS_HOURS, {}, using)

    def prune(self, limit: int, *, using: str | None = None) -> int:
        """Delete up to `limit` minutes older than a day, and up to `limit` hours older
        than STATS_HOURS_KEPT."""
        hours = {"limit": limit, "hours": STATS_HOURS_KEPT}
        return db.rowcount(sql.PRUNE_STATS, {"limit": limit}, using) + db.rowcount(
            sql.PRUNE_STATS_HOURS, hours, using
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
        minute, and their sums per queue (kind EVERY), per kind (queue EVERY) and over
        all (both EVERY), which the dashboard reads instead of every pair."""
        if not kinds:
            return
        summed: dict[tuple[str, str], list[Any]] = {}
        for (queue, kind), (runs, wait, run) in kinds.items():
            for key in ((queue, kind), (queue, EVERY), (EVERY, kind), (EVERY, EVERY)):
                into = summed.get(key)
                if into is None:
                    summed[key] = [runs, list(wait), list(run)]
                else:
                    into[0] += runs
                    into[1] = [a + b for a, b in zip(into[1], wait, strict=False)]
                    into[2] = [a + b for a, b in zip(into[2], run, strict=False)]
        document = [
            {"queue": queue, "kind": kind, "runs": runs, "wait": wait, "run": run}
            for (queue, kind), (runs, wait, run) in sorted(summed.items())
        ]
        db.rowcount(sql.RECORD_KIND_STATS, {"kinds": json.dumps(document)}, using)

    def sum_hours(self, *, using: str | None = None) -> int:
        """Sum the minutes of each ended hour not yet summed into
        `pgjobs_kind_stats_hour` (the sweeper's; once per hour). Returns the rows written."""
        return db.rowcount(sql.SUM_KIND_STATS_HOURS, {}, using)

    def prune(self, limit: int, *, using: str | None = None) -> int:
        """Delete up to `limit` minutes older than a day, and up to `limit` hours older
        than STATS_HOURS_KEPT."""
        hours = {"limit": limit, "hours": STATS_HOURS_KEPT}
        return db.rowcount(sql.PRUNE_KIND_STATS, {"limit": limit}, using) + db.rowcount(
            sql.PRUNE_KIND_STATS_HOURS, hours, using
        )

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
        shape = SPANS.get(span)
        if shape is None:
            raise ValueError(f"span is one of {', '.join(SPANS)}, not {span!r:.40}.")
        [(since, minutes_from, *summed)] = db.fetchall(
            sql.SPAN_START, {"minutes": shape.minutes, "hours": shape.hourly}, using
        )
        scope = _Scope(since, shape.minutes, shape.bucket_min, queue, kind)
        if shape.hourly:
            # The summed hours are written once: read and added once per process while
            # they are the span's (the same hours, as many rows, the same newest), then
            # copied. A summed hour edited by hand shows when the span moves on.
            key = (db.alias(using), span, queue, kind, since, minutes_from, *summed)
            with _HOURS_LOCK:
                hours = _HOURS.get(key)
            if hours is None:
                hours = scope.empty()
                params = {"since": since, "until": minutes_from, "queue": queue, "kind": kind}
                hours.add_rows(db.fetchall(sql.KIND_STATS_HOURS, params, using))
                with _HOURS_LOCK:
                    _HOURS[key] = hours
                    while len(_HOURS) > _HOURS_KEPT:
                        _HOURS.pop(next(iter(_HOURS)))
            sums = hours.copy()
        else:
            sums = scope.empty()
        params = {"minutes_from": minutes_from, "queue": queue, "kind": kind}
        sums.add_rows(db.fetchall(sql.KIND_STATS_MINUTES, params, using))
        over_time, by_queue, by_kind = sums.over_time, sums.by_queue, sums.by_kind
        width = len(LATENCY_BUCKETS_S)
        if queue is not None:  # the tables of one queue, or of one kind: its own sums
            by_queue = {queue: _total(over_time, width)} if any(s.any for s in over_time) else {}
        if kind is not None:
            by_kind = {kind: _total(over_time, width)} if any(s.any for s in over_time) else {}
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


#: Per process, the latest sums of summed hours, by database, span, scope and the hours
#: they cover (at most _HOURS_KEPT of them, the oldest dropped first).
_HOURS: dict[tuple[Any, ...], _SpanSums] = {}
_HOURS_LOCK = threading.Lock()
_HOURS_KEPT = 64


@dataclass(frozen=True)
class _Scope:
    """What a latency report sums: from `since`, in buckets of `bucket_min` minutes,
    of one queue and one kind (None: all)."""

    since: datetime
    minutes: int
    bucket_min: int
    queue: str | None
    kind: str | None

    def empty(self) -> _SpanSums:
        buckets = -(-self.minutes // self.bucket_min)
        return _SpanSums(self, [_Sums(len(LATENCY_BUCKETS_S)) for _ in range(buckets)], {}, {})


@dataclass
class _SpanSums:
    """A report's histograms being summed: over time, per queue and per kind."""

    scope: _Scope
    over_time: list[_Sums]
    by_queue: dict[str, _Sums]
    by_kind: dict[str, _Sums]

    def copy(self) -> _SpanSums:
        return _SpanSums(
            self.scope,
            [sums.copy() for sums in self.over_time],
            {name: sums.copy() for name, sums in self.by_queue.items()},
            {name: sums.copy() for name, sums in self.by_kind.items()},
        )

    def add_rows(self, rows: Iterable[tuple[Any, ...]]) -> None:
        """Add rows (at, queue, kind, wait histogram, run histogram) of the scope's sums
        (EVERY where it is open): the series takes the scope's own, the tables those of
        each queue or kind in it."""
        scope = self.scope
        scope_queue, scope_kind = scope.queue or EVERY, scope.kind or EVERY
        bucket_s = scope.bucket_min * 60
        last = len(self.over_time) - 1
        width = len(LATENCY_BUCKETS_S)
        for at, row_queue, row_kind, wait, run in rows:
            if row_queue == scope_queue and row_kind == scope_kind:
                index = int((at - scope.since).total_seconds() // bucket_s)
                sums = self.over_time[min(max(index, 0), last)]
            elif row_kind == scope_kind and row_queue != EVERY:
                sums = self.by_queue.setdefault(row_queue, _Sums(width))
            elif row_queue == scope_queue and row_kind != EVERY:
                sums = self.by_kind.setdefault(row_kind, _Sums(width))
            else:
                continue
            sums.add(wait, run)


class _Sums:
    """Two histograms summed bucket by bucket (a row's shorter list adds to its first
    buckets; a longer one's extra buckets go to the last)."""

    __slots__ = ("run", "wait")

    def __init__(self, width: int) -> None:
        self.wait = [0] * width
        self.run = [0] * width

    def copy(self) -> _Sums:
        other = _Sums(0)
        other.wait, other.run = list(self.wait), list(self.run)
        return other

    def add(self, wait: Any, run: Any) -> None:
        self.wait = _added(self.wait, wait)
        self.run = _added(self.run, run)

    @property
    def any(self) -> bool:
        return any(self.wait)

    def latency(self) -> Latency:
        return Latency(
            runs=sum(self.wait),
            wait_p50_s=percentile(self.wait, 0.50),
            wait_p95_s=percentile(self.wait, 0.95),
            run_p50_s=percentile(self.run, 0.50),
            run_p95_s=percentile(self.run, 0.95),
        )


def _total(parts: Sequence[_Sums], width: int) -> _Sums:
    total = _Sums(width)
    for part in parts:
        total.add(part.wait, part.run)
    return total


def _added(into: list[int], stored: Any) -> list[int]:
    """`into` plus a stored histogram, bucket by bucket. A row as the workers write it
    takes the quick way; one edited by hand (not a list, counts that are not whole
    numbers, another length) adds what it can and counts the rest as none."""
    counts = _histogram(stored)
    if counts is None:
        return into
    if len(counts) == len(into) and all(type(count) is int and count >= 0 for count in counts):
        return [a + b for a, b in zip(into, counts, strict=True)]
    into = list(into)
    last = len(into) - 1
    for index, count in enumerate(counts):
        into[min(index, last)] += _count(count)
    return into


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
