"""The maintenance every worker runs beside its loop, each in a thread of its own.

Each service has one shape (after River's maintenance services): `run_once()` does one
pass and returns the seconds until the next. A pass that fails is logged and tried again
with a backoff; the thread ends only when the worker stops.
"""

from __future__ import annotations

import logging
import os
import socket
import threading
import time
from collections.abc import Callable, Sequence

from django_pgjobs.db import connection as db
from django_pgjobs.exceptions import InvalidJobOption
from django_pgjobs.maintenance import Sweeper, TableCare
from django_pgjobs.managers.floors import FLOORS_RESET_S
from django_pgjobs.models import Job, Worker
from django_pgjobs.records import WorkerAsked
from django_pgjobs.scheduler import Scheduler
from django_pgjobs.worker.faults import RECONNECT_BACKOFF_CAP_S, describe, is_outage
from django_pgjobs.worker.stats import WorkerStats

logger = logging.getLogger("django_pgjobs.worker")


class BackgroundService:
    """A pass of maintenance repeated in a thread until `stop` is set."""

    name = "service"

    def __init__(self, *, using: str) -> None:
        self.using = using

    def first_wait(self) -> float:
        """Seconds before the first pass."""
        return 0.0

    def run_once(self) -> float:
        """Do one pass; return the seconds until the next."""
        raise NotImplementedError

    def stopped(self) -> None:
        """Called on the loop's thread once the worker stops (after the last pass)."""

    def start(self, stop: threading.Event) -> threading.Thread:
        thread = threading.Thread(
            target=self._run, args=(stop,), name=f"pgjobs-{self.name}", daemon=True
        )
        thread.start()
        return thread

    def _run(self, stop: threading.Event) -> None:
        wait = self.first_wait()
        failures = 0
        try:
            while not stop.wait(wait):
                try:
                    wait = self.run_once()
                    failures = 0
                except Exception as error:
                    failures += 1
                    wait = min(RECONNECT_BACKOFF_CAP_S, 0.5 * 2**failures)
                    logger.warning(
                        "%s: %s; next try in %.1fs",
                        self.name,
                        describe(error),
                        wait,
                        exc_info=not is_outage(error),
                    )
                    db.close(self.using)
        finally:
            db.close_all()


class MaintenanceService(BackgroundService):
    """The sweeper (S24) every `sweep_interval` seconds, replicas taking turns, and the
    job table's care (a VACUUM when one is due and can help, TableCare) every
    `care_interval` seconds, and with it, while claims read from floors, their reading
    from the start every FLOORS_RESET_S, on one thread and one connection (an interval
    of 0: that one is off)."""

    name = "maintenance"

    def __init__(self, *, using: str, sweep_interval: float, care_interval: float) -> None:
        super().__init__(using=using)
        #: Each pass that is on: what it runs, and every how many seconds.
        self.passes: dict[str, tuple[Callable[[], object], float]] = {}
        if sweep_interval > 0:
            self.passes["sweep"] = (Sweeper(take_turns=True, using=using).run_once, sweep_interval)
        if care_interval > 0:
            care = TableCare(using=using)
            self.passes["care"] = (care.run_once, care_interval)
            self.passes["floors"] = (care.lower_floors, FLOORS_RESET_S)
        self._due: dict[str, float] = {}

    def first_wait(self) -> float:
        now = time.monotonic()
        # The first sweep within a second of the start; the first look at the table after
        # a whole interval (a worker that just started has not churned it yet).
        self._due = {
            name: now + (min(interval, 1.0) if name == "sweep" else interval)
            for name, (_, interval) in self.passes.items()
        }
        return max(0.0, min(self._due.values()) - now)

    def run_once(self) -> float:
        """Run the passes that are due, each whatever the others do: one that fails (a
        VACUUM cut by a statement timeout, say) stays due and is tried again after the
        service's backoff, and does not hold back the passes after it (the floors'
        lowering, which the claims need while the horizon is held)."""
        now = time.monotonic()
        failed: Exception | None = None
        for name, (run, interval) in self.passes.items():
            if now >= self._due[name]:
                try:
                    run()
                except Exception as error:
                    failed = failed or error
                    continue
                self._due[name] = time.monotonic() + interval
        if failed is not None:
            raise failed
        return max(0.0, min(self._due.values()) - time.monotonic())


class SchedulerService(BackgroundService):
    """The periodic schedules: synced once, then every due tick enqueued, whichever
    replica gets there first (one job per tick in all)."""

    name = "scheduler"

    def __init__(self, *, using: str, poll_interval: float) -> None:
        super().__init__(using=using)
        self.poll_interval = poll_interval
        self.scheduler = Scheduler(using=using)
        self._synced = False

    def run_once(self) -> float:
        if not self._synced:
            try:
                self.scheduler.sync()
            except InvalidJobOption as error:  # a declaration the checks report too
                logger.error("schedules not synced: %s", error)
                self._synced = True
                return self.poll_interval
            self._synced = True
        due_in = self.scheduler.run_due()
        wait = self.poll_interval if due_in is None else due_in
        return min(max(wait, 0.01), self.poll_interval)


class RegistryService(BackgroundService):
    """The worker's row in the registry (`pgjobs_worker`): written at once, then every
    `interval` seconds with its counters, off the loop's thread so that claiming never
    waits for it. `stopped()` marks the row when the worker leaves on its own."""

    name = "registry"

    def __init__(
        self,
        *,
        using: str,
        interval: float,
        worker_id: str,
        queues: Sequence[str],
        concurrency: int,
        stats: WorkerStats,
        on_asked: Callable[[WorkerAsked], None] = lambda asked: None,
    ) -> None:
        super().__init__(using=using)
        from django_pgjobs import __version__

        self.interval = interval
        #: Told, at each heartbeat, what operators asked of this worker: to go quiet or
        #: stop, and the queues paused on it alone.
        self.on_asked = on_asked
        self.worker_id = worker_id
        self.stats = stats
        self.identity = {
            "host": socket.gethostname(),
            "pid": os.getpid(),
            "queues": list(queues),
            "concurrency": concurrency,
            "version": __version__,
            "heartbeat_s": interval,
        }
        # A heartbeat landing after the stop would show a stopped worker as live.
        self._lock = threading.Lock()
        self._stopped = False

    def run_once(self) -> float:
        stats = self.stats
        with self._lock:
            if self._stopped:
                return self.interval
            asked = Worker.objects.heartbeat(
                self.worker_id,
                **self.identity,  # type: ignore[arg-type]
                running=stats.in_flight,
                succeeded=stats.succeeded,
                failed=stats.retried + stats.dead,
                abandoned=stats.abandoned,
                claims_from_floors=Job.objects.reads_from_floors(using=self.using),
                using=self.using,
            )
            # Under the lock: once stopped() ran, the worker's loop may be gone.
            self.on_asked(asked)
        return self.interval

    def stopped(self) -> None:
        """Mark the row stopped (best effort: a gone row is what a crash leaves too)."""
        with self._lock:
            self._stopped = True
            try:
                Worker.objects.stopped(
                    self.worker_id,
                    succeeded=self.stats.succeeded,
                    failed=self.stats.retried + self.stats.dead,
                    using=self.using,
                )
            except Exception as error:
                logger.debug("could not mark the worker stopped: %s", describe(error))
