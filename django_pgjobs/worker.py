"""The worker: a claim loop feeding a pool of handler threads (DESIGN S20-S26).

One thread (the caller's) runs the loop: claim up to the free slots in one statement,
hand the jobs to the pool, record the outcomes of many jobs in one statement, heartbeat
the leases of running jobs, and sleep on the LISTEN socket until a job arrives, a handler
finishes, the next scheduled job is due, or the poll interval ends. The loop holds no
SQL: every database call is a `Job.objects` method.

While jobs are short, the loop also claims some ahead of its free threads (prefetch), so
that the threads find the next job waiting while the loop records and claims: the
database statements then cost the threads nothing. It claims only as many as the threads
start within PREFETCH_WAIT_S at the recent run time, so slow jobs are never held back
from other workers, and it hands back the waiting ones at once when asked to stop.

Nothing a crash could lose is kept in memory (S26): a claim that is never recorded comes
back when its lease lapses.
"""

from __future__ import annotations

import contextlib
import logging
import os
import queue
import random
import select
import signal
import socket
import threading
import time
import uuid
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import timedelta
from types import FrameType
from typing import Any

import psycopg
from django.db import DatabaseError, connections

from django_pgjobs import registry
from django_pgjobs.conf import pgjobs_settings
from django_pgjobs.exceptions import InvalidJobOption
from django_pgjobs.executor import Executor, Outcome, Verdict
from django_pgjobs.faults import describe, is_outage, read_only
from django_pgjobs.handles import Failure, JobHandle
from django_pgjobs.listener import Listener
from django_pgjobs.maintenance import Sweeper
from django_pgjobs.schedules import Scheduler

logger = logging.getLogger("django_pgjobs.worker")

#: Heartbeat a running job when this fraction of its lease has passed since the last one.
HEARTBEAT_FRACTION = 1 / 3
#: Longest wait between attempts to reach a database that went away.
RECONNECT_BACKOFF_CAP_S = 30.0
#: Seconds between two writes of this worker's per-minute counts (the admin's chart).
STATS_INTERVAL_S = 10.0
#: After the first of a batch of jobs finishes, wait up to this long for the rest, so
#: that fast jobs are recorded (and their slots refilled) many at a time.
GATHER_S = 0.002
#: The longest a job claimed ahead (prefetched) should wait for a free thread, judged by
#: the recent run time of this worker's jobs.
PREFETCH_WAIT_S = 0.05
#: Weight of the latest run in the worker's mean run time.
RUN_TIME_WEIGHT = 0.2


def default_worker_id() -> str:
    """host:pid:random, unique per process and readable in the admin."""
    return f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:6]}"


def default_queues() -> list[str]:
    """Every queue this process knows of: the default one, the configured ones, and the
    queues the registered jobs name."""
    names = [pgjobs_settings.DEFAULT_QUEUE, *pgjobs_settings.QUEUES]
    for kind in registry.registered_kinds():
        definition = registry.get_definition(kind)
        if definition is not None and "queue" in definition.defaults:
            names.append(definition.defaults["queue"])
    return list(dict.fromkeys(names))


@dataclass
class WorkerStats:
    """Counters of one worker's life, read by the status line."""

    claimed: int = 0
    succeeded: int = 0
    retried: int = 0
    dead: int = 0
    lost: int = 0
    in_flight: int = 0
    started_at: float = field(default_factory=time.monotonic)
    #: Wall-clock times (time.time()) of the first claim and the last recorded outcome,
    #: for measuring a drain; never compared with the database's clock.
    first_claim_at: float | None = None
    last_recorded_at: float | None = None

    @property
    def finished(self) -> int:
        return self.succeeded + self.retried + self.dead + self.lost


@dataclass(eq=False)
class _Running:
    handle: JobHandle
    next_heartbeat: float
    #: Transaction mode: once started, the job's row lock keeps claimers away.
    atomic: bool
    #: When the claim lapses at the latest, on this process's monotonic clock: measured
    #: from after the claim or heartbeat statement returned, so never before the
    #: database's claimed_until. A job still waiting for a thread then is not started.
    lease_ends: float
    #: Set by the handler thread that takes the job (a prefetched job waits until then).
    started: bool = False

    @property
    def heartbeats(self) -> bool:
        return not (self.atomic and self.started)


