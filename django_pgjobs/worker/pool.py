"""The handler threads: each takes a claimed job, runs it with an executor of its own, and
hands the outcome back to the loop. Async lease-mode jobs go to the event loop instead
(`aio`). A thread whose handler ran past its timeout (S33) is abandoned: a new thread
takes its place, and whatever the old one's handler does later is ignored (its writes
are refused, since the claim is gone). Abandoned threads that still run are counted:
at `size` of them the worker claims nothing more until one ends (S39), so hung handlers
never pile up threads and connections without bound."""

from __future__ import annotations

import contextlib
import logging
import queue
import threading
import time
from collections import deque
from collections.abc import Callable

from django_pgjobs import registry
from django_pgjobs.claims import Failure, JobHandle, Outcome, Verdict
from django_pgjobs.db import connection as db
from django_pgjobs.worker.aio import EventLoopRunner
from django_pgjobs.worker.executor import Executor, runs_on_loop
from django_pgjobs.worker.faults import describe
from django_pgjobs.worker.leases import Running

logger = logging.getLogger("django_pgjobs.worker")

#: After the first of a batch of jobs finishes, wait up to this long for the rest, so
#: that fast jobs are recorded (and their slots refilled) many at a time.
GATHER_S = 0.002


class HandlerPool:
    """`size` threads taking jobs from a queue, and an event loop running up to
    `async_size` async jobs at once; their outcomes gathered for the loop."""

    def __init__(self, size: int, wake: Callable[[], None], async_size: int = 0) -> None:
        self.size = size
        self.async_size = async_size
        self._wake = wake
        self._runner: EventLoopRunner | None = None
        self._work: queue.SimpleQueue[Running | None] = queue.SimpleQueue()
        self._finished: deque[Outcome] = deque()
        self._lock = threading.Lock()
        #: Jobs handed to the threads whose outcome has not come back yet.
        self._outstanding = 0
        self._threads: list[threading.Thread] = []
        self._gather_started: float | None = None
        #: Threads abandoned at a timeout, until they end.
        self._abandoned: list[threading.Thread] = []
        #: The kinds whose jobs run on the event loop here (none without one), claimed
        #: into the loop's places, the others into the threads.
        self.loop_kinds: list[str] = []

    def start(self) -> None:
        for _ in range(self.size):
            self._start_thread()
        self.loop_kinds = sorted(
            kind
            for kind in registry.registered_kinds()
            if runs_on_loop(registry.get_definition(kind))
        )
        if self.loop_kinds:
            self._event_loop()

    def _start_thread(self) -> None:
        thread = threading.Thread(
            target=self._take_jobs, name=f"pgjobs-handler-{len(self._threads)}", daemon=True
        )
        thread.start()
        self._threads.append(thread)

    def _event_loop(self) -> EventLoopRunner:
        if self._runner is None:
            size = self.async_size or self.size
            self._runner = EventLoopRunner(size, self._deliver, _lapsed_while_waiting)
            self._runner.start()
        return self._runner

    @property
    def runs_async(self) -> bool:
        """Whether async jobs have places of their own here (the event loop)."""
        return self._runner is not None

    def stop(self, timeout: float) -> None:
        """Let every thread end after its current job, waiting up to `timeout` for each."""
        if self._runner is not None:
            self._runner.stop(timeout)
        threads = [thread for thread in self._threads if thread.is_alive()]
        for _ in threads:
            self._work.put(None)
        for thread in threads:
            thread.join(timeout=timeout)

    def submit(self, held: list[Running]) -> None:
        with self._lock:
            self._outstanding += len(held)
        for running in held:
            if running.on_loop:
                self._event_loop().submit(running)
            else:
                self._work.put(running)

    def abandon(self, running: Running) -> bool:
        """Give up on a thread's job past its timeout (S33): its outcome no longer comes
        back, and a new thread takes the old one's place. False when the outcome came
        back first (then nothing changes)."""
        with self._lock:
            if running.delivered:
                return False
            running.abandoned = True
            self._outstanding -= 1
            if running.thread is not None:
                self._abandoned.append(running.thread)
        self._start_thread()
        logger.warning(
            "job id=%s kind=%s ran past its timeout of %gs: its thread is abandoned and "
            "replaced; its later writes are refused",
            running.handle.id,
            running.handle.kind,
            running.handle.timeout_s or 0,
        )
        return True

    @property
    def abandoned_running(self) -> int:
        """How many threads abandoned at a timeout are still running their handler."""
        with self._lock:
            self._abandoned = [thread for thread in self._abandoned if thread.is_alive()]
            return len(self._abandoned)

    @property
    def has_finished(self) -> bool:
        return bool(self._finished)

    def take_finished(self) -> list[Outcome]:
        """The outcomes that came back since the last call, in order."""
        taken = []
        while self._finished:
            taken.append(self._finished.popleft())
        return taken

    def take_waiting(self) -> list[Running]:
        """The jobs no thread has started yet, taken back (to be handed back, S25)."""
        waiting: list[Running] = []
        with contextlib.suppress(queue.Empty):
            while True:
                running = self._work.get_nowait()
                if running is not None:
                    waiting.append(running)
        if self._runner is not None:
            waiting += self._runner.take_waiting()
        with self._lock:
            self._outstanding -= len(waiting)
        return waiting

    def gather_time_left(self, now: float, held: int, stopping: bool) -> float:
        """Seconds to keep waiting for more of the `held` jobs to finish (0: go now)."""
        if not self._finished:
            self._gather_started = None
            return 0.0
        if stopping or len(self._finished) >= held:
            return 0.0
        if self._gather_started is None:
            self._gather_started = now
        return max(0.0, self._gather_started + GATHER_S - now)

    def _take_jobs(self) -> None:
        executor = Executor()
        try:
            while True:
                running = self._work.get()
                if running is None:
                    return
                running.started_at = time.monotonic()
                running.started = True
                running.thread = threading.current_thread()
                if running.started_at < running.lease_ends:
                    outcome = run_one(executor, running.handle)
                else:
                    outcome = _lapsed_while_waiting(running)
                if not self._deliver(outcome, running):
                    self._wake()  # one abandoned thread fewer: the worker may claim again
                    return  # abandoned past its timeout: recorded, and replaced
        finally:
            executor.close()
            db.close_all()

    def _deliver(self, outcome: Outcome, running: Running | None = None) -> bool:
        """Hand a finished run to the loop (from a handler thread or the event loop);
        False, handing nothing, when the loop abandoned it."""
        with self._lock:
            if running is not None:
                if running.abandoned:
                    return False
                running.delivered = True
            first = not self._finished
            self._finished.append(outcome)
            self._outstanding -= 1
            last = self._outstanding == 0
        # Wake the loop for the first finished job (it then gathers the rest for a moment)
        # and for the last one; the ones between need no wake-up of their own.
        if first or last:
            self._wake()
        return True


def run_one(executor: Executor, handle: JobHandle) -> Outcome:
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
            db.reset_after_job()
        except Exception as error:
            logger.warning("could not reset the connections after a job: %s", describe(error))


def _lapsed_while_waiting(running: Running) -> Outcome:
    """A prefetched job whose claim lapsed before a thread was free (the process was
    paused, say): another worker may have it by now, so it is not started here."""
    handle = running.handle
    logger.warning(
        "job lost id=%s kind=%s attempt=%s/%s: its claim lapsed while it waited for a "
        "thread; not started here (it runs again once its claim is taken back)",
        handle.id,
        handle.kind,
        handle.attempt,
        handle.max_attempts,
    )
    return Outcome(handle=handle, verdict=Verdict.LOST, duration=0.0)
