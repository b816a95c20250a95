"""The recorder: the completer on a thread and a connection of its own, so that the
writes of a worker's outcomes and its claims overlap (issue 28).

The loop hands each finished run's outcome over (`take`), asks for them to be written
once it has gathered a batch (`kick`), and goes on claiming and handing out jobs while
the recorder's thread writes them, many at a time (Completer). The recorder backs off an
outage on its own streak of failures and tries the outcomes set aside (S39) again when
they are due. What it does to the loop's state it posts back, for the loop to apply on
its own thread (`apply`): the claims to keep heartbeating while an outcome waits for its
row, the claims to let go once it is written, and that something was written (a freed
child, a promoted trigger, an immediate retry: the loop looks again).

Nothing here changes what a write says or when a job counts as done: that is when its
ack commits (S12), whichever thread waits for the commit. An outcome not yet written is
in memory only, as before; its claim comes back when its lease lapses (S26).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from django_pgjobs.claims import JobHandle, Outcome
from django_pgjobs.db import connection as db
from django_pgjobs.managers import JobManager
from django_pgjobs.worker.completer import Completer
from django_pgjobs.worker.faults import Faults
from django_pgjobs.worker.stats import MinuteCounts, WorkerStats

logger = logging.getLogger("django_pgjobs.worker")

#: How long a loop whose queues ran dry waits for the outcomes it just handed over to be
#: written before it goes on (write_soon): its next claim is likely for a job they free.
WRITE_WAIT_S = 0.05
#: How many claims' worth of outcomes (concurrency + prefetch each) may wait to be
#: written before the loop counts the rest as claims it holds (Recorder.behind).
BATCHES_BEHIND = 4
#: How long a stopping worker waits for the recorder's thread to end.
STOP_WAIT_S = 10.0


@dataclass
class _Handover:
    """What the loop and the recorder's thread share, read and written under the
    recorder's condition only."""

    #: Outcomes handed over, each with whether its handler was abandoned (S33).
    inbox: list[tuple[Outcome, bool]] = field(default_factory=list)
    #: The loop asked for the inbox to be written.
    kicked: bool = False
    #: Claims the loop is to keep (True) or let go of (False).
    posted: list[tuple[JobHandle, bool]] = field(default_factory=list)
    #: Something was written since the loop last looked.
    wrote: bool = False
    #: A pass is under way.
    writing: bool = False
    #: Outcomes taken by the pass under way, and left unwritten by the last one (set
    #: aside, or held back by an outage).
    in_pass: int = 0
    left: int = 0
    #: Of those left, the ones set aside: their claims are held by the loop again.
    aside: int = 0
    #: Last passes (everything, now) asked for by the loop, and done.
    last_asked: int = 0
    last_done: int = 0
    #: Passes the recorder's thread ended.
    passes: int = 0
    stop: bool = False


