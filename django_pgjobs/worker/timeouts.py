"""Handlers past their timeout (S33, S39): a lease-mode handler is abandoned, a
transaction-mode job's running statement is cut at the deadline and its transaction
ended if the handler runs on, and the abandoned threads that still run are bounded.

The loop calls `look_after` at every turn and asks `held_back` before it claims.
"""

from __future__ import annotations

import logging

from django_pgjobs import tracing
from django_pgjobs.claims import Failure, Outcome, Verdict
from django_pgjobs.managers import JobManager
from django_pgjobs.worker.executor import report, retry_delay, timed_out_error
from django_pgjobs.worker.leases import Leases, Running
from django_pgjobs.worker.pool import HandlerPool
from django_pgjobs.worker.recorder import Recorder
from django_pgjobs.worker.stats import WorkerStats

logger = logging.getLogger("django_pgjobs.worker")

#: How long a transaction-mode job whose statement was cut at its timeout has to return
#: before its thread is abandoned and its transaction ended (S39).
CUT_GRACE_S = 1.0


class Timeouts:
    """Stops the handlers of one worker that ran past their timeout."""

    def __init__(
        self,
        jobs: JobManager,
        pool: HandlerPool,
        leases: Leases,
        recorder: Recorder,
        stats: WorkerStats,
        *,
        using: str,
        worker_id: str,
    ) -> None:
        self.jobs = jobs
        self.pool = pool
        self.leases = leases
        self.recorder = recorder
        self.stats = stats
        self.using = using
        self.worker_id = worker_id
        self._warned = False

    def look_after(self, now: float) -> None:
        """Store the progress reports that wait, and stop the handlers past their
        timeout: a lease-mode handler is abandoned, its attempt recorded as timed out
        and retried, its claim released, so whatever it writes later is refused. A
        transaction-mode job's running statement is cut at once (its transaction rolls
        back and the attempt comes back as timed out); one whose handler runs on outside
        any statement is abandoned after CUT_GRACE_S, its transaction ended with its
        backend."""
        for running in self.leases.look(now):
            if running.atomic and self._cut(running, now):
                continue
            if not self.pool.abandon(running):
                continue  # it finished just now: its outcome stands
            running.handle.control.abandoned = True
            backend = running.handle.control.backend
            if running.atomic and backend is not None:
                self.jobs.end_backend(backend, using=self.using)
            self.leases.time_out(running)
            handle = running.handle
            tracing.timed_out(handle, handle.timeout_s or 0.0)
            outcome = Outcome(
                handle=handle,
                verdict=Verdict.RETRY,
                duration=now - (running.started_at or now),
                failure=Failure(timed_out_error(handle.timeout_s or 0.0)),
                delay=retry_delay(handle),
                timed_out=True,
            )
            report(outcome)  # now, not when (or if) the abandoned handler returns
            if running.atomic:
                # Its backend is ended: the row is free, and the attempt is recorded as
                # any retry is (waiting a moment for the lock to go).
                self.recorder.take(outcome)
            else:
                self.recorder.timed_out(outcome)
            self.recorder.kick()  # the loop's turn to hand outcomes over went by
        self.stats.in_flight = len(self.leases)

    def _cut(self, running: Running, now: float) -> bool:
        """Cut a transaction-mode job's statement at its timeout; True while its handler
        has the grace to return, False once it is to be abandoned."""
        handle = running.handle
        backend = handle.control.backend
        deadline = running.deadline or now
        if now < deadline + CUT_GRACE_S:
            if backend is not None:
                if self.jobs.cut_statement(backend, using=self.using) and not running.cut:
                    logger.info(
                        "job id=%s kind=%s reached its timeout of %gs: its statement is cut",
                        handle.id,
                        handle.kind,
                        handle.timeout_s or 0,
                    )
                running.cut = True
            return True
        return False

    def held_back(self) -> bool:
        """Whether hung handlers abandoned at their timeout fill the bound (the pool's
        size): then the worker claims no thread job until one ends, and says so once."""
        abandoned = self.pool.abandoned_running
        self.stats.abandoned = abandoned
        full = abandoned >= self.pool.size
        if full and not self._warned:
            logger.warning(
                "worker id=%s: %s handlers abandoned at their timeout still run (at most "
                "%s, its concurrency): it claims no more jobs for its threads until one "
                "ends; fix the handlers that ignore their timeout",
                self.worker_id,
                abandoned,
                self.pool.size,
            )
        elif not full and self._warned:
            logger.warning(
                "worker id=%s: an abandoned handler ended: it claims again", self.worker_id
            )
        self._warned = full
        return full