class Worker:
    """Claims jobs of `queues` and runs them on `concurrency` handler threads.

    Args:
        queues: the queues to claim from (default: every queue this process knows).
        concurrency: handler threads.
        prefetch: the most jobs claimed ahead of free threads while jobs are short
            (default: the PREFETCH setting; 0: none).
        worker_id: stamped on every claim (default: host:pid:random).
        burst: drain the jobs that are runnable now, then return.
        max_jobs: stop after claiming this many jobs (and finishing them).
        poll_interval: seconds between polls when no notification arrives.
        shutdown_grace: seconds in-flight jobs get to finish after a stop request.
        sweep_interval: seconds between sweeps (0: never sweep from this worker).
        schedules: run the periodic schedules (default: PGJOBS["SCHEDULER"], never in
            burst mode).
        listen: LISTEN for wake-ups (default: the NOTIFY setting).
        on_status: called with the stats about every `status_interval` seconds.
    """

    def __init__(
        self,
        *,
        queues: Sequence[str] | None = None,
        concurrency: int | None = None,
        prefetch: int | None = None,
        worker_id: str | None = None,
        burst: bool = False,
        max_jobs: int | None = None,
        poll_interval: float | None = None,
        shutdown_grace: float | None = None,
        sweep_interval: float | None = None,
        schedules: bool | None = None,
        listen: bool | None = None,
        on_status: Callable[[WorkerStats], None] | None = None,
        status_interval: float = 1.0,
        using: str | None = None,
    ) -> None:
        from django_pgjobs import options

        self.queues = options.validate_queue_names(queues or default_queues())
        self.concurrency = concurrency or pgjobs_settings.CONCURRENCY
        if self.concurrency < 1:
            raise ValueError("concurrency must be at least 1.")
        self.prefetch = pgjobs_settings.PREFETCH if prefetch is None else prefetch
        if self.prefetch < 0:
            raise ValueError("prefetch must not be negative.")
        self.worker_id = options.validate_worker_id(worker_id or default_worker_id())
        self.burst = burst
        self.max_jobs = max_jobs
        self.poll_interval = _seconds(poll_interval, pgjobs_settings.POLL_INTERVAL)
        self.shutdown_grace = _seconds(shutdown_grace, pgjobs_settings.SHUTDOWN_GRACE)
        self.sweep_interval = _seconds(sweep_interval, pgjobs_settings.SWEEP_INTERVAL)
        self.schedules = (
            (pgjobs_settings.SCHEDULER and not burst) if schedules is None else schedules
        )
        self.listen = pgjobs_settings.NOTIFY if listen is None else listen
        self.on_status = on_status
        self.status_interval = status_interval
        self.using = using or pgjobs_settings.DATABASE
        self.stats = WorkerStats()

        self._work: queue.SimpleQueue[_Running | None] = queue.SimpleQueue()
        self._completed: deque[Outcome] = deque()
        self._completion_lock = threading.Lock()
        #: Jobs handed to the pool whose outcome has not been appended yet.
        self._outstanding = 0
        self._running: dict[uuid.UUID, _Running] = {}
        self._acks: list[tuple[JobHandle, Any]] = []
        self._retries: list[tuple[JobHandle, Failure, float | None]] = []
        self._fails: list[tuple[JobHandle, Failure]] = []
        self._threads: list[threading.Thread] = []
        self._wake_r, self._wake_w = os.pipe()
        os.set_blocking(self._wake_r, False)
        os.set_blocking(self._wake_w, False)
        self._listener = Listener(
            using=self.using, channel=pgjobs_settings.CHANNEL, dsn=pgjobs_settings.LISTEN_DSN
        )
        self._listener_probed = False
        self._listener_retry_at = 0.0
        self._maybe_more = True
        self._next_poll = 0.0
        self._next_due: float | None = None
        self._db_retry_at = 0.0
        self._db_failures = 0
        self._read_only_warned = False
        self._stop_requested = threading.Event()
        self._stop_deadline: float | None = None
        self._signals = 0
        self._background_stop = threading.Event()
        self._last_status = 0.0
        self._gather_started: float | None = None
        #: Per queue: [succeeded, retried, dead] since the last write to pgjobs_stats.
        self._minute_counts: dict[str, list[int]] = {}
        self._next_stats_at = time.monotonic() + STATS_INTERVAL_S
        #: The earliest next_heartbeat among running jobs (inf: none due).
        self._next_heartbeat_at = float("inf")
        #: Mean run time of this worker's jobs (None: none ran yet), for prefetching.
        self._mean_run_s: float | None = None
        self._waiting_released = False

    # Lifecycle ---------------------------------------------------------------------

    def run(self) -> int:
        """Run until stopped (or drained, in burst mode); return the exit status."""
        restore = self._install_signal_handlers()
        try:
            self._sync_queue_limits()
            self._start_threads()
            logger.info(
                "worker started id=%s queues=%s concurrency=%s burst=%s listen=%s",
                self.worker_id,
                ",".join(self.queues),
                self.concurrency,
                self.burst,
                self.listen,
            )
            self._loop()
        finally:
            self._shutdown()
            restore()
        stats = self.stats
        logger.info(
            "worker stopped id=%s claimed=%s succeeded=%s retried=%s dead=%s lost=%s "
            "first_claim_at=%s last_recorded_at=%s",
            self.worker_id,
            stats.claimed,
            stats.succeeded,
            stats.retried,
            stats.dead,
            stats.lost,
            f"{stats.first_claim_at:.6f}" if stats.first_claim_at else "-",
            f"{stats.last_recorded_at:.6f}" if stats.last_recorded_at else "-",
        )
        return 0

    def _sync_queue_limits(self) -> None:
        """Apply the queue limits of the settings (a later worker applies them again)."""
        from django_pgjobs.models import QueueControl

        try:
            QueueControl.objects.sync_settings(using=self.using)
        except DatabaseError as error:
            logger.warning("queue limits of the settings not applied: %s", error)
            connections[self.using].close()

    def stop(self) -> None:
        """Ask the worker to stop: no more claims; in-flight jobs get the grace period."""
        if not self._stop_requested.is_set():
            self._stop_deadline = time.monotonic() + self.shutdown_grace
            self._stop_requested.set()
        self._wake()

    def _install_signal_handlers(self) -> Callable[[], None]:
        if threading.current_thread() is not threading.main_thread():
            return lambda: None
        previous = {sig: signal.getsignal(sig) for sig in (signal.SIGTERM, signal.SIGINT)}

        def on_signal(signum: int, frame: FrameType | None) -> None:
            self._signals += 1
            if self._signals > 1:
                # A second signal: leave now. Leases bring the in-flight jobs back.
                os.write(
                    2, b"\nSecond signal: exiting now; running jobs return after their lease.\n"
                )
                os._exit(128 + signum)
            self.stop()

        for sig in previous:
            signal.signal(sig, on_signal)

        def restore() -> None:
            for sig, handler in previous.items():
                signal.signal(sig, handler)

        return restore

    def _start_threads(self) -> None:
        for index in range(self.concurrency):
            thread = threading.Thread(
                target=self._handler_thread, name=f"pgjobs-handler-{index}", daemon=True
            )
            thread.start()
            self._threads.append(thread)
        if self.sweep_interval > 0:
            sweeper = threading.Thread(
                target=self._sweeper_thread, name="pgjobs-sweeper", daemon=True
            )
            sweeper.start()
        if self.schedules:
            scheduler = threading.Thread(
                target=self._scheduler_thread, name="pgjobs-scheduler", daemon=True
            )
            scheduler.start()

    def _shutdown(self) -> None:
        self._record_stats(time.monotonic(), final=True)
        self._background_stop.set()
        for _ in self._threads:
            self._work.put(None)
        for thread in self._threads:
            thread.join(timeout=0.5 if self._running else 5)
        self._listener.close()
        connections[self.using].close()
        os.close(self._wake_r)
        os.close(self._wake_w)

    # The loop ----------------------------------------------------------------------

    def _loop(self) -> None:
        while True:
            now = time.monotonic()
            gather = self._gather_time_left(now)
            if gather > 0:
                self._wait(gather)
                continue
            self._contained("collect outcomes", self._collect)
            self._contained("record outcomes", self._flush)
            if self._stop_requested.is_set():
                self._contained("hand back waiting jobs", self._release_waiting)
                if not self._running and not self._unflushed():
                    return
                if self._stop_deadline is not None and now >= self._stop_deadline:
                    self._contained("hand back running jobs", self._release_running)
                    return
            elif self._exhausted():
                return
            else:
                self._contained("claim", self._claim_if_possible, now)
            self._contained("heartbeat", self._heartbeat_due, now)
            self._contained("record the per-minute counts", self._record_stats, now)
            self._report(now)
            self._wait(self._timeout(time.monotonic()))

    def _contained(self, what: str, step: Callable[..., None], *args: Any) -> None:
        """Run one step of the loop; whatever it raises is a fault, never the loop's end."""
        try:
            step(*args)
        except Exception as error:
            self._fault(what, error)

    def _gather_time_left(self, now: float) -> float:
        """Seconds to keep waiting for more of the running jobs to finish (0: go now)."""
        if not self._completed:
            self._gather_started = None
            return 0.0
        if self._stop_requested.is_set() or len(self._completed) >= len(self._running):
            return 0.0
        if self._gather_started is None:
            self._gather_started = now
        return max(0.0, self._gather_started + GATHER_S - now)

    def _exhausted(self) -> bool:
        """True when this worker has nothing left to do (burst drained, max jobs done)."""
        idle = not self._running and not self._unflushed() and not self._completed
        if self.max_jobs is not None and self.stats.claimed >= self.max_jobs and idle:
            return True
        return self.burst and idle and not self._maybe_more

    def _free_slots(self) -> int:
        free = self.concurrency + self._prefetch_now() - len(self._running)
        if self.max_jobs is not None:
            free = min(free, self.max_jobs - self.stats.claimed)
        return max(free, 0)

    def _prefetch_now(self) -> int:
        """How many jobs to hold beyond the threads: as many as they start within
        PREFETCH_WAIT_S at the mean run time, at most `prefetch` (none before a job ran)."""
        mean = self._mean_run_s
        if not self.prefetch or mean is None:
            return 0
        if mean * self.prefetch <= PREFETCH_WAIT_S * self.concurrency:
            return self.prefetch
        return int(PREFETCH_WAIT_S * self.concurrency / mean)

    def _claim_size(self, free: int) -> int:
        """How many of `free` slots to claim: all of them up to the threads' count, or
        when every slot is free; between, the threads plus a power of two. Each size is a
        statement of its own, prepared once per connection (sql.claim_jobs), so a worker
        uses a few of them rather than every size from 1 to concurrency + prefetch."""
        ahead = free - self.concurrency
        if ahead <= 0 or free == self.concurrency + self.prefetch:
            return free
        return self.concurrency + (1 << (ahead.bit_length() - 1))

    def _claim_if_possible(self, now: float) -> None:
        if now >= self._next_poll:
            self._maybe_more = True
            self._next_poll = now + self.poll_interval
        if self._next_due is not None and now >= self._next_due:
            self._maybe_more = True
            self._next_due = None
        free = self._claim_size(self._free_slots())
        if not self._maybe_more or free <= 0 or now < self._db_retry_at:
            return
        from django_pgjobs.models import Job

        try:
            Job.objects.tune_worker_connection(using=self.using)
            handles = Job.objects.claim_batch(self.queues, free, self.worker_id, using=self.using)
        except Exception as error:
            self._fault("claim", error)
            return
        self._database_ok()
        self._hand_out(handles)
        if len(handles) < free:
            # The queues ran dry: sleep until the next scheduled job. Asked once the jobs
            # are handed out, so that they need not wait for the answer.
            self._maybe_more = False
            try:
                wait = Job.objects.next_due_in(self.queues, using=self.using)
            except Exception as error:
                self._fault("claim", error)
                return
            self._next_due = None if wait is None else time.monotonic() + wait

    def _hand_out(self, handles: list[JobHandle]) -> None:
        claimed_at = time.monotonic()
        with self._completion_lock:
            self._outstanding += len(handles)
        for handle in handles:
            definition = registry.get_definition(handle.kind)
            next_heartbeat = claimed_at + handle.lease_s * HEARTBEAT_FRACTION
            running = _Running(
                handle=handle,
                next_heartbeat=next_heartbeat,
                atomic=definition is not None and definition.atomic,
                lease_ends=claimed_at + handle.lease_s,
            )
            self._running[handle.token] = running
            self._next_heartbeat_at = min(self._next_heartbeat_at, next_heartbeat)
            self._work.put(running)
        if handles and self.stats.first_claim_at is None:
            self.stats.first_claim_at = time.time()
        self.stats.claimed += len(handles)
        self.stats.in_flight = len(self._running)

    def _collect(self) -> None:
        """Move finished runs from the handler threads into the buffers to record."""
        while self._completed:
            outcome = self._completed.popleft()
            self._running.pop(outcome.handle.token, None)
            self._count_for_chart(outcome)
            mean = self._mean_run_s
            if outcome.verdict is not Verdict.LOST:  # a lost claim may not have run at all
                self._mean_run_s = (
                    outcome.duration
                    if mean is None
                    else mean + RUN_TIME_WEIGHT * (outcome.duration - mean)
                )
            verdict = outcome.verdict
            if verdict is Verdict.ACK:
                self._acks.append((outcome.handle, outcome.result))
            elif verdict is Verdict.RETRY and outcome.failure is not None:
                self._retries.append((outcome.handle, outcome.failure, outcome.delay))
            elif verdict is Verdict.FAIL and outcome.failure is not None:
                self._fails.append((outcome.handle, outcome.failure))
            else:
                self._count_recorded(outcome)
        self.stats.in_flight = len(self._running)

    def _count_for_chart(self, outcome: Outcome) -> None:
        if outcome.verdict is Verdict.LOST:
            return
        counts = self._minute_counts.setdefault(outcome.handle.queue, [0, 0, 0])
        if outcome.failure is None:
            counts[0] += 1
        elif (
            outcome.verdict is Verdict.FAIL or outcome.handle.attempt >= outcome.handle.max_attempts
        ):
            counts[2] += 1
        else:
            counts[1] += 1

    def _record_stats(self, now: float, *, final: bool = False) -> None:
        """Write the per-minute counts every STATS_INTERVAL_S (and once at the end)."""
        if not self._minute_counts or (now < self._next_stats_at and not final):
            return
        if now < self._db_retry_at:
            return
        from django_pgjobs.models import JobStats

        self._next_stats_at = now + STATS_INTERVAL_S
        counts = {queue: (c[0], c[1], c[2]) for queue, c in self._minute_counts.items()}
        self._minute_counts = {}
        try:
            JobStats.objects.record(counts, using=self.using)
        except DatabaseError as error:
            # Only the chart loses these counts: not worth a retry or a reconnect here.
            logger.debug("could not record the per-minute counts: %s", error)

    def _count_recorded(self, outcome: Outcome) -> None:
        self.stats.last_recorded_at = time.time()
        if outcome.verdict is Verdict.LOST:
            self.stats.lost += 1
        elif outcome.failure is None:
            self.stats.succeeded += 1
        elif (
            outcome.verdict is Verdict.FAIL or outcome.handle.attempt >= outcome.handle.max_attempts
        ):
            self.stats.dead += 1
        else:
            self.stats.retried += 1

    def _unflushed(self) -> bool:
        return bool(self._acks or self._retries or self._fails)

    def _flush(self) -> None:
        """Record buffered outcomes: one statement for the acks, one for the retries, one
        for the failures (S17).

        An outage keeps them buffered, to be tried again once the database is back (a
        claim that lapsed meanwhile is refused, S10, and its job runs again). A statement
        the database refuses for its data is tried job by job, and a job whose outcome
        cannot be stored is dead-lettered alone (S27).
        """
        if not self._unflushed() or time.monotonic() < self._db_retry_at:
            return
        batches: tuple[tuple[list[Any], Callable[[list[Any]], None]], ...] = (
            (self._acks, self._record_acks),
            (self._retries, self._record_retries),
            (self._fails, self._record_fails),
        )
        for buffer, record in batches:
            if buffer and not self._record(buffer, record):
                return
        self._database_ok()
        self.stats.last_recorded_at = time.time()
        # A completion may have promoted a key's trigger or scheduled an immediate retry.
        self._maybe_more = True

    def _record(self, buffer: list[Any], record: Callable[[list[Any]], None]) -> bool:
        """Record the outcomes of `buffer` (each a tuple starting with its handle) and
        empty it; return False when an outage stopped it, leaving the rest buffered."""
        try:
            record(buffer)
        except Exception as error:
            if is_outage(error):
                self._fault("record outcomes", error)
                return False
            logger.warning(
                "the database refused a batch of %s outcomes (%s); recording them one by one",
                len(buffer),
                describe(error),
            )
        else:
            buffer.clear()
            return True
        while buffer:
            try:
                record(buffer[:1])
            except Exception as refused:
                if is_outage(refused):
                    self._fault("record outcomes", refused)
                    return False
                if not self._bury_unstorable(buffer[0][0], refused):
                    return False
            del buffer[0]
        return True

    def _record_acks(self, acks: list[tuple[JobHandle, Any]]) -> None:
        from django_pgjobs.models import Job

        handles = [handle for handle, _ in acks]
        acked = Job.objects.ack_batch(handles, [result for _, result in acks])
        self.stats.succeeded += acked
        self.stats.lost += len(handles) - acked

    def _record_retries(self, retries: list[tuple[JobHandle, Failure, float | None]]) -> None:
        from django_pgjobs.models import Job

        recorded = Job.objects.retry_batch(retries)
        spent = sum(1 for handle, _, _ in retries if handle.attempt >= handle.max_attempts)
        self.stats.dead += spent
        self.stats.retried += recorded - spent
        self.stats.lost += len(retries) - recorded

    def _record_fails(self, fails: list[tuple[JobHandle, Failure]]) -> None:
        from django_pgjobs.models import Job

        recorded = Job.objects.fail_batch(fails)
        self.stats.dead += recorded
        self.stats.lost += len(fails) - recorded

    def _bury_unstorable(self, handle: JobHandle, refused: Exception) -> bool:
        """Dead-letter a job whose outcome the database refused to store (S27); return
        False when an outage stopped that too (the outcome stays buffered)."""
        from django_pgjobs.models import Job

        reason = f"the outcome could not be stored: {describe(refused)}"
        try:
            buried = Job.objects.fail_batch([(handle, Failure.from_exception(refused, reason))])
        except Exception as error:
            if is_outage(error):
                self._fault("record outcomes", error)
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
        self.stats.dead += buried
        self.stats.lost += 1 - buried
        return True

    def _heartbeat_due(self, now: float) -> None:
        if now < self._next_heartbeat_at or now < self._db_retry_at:
            return
        due = []
        self._next_heartbeat_at = float("inf")
        for running in self._running.values():
            if not running.heartbeats:
                continue
            if running.next_heartbeat <= now:
                due.append(running)
            else:
                self._next_heartbeat_at = min(self._next_heartbeat_at, running.next_heartbeat)
        if not due:
            return
        from django_pgjobs.models import Job

        try:
            extended = Job.objects.heartbeat_unlocked([r.handle for r in due])
        except Exception as error:
            self._next_heartbeat_at = now  # try again once the database is back
            self._fault("heartbeat", error)
            return
        self._database_ok()
        extended_tokens = {handle.token for handle in extended}
        extended_at = time.monotonic()
        for running in due:
            every = running.handle.lease_s * HEARTBEAT_FRACTION
            if running.handle.token in extended_tokens:
                running.next_heartbeat = now + every
                running.lease_ends = extended_at + running.handle.lease_s
            else:
                # Locked by a fence right now, or no longer ours: look again soon.
                running.next_heartbeat = now + min(1.0, every)
            self._next_heartbeat_at = min(self._next_heartbeat_at, running.next_heartbeat)

    def _release_waiting(self) -> None:
        """At a stop request, hand back the prefetched jobs no thread has started (S25):
        another worker runs them now rather than after this one's in-flight jobs."""
        if self._waiting_released:
            return
        self._waiting_released = True
        waiting: list[JobHandle] = []
        with contextlib.suppress(queue.Empty):
            while True:
                running = self._work.get_nowait()
                if running is not None:
                    waiting.append(running.handle)
        if not waiting:
            return
        with self._completion_lock:
            self._outstanding -= len(waiting)
        for handle in waiting:
            self._running.pop(handle.token, None)
        self.stats.in_flight = len(self._running)
        self._hand_back(waiting, "jobs waiting for a thread", logging.INFO)

    def _release_running(self) -> None:
        """Hand back the claims still running when the grace period ends (S25)."""
        handles = [running.handle for running in self._running.values()]
        if handles:
            self._hand_back(handles, "running jobs at the end of the grace period", logging.WARNING)

    def _hand_back(self, handles: list[JobHandle], which: str, level: int) -> None:
        from django_pgjobs.models import Job

        try:
            released = Job.objects.release_batch(handles)
        except Exception as error:
            logger.warning(
                "could not hand back %s %s (%s); their leases will",
                len(handles),
                which,
                describe(error),
            )
            return
        logger.log(
            level,
            "handed back %s of %s %s (the rest return when their lease lapses)",
            released,
            len(handles),
            which,
        )

    # Waiting -----------------------------------------------------------------------

    def _timeout(self, now: float) -> float:
        if self._completed or (self._unflushed() and now >= self._db_retry_at):
            return 0.0
        if self._exhausted():  # a burst drained: leave now, not at the next poll
            return 0.0
        if (
            self._maybe_more
            and self._free_slots() > 0
            and not self._stop_requested.is_set()
            and now >= self._db_retry_at
        ):
            return 0.0
        deadlines = [self._next_poll, now + self.status_interval]
        if self._next_due is not None:
            deadlines.append(self._next_due)
        if self._running:
            deadlines.append(self._next_heartbeat_at)
        if self._stop_deadline is not None:
            deadlines.append(self._stop_deadline)
        if self._db_retry_at > now:
            deadlines.append(self._db_retry_at)
        if self.listen and not self._listener.connected:
            deadlines.append(max(self._listener_retry_at, now))
        return max(0.0, min(deadlines) - now)

    def _wait(self, timeout: float) -> None:
        self._ensure_listener()
        readable = [self._wake_r]
        if self._listener.connected:
            readable.append(self._listener.fileno())
        try:
            ready, _, _ = select.select(readable, [], [], timeout)
        except InterruptedError:  # pragma: no cover - PEP 475 retries select itself
            return
        if self._wake_r in ready:
            try:
                while os.read(self._wake_r, 4096):
                    pass
            except BlockingIOError:
                pass
        if self._listener.connected and self._listener.fileno() in ready:
            self._drain_listener()

    def _wake(self) -> None:
        # A full pipe means the loop wakes anyway; a closed one means it is shutting down.
        with contextlib.suppress(OSError):
            os.write(self._wake_w, b"!")

    def _ensure_listener(self) -> None:
        if not self.listen or self._listener.connected:
            return
        now = time.monotonic()
        if now < self._listener_retry_at:
            return
        try:
            self._listener.connect()
            if not self._listener_probed:
                self._listener_probed = True
                if not self._listener.receives():
                    self._listen_off()
                    return
        except (psycopg.Error, DatabaseError) as error:
            self._listener.close()
            self._listener_retry_at = now + min(RECONNECT_BACKOFF_CAP_S, self.poll_interval * 2)
            logger.warning("LISTEN connection failed (%s); polling until it is back", error)
            return
        # Whatever was notified while it was down: look now.
        self._maybe_more = True

    def _listen_off(self) -> None:
        """Notifications do not reach the LISTEN connection: poll only, and say why."""
        self._listener.close()
        self.listen = False
        self._maybe_more = True
        logger.warning(
            "LISTEN receives no notifications on this connection (is it a transaction-mode "
            "pooler such as PgBouncer?): polling every %gs instead. Set PGJOBS['LISTEN_DSN'] "
            "to a direct connection string to PostgreSQL for instant wake-ups.",
            self.poll_interval,
        )

    def _drain_listener(self) -> None:
        try:
            queues = self._listener.drain()
        except psycopg.Error as error:
            logger.warning("LISTEN connection lost (%s); reconnecting", error)
            self._listener.close()
            return
        if queues.intersection(self.queues):
            self._maybe_more = True

    # Database faults -----------------------------------------------------------------

    def _fault(self, what: str, error: Exception) -> None:
        """Log a failed step, drop the connection, and back off before the next database
        call. An outage is waited out; anything else is logged with its traceback, and
        backed off alike, so that a fault that repeats never spins the loop."""
        self._db_failures += 1
        delay = min(RECONNECT_BACKOFF_CAP_S, 0.25 * 2 ** min(self._db_failures, 8))
        delay *= random.uniform(0.5, 1.0)
        self._db_retry_at = time.monotonic() + delay
        refused = read_only(error)
        # The first failure of a streak is a warning, and so is the first read-only
        # refusal in it (a failover shows as a lost connection, then refused writes).
        warn = self._db_failures == 1 or (refused and not self._read_only_warned)
        self._read_only_warned = self._read_only_warned or refused
        log = logger.warning if warn else logger.info
        if refused:
            log(
                "the database refused a write during %s: it is read-only (a standby after a "
                "failover, or the URL of a replica?); reconnecting in %.1fs",
                what,
                delay,
            )
        elif is_outage(error):
            log(
                "database error during %s (%s); reconnecting in %.1fs", what, describe(error), delay
            )
        else:
            logger.error(
                "unexpected error during %s (%s); trying again in %.1fs",
                what,
                describe(error),
                delay,
                exc_info=warn,
            )
        with contextlib.suppress(Exception):
            connections[self.using].close()
        self._maybe_more = True

    def _database_ok(self) -> None:
        if self._db_failures:
            logger.warning("database reachable again after %s failed attempts", self._db_failures)
        self._db_failures = 0
        self._read_only_warned = False

    # Status ------------------------------------------------------------------------

    def _report(self, now: float) -> None:
        if self.on_status is not None and now - self._last_status >= self.status_interval:
            self._last_status = now
            try:
                self.on_status(self.stats)
            except Exception:
                logger.exception("the status callback raised; it is switched off")
                self.on_status = None

    # Threads -----------------------------------------------------------------------

    def _handler_thread(self) -> None:
        executor = Executor()
        try:
            while True:
                running = self._work.get()
                if running is None:
                    return
                running.started = True
                if time.monotonic() < running.lease_ends:
                    outcome = self._run_one(executor, running.handle)
                else:
                    outcome = _lapsed_while_waiting(running.handle)
                with self._completion_lock:
                    first = not self._completed
                    self._completed.append(outcome)
                    self._outstanding -= 1
                    last = self._outstanding == 0
                # Wake the loop for the first finished job (it then gathers the rest for a
                # moment) and for the last one; the ones between need no wake-up of their own.
                if first or last:
                    self._wake()
        finally:
            executor.close()
            connections.close_all()

    @staticmethod
    def _run_one(executor: Executor, handle: JobHandle) -> Outcome:
        """Run one job; whatever happens, return its outcome (S27: never the thread's end)."""
        try:
            return executor.run(handle)
        except BaseException as error:
            failure = Failure.from_exception(error)
            logger.error(
                "job id=%s kind=%s: the executor raised %s", handle.id, handle.kind, failure.error
            )
            return Outcome(
                handle=handle,
                verdict=Verdict.RETRY,
                duration=0.0,
                failure=failure,
                delay=float(registry.backoff_for(handle.kind, handle.queue).delay(handle.attempt)),
            )
        finally:
            try:
                reset_connections()
            except Exception as error:
                logger.warning("could not reset the connections after a job: %s", describe(error))

    def _scheduler_thread(self) -> None:
        """Sync the declared schedules, then enqueue every due tick: one job per tick,
        whichever replica gets there first."""
        scheduler = Scheduler(using=self.using)
        synced = False
        wait = 0.0
        failures = 0
        try:
            while not self._background_stop.wait(wait):
                try:
                    if not synced:
                        scheduler.sync()
                        synced = True
                    due_in = scheduler.run_due()
                    failures = 0
                    wait = self.poll_interval if due_in is None else due_in
                    wait = min(max(wait, 0.01), self.poll_interval)
                except InvalidJobOption as error:  # a declaration the checks report too
                    logger.error("schedules not synced: %s", error)
                    synced = True
                    wait = self.poll_interval
                except Exception as error:
                    failures += 1
                    wait = min(RECONNECT_BACKOFF_CAP_S, 0.5 * 2**failures)
                    logger.warning(
                        "scheduler: %s; next try in %.1fs",
                        describe(error),
                        wait,
                        exc_info=not is_outage(error),
                    )
                    connections[self.using].close()
        finally:
            connections.close_all()

    def _sweeper_thread(self) -> None:
        sweeper = Sweeper(take_turns=True, using=self.using)
        wait = min(self.sweep_interval, 1.0)
        try:
            while not self._background_stop.wait(wait):
                try:
                    sweeper.run_once()
                except Exception as error:
                    logger.warning(
                        "sweep failed (%s); next try in %ss",
                        describe(error),
                        self.sweep_interval,
                        exc_info=not is_outage(error),
                    )
                    connections[self.using].close()
                wait = self.sweep_interval
        finally:
            connections.close_all()


