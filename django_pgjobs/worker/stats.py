"""What a worker counts: its life's counters (the status line) and the per-minute counts
it adds to `pgjobs_stats` and `pgjobs_kind_stats` (the dashboard's charts)."""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field

from django_pgjobs.claims import CANCELLED, LOST, RETRIED, SUCCEEDED, Outcome, Verdict
from django_pgjobs.managers.stats import LATENCY_BUCKETS_S, bucket_of
from django_pgjobs.models import JobStats, KindStats

logger = logging.getLogger("django_pgjobs.worker")

#: Seconds between two writes of a worker's per-minute counts (the admin's chart).
STATS_INTERVAL_S = 10.0


@dataclass
class WorkerStats:
    """Counters of one worker's life, read by the status line."""

    claimed: int = 0
    succeeded: int = 0
    retried: int = 0
    dead: int = 0
    cancelled: int = 0
    lost: int = 0
    in_flight: int = 0
    #: Handlers abandoned at their timeout (S33) whose threads still run (S39).
    abandoned: int = 0
    started_at: float = field(default_factory=time.monotonic)
    #: Wall-clock times (time.time()) of the first claim and the last recorded outcome,
    #: for measuring a drain; never compared with the database's clock.
    first_claim_at: float | None = None
    last_recorded_at: float | None = None

    @property
    def finished(self) -> int:
        return self.succeeded + self.retried + self.dead + self.cancelled + self.lost


#: Buckets of each latency histogram.
_BUCKETS = len(LATENCY_BUCKETS_S)

#: Where an ending is counted (anything else is a dead letter).
_COLUMN = {SUCCEEDED: 0, RETRIED: 1, CANCELLED: 3}


class MinuteCounts:
    """Per queue, the jobs finished, retried, dead-lettered and cancelled since the last
    write to `pgjobs_stats`, and per queue and kind the runs' queue wait and run time
    histograms (`pgjobs_kind_stats`), written every STATS_INTERVAL_S (and once at the end)."""

    def __init__(self, using: str) -> None:
        self.using = using
        self._counts: dict[str, list[int]] = {}
        #: Per queue and kind: runs, then the wait histogram's buckets, then the run
        #: time's.
        self._kinds: dict[tuple[str, str], list[int]] = {}
        self._next_at = time.monotonic() + STATS_INTERVAL_S

    def count(self, outcome: Outcome) -> None:
        # An ack is most outcomes: counted without working out how the run ended.
        ended = SUCCEEDED if outcome.verdict is Verdict.ACK else outcome.ending
        if ended == LOST:
            return
        counts = self._counts.get(outcome.handle.queue)
        if counts is None:
            counts = self._counts[outcome.handle.queue] = [0, 0, 0, 0]
        counts[_COLUMN.get(ended, 2)] += 1
        handle = outcome.handle
        key = (handle.queue, handle.kind)
        latencies = self._kinds.get(key)
        if latencies is None:
            latencies = self._kinds[key] = [0] * (1 + 2 * _BUCKETS)
        latencies[0] += 1
        # Both ends of the wait are the database's timestamps (S22); a rerun's run_after
        # may come after the claim that ran it: no wait.
        waited = (handle.claimed_at - handle.run_after).total_seconds()
        latencies[1 + bucket_of(max(waited, 0.0))] += 1
        latencies[1 + _BUCKETS + bucket_of(outcome.duration)] += 1

    def write(self, now: float, *, final: bool = False) -> None:
        """Write the counts if they are due (`final`: whatever the time)."""
        if not self._counts or (now < self._next_at and not final):
            return
        self._next_at = now + STATS_INTERVAL_S
        counts = {queue: (c[0], c[1], c[2], c[3]) for queue, c in self._counts.items()}
        kinds = {
            key: (k[0], k[1 : 1 + _BUCKETS], k[1 + _BUCKETS :]) for key, k in self._kinds.items()
        }
        self._counts, self._kinds = {}, {}
        try:
            JobStats.objects.record(counts, using=self.using)
            KindStats.objects.record(kinds, using=self.using)
        except Exception as error:
            # Only the chart loses these counts: not worth a retry or a reconnect here.
            logger.debug("could not record the per-minute counts: %s", error)
