"""The worker: a claim loop feeding a pool of handler threads (DESIGN S20-S26).

One thread (the caller's) runs the loop: claim up to the free slots in one statement,
hand the jobs to the pool, hand the outcomes of many jobs to the recorder (which writes
them on a thread and a connection of its own while the loop claims on), heartbeat the
leases of running jobs, and sleep on the LISTEN socket until a job arrives, a handler
finishes, the next scheduled job is due, or the poll interval ends. Each of those is a
piece of its own (pacing, pool, recorder, leases, wakeup); the loop holds no SQL.

Nothing a crash could lose is kept in memory (S26): a claim that is never recorded comes
back when its lease lapses.
"""

from __future__ import annotations

import logging
import os
import signal
import threading
import time
from collections.abc import Callable, Sequence
from datetime import UTC, datetime, timedelta
from types import FrameType
from typing import Any

from django_pgjobs import options
from django_pgjobs.claims import JobHandle, Verdict, run_after_recorded
from django_pgjobs.conf import pgjobs_settings
from django_pgjobs.db import connection as db
from django_pgjobs.db import watchdog
from django_pgjobs.models import Job, QueueControl
from django_pgjobs.records import WorkerAsked
from django_pgjobs.states import WorkerAsk
from django_pgjobs.worker import announce
from django_pgjobs.worker.faults import Faults, describe
from django_pgjobs.worker.leases import Leases
from django_pgjobs.worker.options import WorkerOptions, default_worker_id, queues_of_database
from django_pgjobs.worker.pacing import Pacing
from django_pgjobs.worker.pool import HandlerPool
from django_pgjobs.worker.recorder import Recorder
from django_pgjobs.worker.services import (
    BackgroundService,
    MaintenanceService,
    RegistryService,
    SchedulerService,
)
from django_pgjobs.worker.stats import MinuteCounts, WorkerStats
from django_pgjobs.worker.timeouts import Timeouts
from django_pgjobs.worker.wakeup import Wakeup

logger = logging.getLogger("django_pgjobs.worker")


class _Stopping:
    """A stop asked for (S25): no more claims, a grace period, a second signal's exit."""

    def __init__(self, grace: float) -> None:
        self.grace = grace
        self.requested = threading.Event()
        self.deadline: float | None = None
        self.signals = 0
        #: The first signal that asked for the stop (None: stop() was called).
        self.signal: int | None = None
        self.waiting_released = False
        self.announced = False


class _StatusReport:
    """The caller's status callback, every `interval` seconds."""

    def __init__(self, callback: Callable[[WorkerStats], None] | None, interval: float) -> None:
        self.callback = callback
        self.interval = interval
        self.last = 0.0

    def __call__(self, stats: WorkerStats, now: float) -> None:
        if self.callback is None or now - self.last < self.interval:
            return
        self.last = now
        try:
            self.callback(stats)
        except Exception:
            logger.exception("the status callback raised; it is switched off")
            self.callback = None


