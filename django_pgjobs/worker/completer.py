"""The completer: outcomes buffered as handlers finish, recorded many at a time.

Each flush writes one statement per verdict (acks, retries, failures, cancellations,
timeouts: S17). A cancelled run (S32) is dead-lettered as cancelled only if its claim is
still current (a transaction held the row when the cancel came); otherwise the cancel
already moved the job and the write changes nothing. An outage
keeps the outcomes buffered, to be tried again once the database is back (a claim that
lapsed meanwhile is refused, S10, and its job runs again). A statement the database
refuses for its data is tried job by job, and a job whose outcome cannot be stored is
dead-lettered alone (S27).

The worker's connection waits for a row lock a bounded time (TUNE_WORKER_SESSION's
lock_timeout): a job whose row an application transaction holds (a child written
`after=` it, a trigger merged into it) is set aside, its claim kept and heartbeaten,
and tried again a moment later, while the others are recorded (S39).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Any

from django_pgjobs.claims import (
    DEAD,
    LOST,
    RETRIED,
    Failure,
    JobHandle,
    Outcome,
    Verdict,
    run_after_recorded,
)
from django_pgjobs.managers import JobManager
from django_pgjobs.states import DeadCategory
from django_pgjobs.worker.executor import cancellation_of
from django_pgjobs.worker.faults import Faults, describe, is_lock_timeout, is_outage
from django_pgjobs.worker.stats import WorkerStats

logger = logging.getLogger("django_pgjobs.worker")

#: After a job's row stayed held past the lock wait, its outcome is tried again after
#: this long, doubled each time it is still held, up to HELD_RETRY_MAX_S.
HELD_RETRY_MIN_S = 0.5
HELD_RETRY_MAX_S = 5.0


class Completer:
    """Buffers the outcomes of finished runs and records them (S12-S17, S27)."""

    def __init__(
        self,
        jobs: JobManager,
        stats: WorkerStats,
        faults: Faults,
        *,
        keep: Callable[[JobHandle], None] = lambda handle: None,
        let_go: Callable[[JobHandle], None] = lambda handle: None,
    ) -> None:
        self.jobs = jobs
        self.stats = stats
        self.faults = faults
        self.aside = SetAside(keep, let_go)
        self._acks: list[tuple[JobHandle, Any]] = []
        self._retries: list[tuple[JobHandle, Failure, float | None]] = []
        self._fails: list[tuple[JobHandle, Failure]] = []
        self._cancels: list[tuple[JobHandle, Failure]] = []
        self._timeouts: list[tuple[JobHandle, Failure, float | None]] = []

    @property
    def unflushed(self) -> bool:
        """Whether outcomes wait to be recorded (set aside ones included)."""
        return self._buffered or self.aside.holds

    @property
    def buffered(self) -> int:
        """How many outcomes wait to be recorded (set aside ones included)."""
        return sum(len(buffer) for buffer in self._buffers) + self.aside.count

    @property
    def _buffers(self) -> tuple[list[Any], ...]:
        return (self._acks, self._retries, self._fails, self._cancels, self._timeouts)

    @property
    def _buffered(self) -> bool:
        return any(self._buffers)

    def flush_due(self, now: float) -> bool:
        """Whether a flush has something to try now (set aside outcomes wait their turn)."""
        return self._buffered or self.aside.due(now)

    def timed_out(self, outcome: Outcome) -> None:
        """Buffer the attempt of a handler the worker abandoned at its timeout (S33)."""
        assert outcome.failure is not None
        self._timeouts.append((outcome.handle, outcome.failure, outcome.delay))

    def take(self, outcome: Outcome) -> None:
        """Buffer what is left to record of `outcome` (counting what needs nothing)."""
        verdict = outcome.verdict
        if verdict is Verdict.ACK:
            self._acks.append((outcome.handle, outcome.result))
        elif verdict is Verdict.RETRY and outcome.failure is not None:
            self._retries.append((outcome.handle, outcome.failure, outcome.delay))
        elif verdict is Verdict.FAIL and outcome.failure is not None:
            self._fails.append((outcome.handle, outcome.failure))
        elif verdict is Verdict.CANCELLED:
            self.stats.cancelled += 1
            if not outcome.handle.finished:  # transaction mode recorded it already
                self._cancels.append((outcome.handle, cancellation_of(outcome.handle)))
        else:
            self._count_recorded(outcome)

    def flush(self, *, last: bool = False) -> bool:
        """Record every buffered outcome; False when an outage left some buffered. The
        outcomes set aside are tried again, each alone, once due (`last`: now, at a stop)."""
        due = self.aside.take_due(time.monotonic(), force=last)
        for tried, (record, entry) in enumerate(due):
            if not self._record_one_by_one([entry], record):
                # An outage: this one and those not tried yet stay set aside, their
                # claims kept, for the try after the outage.
                self.aside.put_back(due[tried:])
                return False
        if not self._buffered:
            return True
        batches: tuple[tuple[list[Any], Callable[[list[Any]], None]], ...] = (
            (self._acks, self._record_acks),
            (self._retries, self._record_retries),
            (self._fails, self._record_fails),
            (self._cancels, self._record_cancels),
            (self._timeouts, self._record_timeouts),
        )
        for buffer, record in batches:
            if buffer and not self._record(buffer, record):
                return False
        self.faults.recovered()
        self.stats.last_recorded_at = time.time()
        return True

    def _record(self, buffer: list[Any], record: Callable[[list[Any]], None]) -> bool:
        """Record the outcomes of `buffer` (each a tuple starting with its handle) and
        empty it; return False when an outage stopped it, leaving the rest buffered."""
        try:
            record(buffer)
        except Exception as error:
            if is_lock_timeout(error):
                if len(buffer) == 1:  # no need to wait for it twice
                    self.aside.hold(record, buffer.pop())
                    return True
                return self._record_one_by_one(buffer, record)
            if is_outage(error):
                self.faults.failed("record outcomes", error)
                return False
            logger.warning(
                "the database refused a batch of %s outcomes (%s); recording them one by one",
                len(buffer),
                describe(error),
            )
        else:
            self._recorded(buffer)
            buffer.clear()
            return True
        return self._record_one_by_one(buffer, record)

    def _record_one_by_one(self, buffer: list[Any], record: Callable[[list[Any]], None]) -> bool:
        """Record `buffer` entry by entry: one whose row stays held past the lock wait is
        set aside (S39), one the database refuses is dead-lettered alone (S27); False
        when an outage stopped it, leaving the rest buffered."""
        while buffer:
            try:
                record(buffer[:1])
            except Exception as refused:
                if is_lock_timeout(refused):
                    self.aside.hold(record, buffer[0])
                    del buffer[0]
                    continue
                if is_outage(refused):
                    self.faults.failed("record outcomes", refused)
                    return False
                if not self._bury_unstorable(buffer[0][0], refused):
                    return False
            else:
                self._recorded(buffer[:1])
            del buffer[0]
        return True

    def _recorded(self, entries: list[Any]) -> None:
        run_after_recorded(entry[0] for entry in entries)
        self.aside.recorded([entry[0] for entry in entries])

    def _record_acks(self, acks: list[tuple[JobHandle, Any]]) -> None:
        handles = [handle for handle, _ in acks]
        acked = self.jobs.ack_batch(handles, [result for _, result in acks])
        # A claim a cancel request bound (S38) was dead-lettered instead, and told.
        cancelled = sum(1 for handle in handles if handle.cancelled)
        self.stats.succeeded += acked
        self.stats.cancelled += cancelled
        self.stats.lost += len(handles) - acked - cancelled

    def _record_retries(self, retries: list[tuple[JobHandle, Failure, float | None]]) -> None:
        recorded = self.jobs.retry_batch(retries)
        self._count_retries([handle for handle, _, _ in retries], recorded)

    def _count_retries(self, handles: list[JobHandle], recorded: int) -> None:
        # A claim a cancel request bound (S38) was dead-lettered instead, and told; one
        # abandoned at its timeout was told to stop too, and is a retry all the same.
        cancelled = sum(1 for handle in handles if _bound_by_cancel(handle))
        spent = sum(
            1 for handle in handles if handle.is_last_attempt and not _bound_by_cancel(handle)
        )
        self.stats.dead += spent
        self.stats.retried += recorded - spent
        self.stats.cancelled += cancelled
        self.stats.lost += len(handles) - recorded - cancelled

    def _record_fails(self, fails: list[tuple[JobHandle, Failure]]) -> None:
        recorded = self.jobs.fail_batch(fails)
        self.stats.dead += recorded
        self.stats.lost += len(fails) - recorded

    def _record_cancels(self, cancels: list[tuple[JobHandle, Failure]]) -> None:
        # Counted as cancelled when taken; most were moved by the cancel itself.
        self.jobs.fail_batch(cancels)

    def _record_timeouts(self, timeouts: list[tuple[JobHandle, Failure, float | None]]) -> None:
        recorded = self.jobs.time_out_batch(timeouts)
        self._count_retries([handle for handle, _, _ in timeouts], recorded)

    def _bury_unstorable(self, handle: JobHandle, refused: Exception) -> bool:
        """Dead-letter a job whose outcome the database refused to store (S27); return
        False when an outage stopped that too (the outcome stays buffered)."""
        reason = f"the outcome could not be stored: {describe(refused)}"
        try:
            failure = Failure.from_exception(refused, reason, category=DeadCategory.UNSTORABLE)
            buried = self.jobs.fail_batch([(handle, failure)])
        except Exception as error:
            if is_outage(error):
                self.faults.failed("record outcomes", error)
                return False
            logger.error(
                "job id=%s kind=%s: %s, and the job could not be dead-lettered either (%s); "
                "it runs again once its claim lapses",
                handle.id,
                handle.kind,
                reason,
                describe(error),
            )
            self.stats.lost += 1
            return True
        logger.error(
            "job dead id=%s kind=%s attempt=%s/%s reason=%r",
            handle.id,
            handle.kind,
            handle.attempt,
            handle.max_attempts,
            reason,
        )
        self._recorded([(handle,)])
        self.stats.dead += buried
        self.stats.lost += 1 - buried
        return True

    def _count_recorded(self, outcome: Outcome) -> None:
        """Count an outcome nothing is left to record of: lost, or completed by the
        handler itself (a fence, transaction mode)."""
        self.stats.last_recorded_at = time.time()
        ended = outcome.ending
        if ended == LOST:
            self.stats.lost += 1
        elif ended == DEAD:
            self.stats.dead += 1
        elif ended == RETRIED:
            self.stats.retried += 1
        else:
            self.stats.succeeded += 1


class SetAside:
    """Outcomes whose job's row a transaction held past the lock wait (S39), each with
    the function that records it: their claims are kept (`keep`: heartbeaten) until they
    are recorded (`let_go`), and they are tried again, each alone, after a backoff."""

    def __init__(
        self, keep: Callable[[JobHandle], None], let_go: Callable[[JobHandle], None]
    ) -> None:
        self._keep = keep
        self._let_go = let_go
        self._held: list[tuple[Callable[[list[Any]], None], Any]] = []
        self._backoff_s = 0.0
        #: When the outcomes set aside are tried again (monotonic; None: none held).
        self.retry_at: float | None = None

    @property
    def holds(self) -> bool:
        return bool(self._held)

    @property
    def count(self) -> int:
        return len(self._held)

    def due(self, now: float) -> bool:
        return self.retry_at is not None and now >= self.retry_at

    def hold(self, record: Callable[[list[Any]], None], entry: Any) -> None:
        """Try `entry` again later: a transaction holds its job's row."""
        handle = entry[0]
        self._held.append((record, entry))
        self._keep(handle)
        self._backoff_s = min(HELD_RETRY_MAX_S, max(HELD_RETRY_MIN_S, self._backoff_s * 2))
        self.retry_at = time.monotonic() + self._backoff_s
        logger.info(
            "job id=%s kind=%s: a transaction holds its row; its outcome is recorded once "
            "that ends (trying again in %.1fs)",
            handle.id,
            handle.kind,
            self._backoff_s,
        )

    def take_due(
        self, now: float, *, force: bool = False
    ) -> list[tuple[Callable[[list[Any]], None], Any]]:
        """The outcomes set aside, to be tried again, once due (`force`: now)."""
        if not self._held or not (force or self.due(now)):
            return []
        taken, self._held = self._held, []
        self.retry_at = None
        return taken

    def put_back(self, entries: list[tuple[Callable[[list[Any]], None], Any]]) -> None:
        """Set aside again outcomes taken to be tried (an outage stopped the try): due
        at once once the outage is over, their claims still kept."""
        self._held = entries + self._held
        now = time.monotonic()
        self.retry_at = now if self.retry_at is None else min(self.retry_at, now)

    def recorded(self, handles: list[JobHandle]) -> None:
        """These outcomes are recorded: their claims are no longer kept."""
        for handle in handles:
            self._let_go(handle)
        if handles and not self._held:
            self._backoff_s = 0.0


def _bound_by_cancel(handle: JobHandle) -> bool:
    """Whether a cancel (S32, S38), not the worker at a timeout (S33), stopped the run."""
    return handle.cancelled and not handle.control.abandoned
