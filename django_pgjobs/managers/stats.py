"""`JobStats.objects`: the per-minute counts the workers keep, and what the chart reads."""

from __future__ import annotations

import json
from bisect import bisect_left
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING

from django.db import models

from django_pgjobs.db import connection as db
from django_pgjobs.db import sql
from django_pgjobs.records import KindLatency, ThroughputPoint

if TYPE_CHECKING:
    from django_pgjobs.models import JobStats, KindStats  # noqa: F401

#: The upper bounds (seconds) of the latency histograms' buckets; the last is unbounded.
LATENCY_BUCKETS_S: tuple[float, ...] = (
    0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300, 900, 3600,
    float("inf"),
)  # fmt: skip


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
        self, buckets: int = 60, *, bucket_min: int = 1, using: str | None = None
    ) -> list[ThroughputPoint]:
        """Jobs done, retried, dead-lettered and cancelled per bucket of `bucket_min`
        minutes (a divisor of 60), the last `buckets` of them, oldest first."""
        if bucket_min < 1 or 60 % bucket_min:
            raise ValueError("bucket_min must divide an hour: 1, 2, 3, 5, 10, 15, 30 or 60.")
        params = {"buckets": int(buckets), "bucket_min": int(bucket_min)}
        rows = db.fetchall(sql.THROUGHPUT, params, using)
        return [ThroughputPoint(at, *(int(n) for n in counts)) for at, *counts in rows]

    def prune(self, limit: int, *, using: str | None = None) -> int:
        """Delete up to `limit` minutes older than a day."""
        return db.rowcount(sql.PRUNE_STATS, {"limit": limit}, using)


class KindStatsManager(models.Manager["KindStats"]):
    """Per kind and minute, runs and their latency histograms (the dashboard's p50/p95)."""

    def record(
        self,
        kinds: Mapping[str, tuple[int, Sequence[int], Sequence[int]]],
        *,
        using: str | None = None,
    ) -> None:
        """Add (runs, wait histogram, run histogram) per kind to the current minute."""
        if not kinds:
            return
        document = [
            {"kind": kind, "runs": runs, "wait": list(wait), "run": list(run)}
            for kind, (runs, wait, run) in sorted(kinds.items())
        ]
        db.rowcount(sql.RECORD_KIND_STATS, {"kinds": json.dumps(document)}, using)

    def latency(self, minutes: int = 60, *, using: str | None = None) -> list[KindLatency]:
        """Per kind over the last `minutes`: runs, and the p50/p95 of queue wait and run
        time, each the upper bound of the bucket it falls in (None: no run)."""
        rows = db.fetchall(sql.KIND_LATENCY, {"minutes": int(minutes)}, using)
        by_kind: dict[str, tuple[list[int], list[int]]] = {}
        for kind, _index, waited, ran in rows:  # in bucket order, kind by kind
            wait, run = by_kind.setdefault(kind, ([], []))
            wait.append(int(waited))
            run.append(int(ran))
        return [
            KindLatency(
                kind=kind,
                runs=sum(wait),
                wait_p50_s=percentile(wait, 0.50),
                wait_p95_s=percentile(wait, 0.95),
                run_p50_s=percentile(run, 0.50),
                run_p95_s=percentile(run, 0.95),
            )
            for kind, (wait, run) in sorted(by_kind.items())
        ]

    def prune(self, limit: int, *, using: str | None = None) -> int:
        """Delete up to `limit` kind-minutes older than a day."""
        return db.rowcount(sql.PRUNE_KIND_STATS, {"limit": limit}, using)


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
