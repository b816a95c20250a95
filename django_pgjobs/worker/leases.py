"""The claims a worker holds: when each lease ends, the heartbeats that keep long jobs
claimed (S11) and carry their progress, the cancellations and timeouts that stop them
(S32, S33), and handing claims back at a stop (S25)."""

from __future__ import annotations

import logging
import threading
import time
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from django_pgjobs import registry
from django_pgjobs.claims import JobHandle
from django_pgjobs.managers import JobManager
from django_pgjobs.worker.executor import runs_on_loop, timed_out_error
from django_pgjobs.worker.faults import Faults, describe

logger = logging.getLogger("django_pgjobs.worker")

#: Heartbeat a running job when this fraction of its lease has passed since the last one.
HEARTBEAT_FRACTION = 1 / 3
#: A job's progress reports are stored at most this often, by the heartbeats.
PROGRESS_INTERVAL_S = 1.0
#: What the background heartbeat says of a claim whose job row is gone (S38).
GONE = "gone"
#: How often the loop looks for reports to store and for handlers past their timeout.
LOOK_INTERVAL_S = 0.1


@dataclass(eq=False)
class Running:
    """One claim this worker holds, from its claim until its outcome is collected."""

    handle: JobHandle
    next_heartbeat: float
    #: Transaction mode: the handler runs in a transaction that holds the job's row.
    atomic: bool
    #: When the claim lapses at the latest, on this process's monotonic clock: measured
    #: from after the claim or heartbeat statement returned, so never before the
    #: database's claimed_until. A job still waiting for a thread then is not started.
    lease_ends: float
    #: Until when the claim surely holds: measured from before the statement that set
    #: its lease, so never after the database's claimed_until. A heartbeat that finds
    #: the job's row gone before then knows no newer claim took it (S38).
    lease_holds_until: float
    #: An async lease-mode job: it runs on the worker's event loop, not a thread.
    on_loop: bool = False
    #: Set by the handler thread that takes the job (a prefetched job waits until then).
    started: bool = False
    #: When it started, on the monotonic clock (for its timeout, S33).
    started_at: float | None = None
    #: Given up on at its timeout: its thread is replaced, its outcome ignored; and
    #: whether its outcome came back first (both set under the pool's lock).
    abandoned: bool = False
    delivered: bool = False
    #: Its handler is done and its outcome waits for a row another transaction holds
    #: (S39): heartbeaten until recorded, never handed back, never timed out.
    kept: bool = False
    #: A transaction-mode job whose statement was cut at its timeout (S39).
    cut: bool = False
    #: The handler thread running it (None: not started, or on the event loop).
    thread: threading.Thread | None = None

    @property
    def deadline(self) -> float | None:
        """When a sync handler is stopped (S33: a lease-mode one abandoned, a
        transaction-mode one's statement cut, S39; None: never)."""
        timeout_s = self.handle.timeout_s
        if timeout_s is None or self.on_loop or self.kept or self.started_at is None:
            return None
        return self.started_at + timeout_s


