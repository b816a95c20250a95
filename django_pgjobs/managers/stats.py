"""`JobStats.objects`: the per-minute counts the workers keep, and what the chart reads."""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING

from django.db import models

from django_pgjobs.db import connection as db
from django_pgjobs.db import sql
from django_pgjobs.records import ThroughputPoint

if TYPE_CHECKING:
    from django_pgjobs.models import JobStats  # noqa: F401


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