class Recorder:
    """Writes the outcomes the loop hands over, on a thread of its own (S12-S17, S27)."""

    def __init__(
        self,
        jobs: JobManager,
        stats: WorkerStats,
        counts: MinuteCounts,
        *,
        using: str,
        wake: Callable[[], None],
    ) -> None:
        self.using = using
        #: The per-minute counts: counted as outcomes are taken, on the loop's thread.
        self.counts = counts
        #: The recorder's own streak of failures: an outage it meets is backed off here,
        #: whatever the loop's claims meet meanwhile.
        self.faults = Faults(using)
        self._wake = wake
        self._changed = threading.Condition()
        self._shared = _Handover()
        #: The recorder thread's alone.
        self.completer = Completer(
            jobs,
            stats,
            self.faults,
            keep=lambda handle: self._post(handle, keep=True),
            let_go=lambda handle: self._post(handle, keep=False),
        )
        #: The server process of the recorder's connection (None: not connected yet):
        #: the notifications its writes send wake nothing (Wakeup.wait).
        self.backend_pid: int | None = None
        self._thread: threading.Thread | None = None

    # The loop's side ------------------------------------------------------------------

    def start(self) -> None:
        """Start the recorder's thread (it connects at its first write)."""
        self._thread = threading.Thread(target=self._run, name="pgjobs-recorder", daemon=True)
        self._thread.start()

    @property
    def alive(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def take(self, outcome: Outcome) -> None:
        """Hand over a finished run's outcome, to be written at the next `kick`."""
        self._hand_over(outcome, timed_out=False)

    def timed_out(self, outcome: Outcome) -> None:
        """Hand over the attempt of a handler the worker abandoned at its timeout (S33)."""
        self._hand_over(outcome, timed_out=True)

    def _hand_over(self, outcome: Outcome, *, timed_out: bool) -> None:
        self.counts.count(outcome)
        with self._changed:
            self._shared.inbox.append((outcome, timed_out))

    def behind(self, batch: int) -> int:
        """How many outcomes wait to be written beyond BATCHES_BEHIND claims of `batch`:
        the loop counts them as claims it still holds, so that a recorder slower than
        the claims (a slow write, an outage) slows the claims down rather than letting
        outcomes pile up unwritten, their claims no longer heartbeaten. Those set aside
        (S39) are not counted here: the loop holds their claims again (`apply`)."""
        shared = self._shared
        with self._changed:
            waiting = len(shared.inbox) + shared.in_pass + shared.left - shared.aside
        return max(0, waiting - BATCHES_BEHIND * batch)

    def kick(self) -> None:
        """Write what was handed over, now, on the recorder's thread."""
        with self._changed:
            if self._shared.inbox:
                self._shared.kicked = True
                self._changed.notify_all()

    def write_soon(self, wait: float = WRITE_WAIT_S) -> bool:
        """Kick, and wait up to `wait` seconds for the pass that writes what was handed
        over; True when it ended in time (then `apply` what it did before claiming).

        For a loop whose queues ran dry: its next claim is for what these writes free (a
        workflow's child, a promoted trigger), and its own iteration and wake-up would
        add to the time between a parent's ack and its child's start. A write that
        waits for a row a transaction holds (S39) holds the loop up `wait` at most.
        """
        shared = self._shared
        deadline = time.monotonic() + wait
        with self._changed:
            if not shared.inbox:
                return False
            shared.kicked = True
            self._changed.notify_all()
            if self.faults.waiting(time.monotonic()):
                return False  # backing off an outage: no pass comes before it ends
            # A pass under way took what came before: the next one takes these.
            target = shared.passes + (2 if shared.writing else 1)
            while shared.passes < target:
                left = deadline - time.monotonic()
                if left <= 0 or not self.alive:
                    return False
                self._changed.wait(left)
            return True

    def apply(self, keep: Callable[[JobHandle], None], let_go: Callable[[JobHandle], None]) -> bool:
        """Apply what the recorder posted (on the loop's thread): `keep` the claims whose
        outcome waits for its row, `let_go` those since written; True when something
        was written since the last call (look again)."""
        shared = self._shared
        with self._changed:
            posted, shared.posted = shared.posted, []
            wrote, shared.wrote = shared.wrote, False
        for handle, kept in posted:
            (keep if kept else let_go)(handle)
        return wrote

    @property
    def unflushed(self) -> bool:
        """Whether outcomes wait to be written (set aside ones included), or what was
        written is still to be applied by the loop."""
        shared = self._shared
        with self._changed:
            return bool(
                shared.inbox or shared.writing or shared.left or shared.posted or shared.wrote
            )

    def finish(self) -> None:
        """Write everything handed over, the outcomes set aside included, now, and wait
        for it (at the end of a stop's grace)."""
        shared = self._shared
        with self._changed:
            shared.last_asked += 1
            asked = shared.last_asked
            self._changed.notify_all()
            while shared.last_done < asked and self.alive:
                self._changed.wait(1.0)

    def stop(self) -> None:
        """End the recorder's thread (once the loop is done with it)."""
        with self._changed:
            self._shared.stop = True
            self._changed.notify_all()
        if self._thread is not None:
            self._thread.join(timeout=STOP_WAIT_S)
            if self._thread.is_alive():
                logger.error(
                    "the recorder's thread did not end within %gs (a write still waits "
                    "for the database?); its claims come back when their leases lapse",
                    STOP_WAIT_S,
                )

    # The recorder's thread -----------------------------------------------------------

    def _post(self, handle: JobHandle, *, keep: bool) -> None:
        with self._changed:
            self._shared.posted.append((handle, keep))

    def _run(self) -> None:
        try:
            while self._turn():
                pass
        finally:
            db.close_all()

    def _turn(self) -> bool:
        """Wait for something to write, write it; False once the recorder is to stop.
        Whatever a turn raises is logged, and the next turn comes: the loop counts on
        this thread for every outcome."""
        shared = self._shared
        try:
            with self._changed:
                while not shared.stop and not self._due(time.monotonic()):
                    self._changed.wait(self._sleep(time.monotonic()))
                if shared.stop:
                    if shared.inbox or shared.left:
                        logger.warning(
                            "the recorder stops with outcomes unwritten: their claims come "
                            "back when their leases lapse"
                        )
                    return False
                taken, shared.inbox, shared.kicked = shared.inbox, [], False
                last = shared.last_asked if shared.last_asked > shared.last_done else None
                shared.writing, shared.in_pass = True, len(taken)
            self._pass(taken, last=last)
            self._wake()
        except Exception:
            logger.exception("the recorder failed a turn; trying again in a second")
            time.sleep(1.0)
        return True

    def _pass(self, taken: list[tuple[Outcome, bool]], *, last: int | None = None) -> None:
        """Write `taken` and what is left from before (`last`: the number of the last
        pass asked for, which writes the set aside ones too), having set `writing` and
        taken `taken` under the condition."""
        shared = self._shared
        wrote = False
        try:
            for outcome, timed_out in taken:
                if timed_out:
                    self.completer.timed_out(outcome)
                else:
                    self.completer.take(outcome)
            wrote = self._write(last=last is not None)
        except Exception:  # never the recorder's end: the loop waits on it
            logger.exception("recording outcomes failed")
        finally:
            with self._changed:
                shared.writing, shared.in_pass = False, 0
                shared.left = self.completer.buffered
                shared.aside = self.completer.aside.count
                shared.wrote = shared.wrote or wrote
                if last is not None:
                    shared.last_done = last
                shared.passes += 1
                self._changed.notify_all()

    def _due(self, now: float) -> bool:
        """Whether a pass has something to do now (the recorder's thread, locked)."""
        shared = self._shared
        if shared.last_asked > shared.last_done:
            return True
        if self.faults.waiting(now):
            return False
        return (shared.kicked and bool(shared.inbox)) or self.completer.flush_due(now)

    def _sleep(self, now: float) -> float | None:
        """How long to wait for a kick before looking again (None: until one comes):
        while an outage is backed off, until it ends if anything waits to be written;
        else until the outcomes set aside are due."""
        if self.faults.waiting(now):
            waits = self.completer.unflushed or bool(self._shared.inbox)
            return self.faults.retry_at - now if waits else None
        retry_at = self.completer.aside.retry_at
        return None if retry_at is None else max(0.0, retry_at - now)

    def _write(self, *, last: bool) -> bool:
        """One pass of writes (`last`: the set aside ones too, due or not, outage or
        not); True when something may have been written."""
        now = time.monotonic()
        if not last and (self.faults.waiting(now) or not self.completer.flush_due(now)):
            return False
        try:
            self.completer.jobs.tune_worker_connection(using=self.using)
            self.backend_pid = db.backend_pid(self.using)
            self.completer.flush(last=last)
        except Exception as error:
            self.faults.failed("record outcomes", error)
        # After the flush too: it may have connected (PREPARE off) or lost its connection.
        self.backend_pid = db.backend_pid(self.using)
        return True