class Leases:
    """The claims held, by token, and their heartbeats."""

    def __init__(self, jobs: JobManager, faults: Faults, wake: Callable[[], None]) -> None:
        self.jobs = jobs
        self.faults = faults
        self._wake = wake
        self._running: dict[uuid.UUID, Running] = {}
        #: The earliest next_heartbeat among the claims (inf: none due).
        self.next_heartbeat_at = float("inf")
        #: Claims with a progress report waiting for a heartbeat (set from any thread).
        self._reported: set[uuid.UUID] = set()
        self._on_loop = 0
        #: Claims with a timeout the loop enforces (sync, lease mode), and when it
        #: next looks for progress reports and overdue handlers.
        self._timed = 0
        self._look_at = 0.0

    def __len__(self) -> int:
        return len(self._running)

    @property
    def on_loop(self) -> int:
        """How many of the claims are async jobs on the event loop."""
        return self._on_loop

    def hold(self, handles: Sequence[JobHandle], asked_at: float) -> list[Running]:
        """Hold the claims just made (their statement was sent at `asked_at`, on the
        monotonic clock); return them, to be handed to the threads."""
        claimed_at = time.monotonic()
        held = []
        for handle in handles:
            definition = registry.get_definition(handle.kind)
            running = Running(
                handle=handle,
                next_heartbeat=claimed_at + handle.lease_s * HEARTBEAT_FRACTION,
                atomic=definition is not None and definition.atomic,
                lease_ends=claimed_at + handle.lease_s,
                lease_holds_until=asked_at + handle.lease_s,
                on_loop=runs_on_loop(definition),
            )
            handle.control.carrier = self._carrier(handle.token)
            self._running[handle.token] = running
            self._on_loop += running.on_loop
            self._timed += _enforced(running)
            self.next_heartbeat_at = min(self.next_heartbeat_at, running.next_heartbeat)
            held.append(running)
        return held

    def keep(self, handle: JobHandle) -> None:
        """Hold again the claim of a finished run whose outcome waits for its row (S39):
        its lease is kept by the heartbeats until the outcome is recorded (`drop`)."""
        if handle.token in self._running:
            return
        now = time.monotonic()
        running = Running(
            handle=handle,
            next_heartbeat=now,
            atomic=False,
            lease_ends=now,
            lease_holds_until=now,
            started=True,
            kept=True,
        )
        self._running[handle.token] = running
        self.next_heartbeat_at = now

    def _carrier(self, token: uuid.UUID) -> Callable[[], None]:
        """What a handle calls when it has a progress report for the next heartbeat."""

        def carry() -> None:
            if token not in self._reported:
                self._reported.add(token)
                self._wake()

        return carry

    def drop(self, handle: JobHandle) -> None:
        """Forget a claim whose outcome is in (or that was handed back)."""
        running = self._running.pop(handle.token, None)
        if running is not None:
            self._on_loop -= running.on_loop
            self._timed -= _enforced(running)
        handle.control.carrier = None
        self._reported.discard(handle.token)

    def handles(self) -> list[JobHandle]:
        """The claims of runs not yet ended (those whose outcome waits are not)."""
        return [running.handle for running in self._running.values() if not running.kept]

    def cancel(self, job_id: int, token: uuid.UUID, reason: str) -> bool:
        """Tell the handler of a claim held here that its job is cancelled (S32): the
        claim `token` names, or a later claim of the same job, which a cancel request
        binds too (S38: the job went back in line, and was claimed again, as the cancel
        came)."""
        running = self._running.get(token)
        if running is None or running.handle.id != job_id:
            running = next(
                (held for held in self._running.values() if held.handle.id == job_id), None
            )
        if running is None:
            return False
        return running.handle.control.cancel(reason)

    # Timeouts (S33) ------------------------------------------------------------------

    @property
    def next_look_at(self) -> float | None:
        """When the loop should next look for reports and overdue handlers (None: no need)."""
        return self._look_at if (self._timed or self._reported) else None

    def look(self, now: float) -> list[Running]:
        """Every LOOK_INTERVAL_S: store waiting progress reports that are due, and return
        the handlers past their timeout (see overdue)."""
        if now < self._look_at or not (self._timed or self._reported):
            return []
        self._look_at = now + LOOK_INTERVAL_S
        if self._reported:
            self.heartbeat_due(now, with_reports=True)
        return self.overdue(now) if self._timed else []

    def overdue(self, now: float) -> list[Running]:
        """The sync lease-mode claims whose handler ran past its timeout: the caller
        abandons them (`time_out`) and records their attempt."""
        return [
            running
            for running in self._running.values()
            if (deadline := running.deadline) is not None and deadline <= now
        ]

    def time_out(self, running: Running) -> None:
        """Let go of an abandoned claim: its handler is told, its lease is no longer kept."""
        running.handle.control.cancel(timed_out_error(running.handle.timeout_s or 0.0))
        self.drop(running.handle)

    # Heartbeats (S11), progress, and the fallback of cancellations (S32) ----------------

    def heartbeat_due(self, now: float, *, with_reports: bool = False) -> None:
        """Extend the leases whose heartbeat is due (S11), and, `with_reports`, those
        with a progress report waiting whose last write is PROGRESS_INTERVAL_S old, in
        one statement that stores the reports; tell the handlers whose job is gone."""
        reported = self._reported if with_reports else set()
        if now < self.next_heartbeat_at and not reported:
            return
        if self.faults.waiting(now):
            return
        due: list[Running] = []
        self.next_heartbeat_at = float("inf")
        for running in self._running.values():
            # Every claim, whatever locks its row holds (S39): the background heartbeat's
            # lock is one a fence's or a transaction-mode job's admits.
            if running.next_heartbeat <= now or (
                running.handle.token in reported
                and now - running.next_heartbeat + self._every(running) >= PROGRESS_INTERVAL_S
            ):
                due.append(running)
            else:
                self.next_heartbeat_at = min(self.next_heartbeat_at, running.next_heartbeat)
        if not due:
            return
        for running in due:
            self._reported.discard(running.handle.token)
        progress = [running.handle.control.take_report() for running in due]
        # Read the clock here, not trust `now`: a process stopped since its loop read it
        # (SIGSTOP, a long pause) would judge its leases by a time long gone.
        sent = time.monotonic()
        try:
            beats = self.jobs.heartbeat_unlocked([running.handle for running in due], progress)
        except Exception as error:
            self.next_heartbeat_at = now  # try again once the database is back
            self.faults.failed("heartbeat", error)
            return
        answered = time.monotonic()
        self.faults.recovered()
        for handle, reason in beats.gone:
            if reason == GONE:
                held = self._running.get(handle.token)
                if held is None or answered >= held.lease_holds_until:
                    # Its lease may have lapsed before the statement ran, and a newer
                    # claim ended the job: this run is lost, not cancelled (its later
                    # writes are refused, S16).
                    continue
                reason = "cancelled"  # deleted while its claim held: by cancel(), say
            if handle.control.cancel(reason):
                logger.info(
                    "job id=%s kind=%s is gone (%s): its handler is told to stop",
                    handle.id,
                    handle.kind,
                    reason,
                )
        extended_tokens = {handle.token for handle in beats.extended}
        for running in due:
            every = self._every(running)
            if running.handle.token in extended_tokens:
                running.next_heartbeat = now + every
                running.lease_ends = answered + running.handle.lease_s
                running.lease_holds_until = sent + running.handle.lease_s
            else:
                # Changed by another statement right now, or no longer ours: look again soon.
                running.next_heartbeat = now + min(1.0, every)
            self.next_heartbeat_at = min(self.next_heartbeat_at, running.next_heartbeat)

    @staticmethod
    def _every(running: Running) -> float:
        return running.handle.lease_s * HEARTBEAT_FRACTION

    def hand_back(self, handles: list[JobHandle], which: str, level: int) -> None:
        """Give claims back (S25): pending again, the attempt refunded."""
        if not handles:
            return
        try:
            released = self.jobs.release_batch(handles)
        except Exception as error:
            logger.warning(
                "could not hand back %s %s (%s); their leases will",
                len(handles),
                which,
                describe(error),
            )
            return
        if released == len(handles):
            logger.log(
                level, "%s: %s handed back (pending again, the attempt refunded)", which, released
            )
            return
        logger.log(
            level,
            "%s: %s of %s handed back (pending again, the attempt refunded); the other %s "
            "ended meanwhile, or come back when their lease lapses",
            which,
            released,
            len(handles),
            len(handles) - released,
        )


def _enforced(running: Running) -> bool:
    """Whether the loop enforces this claim's timeout: a sync handler, in either mode."""
    return running.handle.timeout_s is not None and not (running.on_loop or running.kept)