class Worker:
    """Claims jobs of `queues` and runs them on `concurrency` handler threads.

    Args:
        queues: the queues to claim from (default: every queue this process knows).
        concurrency: handler threads.
        async_concurrency: async handlers running at once on the worker's event loop
            (default: the ASYNC_CONCURRENCY setting).
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
        async_concurrency: int | None = None,
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
        concurrency = concurrency or pgjobs_settings.CONCURRENCY
        if concurrency < 1:
            raise ValueError("concurrency must be at least 1.")
        async_concurrency = async_concurrency or pgjobs_settings.ASYNC_CONCURRENCY
        if async_concurrency < 1:
            raise ValueError("async_concurrency must be at least 1.")
        prefetch = pgjobs_settings.PREFETCH if prefetch is None else prefetch
        if prefetch < 0:
            raise ValueError("prefetch must not be negative.")
        using = using or pgjobs_settings.DATABASE
        self.options = WorkerOptions(
            queues=options.validate_queue_names(queues or queues_of_database(using)),
            concurrency=concurrency,
            async_concurrency=async_concurrency,
            prefetch=prefetch,
            worker_id=options.validate_worker_id(worker_id or default_worker_id()),
            burst=burst,
            max_jobs=max_jobs,
            poll_interval=_seconds(poll_interval, pgjobs_settings.POLL_INTERVAL),
            shutdown_grace=_seconds(shutdown_grace, pgjobs_settings.SHUTDOWN_GRACE),
            sweep_interval=_seconds(sweep_interval, pgjobs_settings.SWEEP_INTERVAL),
            # Schedules live in the jobs database (PGJOBS["DATABASE"]) only.
            schedules=(
                pgjobs_settings.SCHEDULER and not burst and using == pgjobs_settings.DATABASE
            )
            if schedules is None
            else schedules,
            listen=pgjobs_settings.NOTIFY if listen is None else listen,
            status_interval=status_interval,
            using=using,
        )
        self.stats = WorkerStats()
        jobs = Job.objects
        self.pacing = Pacing(
            concurrency=concurrency,
            prefetch=prefetch,
            poll_interval=self.options.poll_interval,
            queues=tuple(self.options.queues),
        )
        self.faults = Faults(using, on_failure=self.pacing.look_again)
        self.wakeup = Wakeup(
            using=using, listen=self.options.listen, poll_interval=self.options.poll_interval
        )
        self.leases = Leases(jobs, self.faults, self.wakeup.wake)
        self.recorder = Recorder(
            jobs, self.stats, MinuteCounts(using), using=using, wake=self.wakeup.wake
        )
        self.pool = HandlerPool(concurrency, self.wakeup.wake, async_concurrency)
        self.services = self._services()
        self.stopping = _Stopping(self.options.shutdown_grace)
        self.timeouts = Timeouts(
            jobs,
            self.pool,
            self.leases,
            self.recorder,
            self.stats,
            using=using,
            worker_id=self.options.worker_id,
        )

        self.report = _StatusReport(on_status, status_interval)

    @property
    def worker_id(self) -> str:
        return self.options.worker_id

    @property
    def listen(self) -> bool:
        """Whether this worker listens for wake-ups (False once it found it cannot)."""
        return self.wakeup.listening

    def _services(self) -> list[BackgroundService]:
        services: list[BackgroundService] = []
        using = self.options.using
        care_interval = _seconds(None, pgjobs_settings.VACUUM_INTERVAL)
        if self.options.sweep_interval > 0 or care_interval > 0:
            services.append(
                MaintenanceService(
                    using=using,
                    sweep_interval=self.options.sweep_interval,
                    care_interval=care_interval,
                )
            )
        if self.options.schedules:
            services.append(SchedulerService(using=using, poll_interval=self.options.poll_interval))
        services.append(
            RegistryService(
                using=using,
                interval=_seconds(None, pgjobs_settings.WORKER_HEARTBEAT),
                worker_id=self.options.worker_id,
                queues=self.options.queues,
                concurrency=self.options.concurrency,
                stats=self.stats,
                on_asked=self._on_asked,
            )
        )
        return services

    def _on_asked(self, asked: WorkerAsked) -> None:
        """What operators asked of this worker, read at its heartbeat (the registry's
        thread): stop (as SIGTERM does: no more claims, the running jobs get the grace
        period), go quiet (claim no more jobs), or run again; and which of its queues are
        paused on it alone (it claims from the others; from none: as a quiet worker)."""
        if asked.asked == WorkerAsk.STOP:
            if not self.stopping.requested.is_set():
                logger.warning("asked to stop from the console: stopping after the running jobs")
            self.stop()
            return
        pacing = self.pacing
        quiet = asked.asked == WorkerAsk.QUIET
        claiming = tuple(q for q in self.options.queues if q not in asked.paused_queues)
        changed = False
        if quiet != pacing.asked_quiet:
            pacing.asked_quiet, changed = quiet, True
            logger.warning(
                "%s",
                "asked to go quiet from the console: claiming no more jobs"
                if quiet
                else "asked to run again from the console: claiming jobs",
            )
        # Quiet first: the loop never claims with no queue left to claim from.
        pacing.quiet = quiet or not claiming
        if claiming != pacing.claiming:
            pacing.claiming, changed = claiming, True
            paused = [q for q in self.options.queues if q not in claiming]
            logger.warning(
                "queues paused on this worker alone: %s; claiming from: %s",
                ", ".join(paused) or "none",
                ", ".join(claiming) or "none",
            )
        if changed:
            self.wakeup.wake()

    # Lifecycle ---------------------------------------------------------------------

    def run(self) -> int:
        """Run until stopped (or drained, in burst mode); return the exit status."""
        with watchdog.guarding(pgjobs_settings.HUNG_SERVER_TIMEOUT):
            return self._run()

    def _run(self) -> int:
        restore = self._install_signal_handlers()
        services_stop = threading.Event()
        try:
            self._sync_queue_limits()
            self.wakeup.connect()
            self.pool.start()
            self.recorder.start()
            for service in self.services:
                service.start(services_stop)
            logger.info(
                "worker started id=%s queues=%s concurrency=%s burst=%s listen=%s",
                self.worker_id,
                ",".join(self.options.queues),
                self.options.concurrency,
                self.options.burst,
                self.listen,
            )
            announce.kinds()
            self._loop()
        finally:
            self.recorder.stop()
            self.recorder.counts.write(time.monotonic(), final=True)
            services_stop.set()
            for service in self.services:
                service.stopped()
            self.pool.stop(timeout=0.5 if len(self.leases) else 5)
            self.wakeup.close()
            db.close(self.options.using)
            restore()
        stats = self.stats
        logger.info(
            "worker stopped id=%s claimed=%s succeeded=%s retried=%s dead=%s cancelled=%s "
            "lost=%s first_claim_at=%s last_recorded_at=%s",
            self.worker_id,
            stats.claimed,
            stats.succeeded,
            stats.retried,
            stats.dead,
            stats.cancelled,
            stats.lost,
            _moment(stats.first_claim_at),
            _moment(stats.last_recorded_at),
        )
        return 0

    def _sync_queue_limits(self) -> None:
        """Apply the queue limits of the settings (a later worker applies them again)."""
        try:
            QueueControl.objects.sync_settings(using=self.options.using)
        except Exception as error:
            logger.warning("queue limits of the settings not applied: %s", describe(error))
            db.close(self.options.using)

    def stop(self) -> None:
        """Ask the worker to stop: no more claims; in-flight jobs get the grace period."""
        if not self.stopping.requested.is_set():
            self.stopping.deadline = time.monotonic() + self.stopping.grace
            self.stopping.requested.set()
        self.wakeup.wake()

    def _install_signal_handlers(self) -> Callable[[], None]:
        if threading.current_thread() is not threading.main_thread():
            return lambda: None
        previous = {sig: signal.getsignal(sig) for sig in (signal.SIGTERM, signal.SIGINT)}

        def on_signal(signum: int, frame: FrameType | None) -> None:
            self.stopping.signals += 1
            if self.stopping.signal is None:
                self.stopping.signal = signum
            if self.stopping.signals > 1:
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

    # The loop ----------------------------------------------------------------------

    def _loop(self) -> None:
        stopping = self.stopping
        while True:
            now = time.monotonic()
            held = len(self.leases)
            gather = self.pool.gather_time_left(now, held, stopping.requested.is_set())
            if gather > 0:
                self._wait(gather)
                continue
            self._contained("collect outcomes", self._collect)
            self._contained("record outcomes", self._write_outcomes)
            if stopping.requested.is_set():
                self._contained("hand back waiting jobs", self._release_waiting)
                if not stopping.announced:  # after the waiting ones went back: the running
                    stopping.announced = True
                    announce.stop(
                        [handle.id for handle in self.leases.handles()],
                        stopping.grace,
                        stopping.signal,
                    )
                if not len(self.leases) and not self.recorder.unflushed:
                    return
                if stopping.deadline is not None and now >= stopping.deadline:
                    # A last try of the outcomes whose rows were held (S39), then the rest.
                    self._contained("record outcomes", self.recorder.finish)
                    self._contained("hand back running jobs", self._release_running)
                    return
            elif self._exhausted():
                return
            elif self.pacing.quiet:
                self.pacing.tick(now)  # its polls come and go, and it claims nothing
            else:
                self._contained("claim", self._claim_if_possible, now)
            self._contained("heartbeat", self.leases.heartbeat_due, now)
            self._contained("look after running jobs", self.timeouts.look_after, now)
            self._contained("record the per-minute counts", self.recorder.counts.write, now)
            self.report(self.stats, now)
            self._wait(self._timeout(time.monotonic()))

    def _contained(self, what: str, step: Callable[..., None], *args: Any) -> None:
        """Run one step of the loop; whatever it raises is a fault, never the loop's end."""
        try:
            step(*args)
        except Exception as error:
            self.faults.failed(what, error)

    def _exhausted(self) -> bool:
        """True when this worker has nothing left to do (burst drained, max jobs done)."""
        idle = not len(self.leases) and not self.recorder.unflushed and not self.pool.has_finished
        max_jobs = self.options.max_jobs
        if max_jobs is not None and self.stats.claimed >= max_jobs and idle:
            return True
        # A quiet burst worker claims no more: done once its running jobs are.
        return self.options.burst and idle and (self.pacing.quiet or not self.pacing.maybe_more)

    def _free_slots(self) -> int:
        if self.timeouts.held_back():
            return 0
        behind = self.recorder.behind(self.options.concurrency + self.options.prefetch)
        return self._claimable(self.pacing.slots(len(self.leases) - self.leases.on_loop + behind))

    def _free_places(self) -> int:
        """The event loop's free places for async jobs (0 when it runs none here)."""
        if not self.pool.runs_async:
            return 0
        return max(self.options.async_concurrency - self.leases.on_loop, 0)

    def _claimable(self, free: int) -> int:
        if self.options.max_jobs is not None:
            free = min(free, self.options.max_jobs - self.stats.claimed)
        return max(free, 0)

    def _claim_if_possible(self, now: float) -> None:
        pacing = self.pacing
        pacing.tick(now)
        threads = pacing.claim_size(self._free_slots())
        places = pacing.loop_places(self._free_places(), self.options.async_concurrency, now)
        free = self._claimable(threads + places)
        # Each kind into capacity of its own: async jobs into the event loop's places,
        # the others into the threads (a max_jobs bound takes from the places first).
        threads = min(threads, free)
        places = free - threads
        if not pacing.maybe_more or free <= 0 or self.faults.waiting(now):
            return
        using, queues = self.options.using, pacing.claiming
        if not queues:  # every queue paused on this worker alone
            return
        try:
            Job.objects.tune_worker_connection(using=using)
            asked_at = time.monotonic()
            handles, (due_known, due_in) = Job.objects.claim_for_worker(
                queues,
                threads,
                self.worker_id,
                using=using,
                places=places,
                loop_kinds=self.pool.loop_kinds,
            )
        except Exception as error:
            self.faults.failed("claim", error)
            return
        self.faults.recovered()
        on_loop = sum(1 for handle in handles if handle.kind in self.pool.loop_kinds)
        pacing.claimed((threads, len(handles) - on_loop), (places, on_loop), time.monotonic())
        self._hand_out(handles, asked_at)
        if len(handles) < free:
            # The queues ran dry: sleep until the next scheduled job, as the claim said
            # or, when it could not (a limited queue's claim of its own), as asked now,
            # once the jobs are handed out, so that they need not wait for the answer.
            if not due_known:
                try:
                    due_in = Job.objects.next_due_in(queues, using=using)
                except Exception as error:
                    self.faults.failed("claim", error)
                    return
            pacing.dry(due_in, time.monotonic())

    def _hand_out(self, handles: list[JobHandle], asked_at: float) -> None:
        held = self.leases.hold(handles, asked_at)
        self.pool.submit(held)
        if handles and self.stats.first_claim_at is None:
            self.stats.first_claim_at = time.time()
        self.stats.claimed += len(handles)
        self.stats.in_flight = len(self.leases)

    def _collect(self) -> None:
        """Apply what the recorder did since the last look, and hand it the finished runs
        of the handler threads."""
        self._apply_writes()
        finished = self.pool.take_finished()
        for outcome in finished:
            self.leases.drop(outcome.handle)
            if outcome.verdict is not Verdict.LOST:  # a lost claim may not have run at all
                self.pacing.ran(outcome.duration)
            self.recorder.take(outcome)
        # The handler's own transaction saved these (a fence, transaction mode).
        recorded = [
            o.handle
            for o in finished
            if o.verdict is Verdict.RECORDED
            or (o.verdict is Verdict.CANCELLED and o.handle.finished)
        ]
        run_after_recorded(recorded)
        if recorded:
            # As after a flush: that transaction may have promoted a key's trigger (a
            # job that enqueued its own next run, say), which a burst must not leave.
            self.pacing.look_again()
        self.stats.in_flight = len(self.leases)

    def _write_outcomes(self) -> None:
        if not self.recorder.alive and not self.stopping.requested.is_set():
            logger.critical("the recorder's thread ended: stopping, outcomes unwritten")
            self.stop()
        claims_next = not (self.pacing.quiet or self.stopping.requested.is_set())
        if self.pacing.maybe_more or not claims_next:
            self.recorder.kick()  # written beside whatever the loop does next
        elif self.recorder.write_soon():
            # The queues ran dry: the next claim is for what these writes free (a
            # workflow's child), looked for as soon as they are written.
            self._apply_writes()

    def _apply_writes(self) -> None:
        if self.recorder.apply(self.leases.keep, self.leases.drop):
            # A write may have freed a workflow's child, promoted a key's trigger or
            # scheduled an immediate retry: the next claim looks, whatever it left
            # unwritten (what it wrote is committed). The NOTIFY those statements send
            # wakes other workers, not this one (Wakeup.wait).
            self.pacing.look_again()

    def _release_waiting(self) -> None:
        """At a stop request, hand back the prefetched jobs no thread has started (S25):
        another worker runs them now rather than after this one's in-flight jobs."""
        if self.stopping.waiting_released:
            return
        self.stopping.waiting_released = True
        waiting = [running.handle for running in self.pool.take_waiting()]
        for handle in waiting:
            self.leases.drop(handle)
        self.stats.in_flight = len(self.leases)
        self.leases.hand_back(waiting, "jobs waiting for a thread", logging.INFO)

    def _release_running(self) -> None:
        """Hand back the claims still running when the grace period ends (S25)."""
        self.leases.hand_back(
            self.leases.handles(), "running jobs at the end of the grace period", logging.WARNING
        )

    # Waiting -----------------------------------------------------------------------

    def _timeout(self, now: float) -> float:
        if self.pool.has_finished:
            return 0.0
        if self._exhausted():  # a burst drained: leave now, not at the next poll
            return 0.0
        pacing = self.pacing
        if (
            pacing.maybe_more
            and not pacing.quiet  # claims nothing: waits as an idle worker does
            and (self._free_slots() > 0 or self._free_places() > 0)
            and not self.stopping.requested.is_set()
            and not self.faults.waiting(now)
        ):
            return 0.0
        deadlines = [pacing.next_poll, now + self.report.interval]
        if pacing.next_due is not None:
            deadlines.append(pacing.next_due)
        if len(self.leases) and not self.faults.waiting(now):
            # While a backoff runs, no heartbeat is sent (its end is a deadline below).
            deadlines.append(self.leases.next_heartbeat_at)
        if self.stopping.deadline is not None:
            deadlines.append(self.stopping.deadline)
        if self.faults.retry_at > now:
            deadlines.append(self.faults.retry_at)
        reconnect = self.wakeup.reconnect_at(now)
        if reconnect is not None:
            deadlines.append(reconnect)
        look = self.leases.next_look_at
        if look is not None:
            deadlines.append(look)
        return max(0.0, min(deadlines) - now)

    def _wait(self, timeout: float) -> None:
        # A NOTIFY of a queue paused on this worker alone does not wake it.
        queues = self.pacing.claiming or self.options.queues
        own = (db.backend_pid(self.options.using), self.recorder.backend_pid)
        if self.wakeup.wait(timeout, queues, own):
            self.pacing.look_again()
        for job_id, token in self.wakeup.take_cancels():
            if self.leases.cancel(job_id, token, "cancelled"):
                logger.info("job id=%s was cancelled: its handler is told to stop", job_id)


def _moment(timestamp: float | None) -> str:
    """A wall-clock moment (time.time()) as an ISO time in UTC, to the microsecond."""
    if timestamp is None:
        return "-"
    return datetime.fromtimestamp(timestamp, UTC).isoformat(timespec="microseconds")


def _seconds(value: float | timedelta | None, default: float | timedelta) -> float:
    chosen = default if value is None else value
    return chosen.total_seconds() if isinstance(chosen, timedelta) else float(chosen)
