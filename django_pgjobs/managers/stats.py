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
        self, counts: Mapping[str, tuple[int, int, int]], *, using: str | None = None
    ) -> None:
        """Add (succeeded, retried, dead) per queue to the current minute."""
        if not counts:
            return
        queues = sorted(counts)
        params = {
            "queues": queues,
            "succeeded": [counts[queue][0] for queue in queues],
            "retried": [counts[queue][1] for queue in queues],
            "dead": [counts[queue][2] for queue in queues],
        }
        db.rowcount(sql.RECORD_STATS, params, using)

    def throughput(self, minutes: int = 60, *, using: str | None = None) -> list[ThroughputPoint]:
        """Jobs finished and failed attempts per minute, oldest first (every minute)."""
        rows = db.fetchall(sql.THROUGHPUT, {"minutes": int(minutes)}, using)
        return [ThroughputPoint(minute, int(ok), int(bad)) for minute, ok, bad in rows]

    def prune(self, limit: int, *, using: str | None = None) -> int:
        """Delete up to `limit` minutes older than a day."""
        return db.rowcount(sql.PRUNE_STATS, {"limit": limit}, using)