def _lapsed_while_waiting(handle: JobHandle) -> Outcome:
    """A prefetched job whose claim lapsed before a thread was free (the process was
    paused, say): another worker may have it by now, so it is not started here."""
    logger.warning(
        "job lost id=%s kind=%s attempt=%s/%s: its claim lapsed while it waited for a "
        "thread; not started here (it runs again once its claim is taken back)",
        handle.id,
        handle.kind,
        handle.attempt,
        handle.max_attempts,
    )
    return Outcome(handle=handle, verdict=Verdict.LOST, duration=0.0)


def reset_connections() -> None:
    """Ready this thread's connections for the next job, as Django does between requests,
    but keep a healthy connection open whatever CONN_MAX_AGE says: reconnecting for
    every job would cost more than most jobs. A connection left in a transaction, with
    autocommit off, or broken is closed."""
    for connection in connections.all(initialized_only=True):
        if connection.connection is None:
            continue
        if connection.in_atomic_block or connection.get_autocommit() is not True:
            connection.close()
        elif connection.errors_occurred:
            if connection.is_usable():
                connection.errors_occurred = False
            else:
                connection.close()


def _seconds(value: float | timedelta | None, default: float | timedelta) -> float:
    chosen = default if value is None else value
    return chosen.total_seconds() if isinstance(chosen, timedelta) else float(chosen)
