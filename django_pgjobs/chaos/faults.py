"""Inject the faults of a chaos run, each noted in the ledger with its time.

The faults: `kill -9` of a worker, SIGSTOP past the lease then SIGCONT, dropped
connections of a worker, bursts of rolled-back or poison enqueues, cancellations of
running jobs, database restarts, and pins: the xmin horizon held for a while by an idle
transaction or a REPEATABLE READ reader, with a burst of jobs whose rows it keeps dead.
"""

from __future__ import annotations

import contextlib
import shlex
import signal
import subprocess
import threading
import time
from dataclasses import dataclass
from datetime import datetime

from django.db import DatabaseError, connections, transaction

from django_pgjobs.chaos.config import ChaosAborted
from django_pgjobs.chaos.facts import Fault, PinSample
from django_pgjobs.chaos.load import LOCK_WAIT_S, Load
from django_pgjobs.chaos.models import ChaosExecution
from django_pgjobs.chaos.processes import Worker, Workers
from django_pgjobs.chaos.state import RunState
from django_pgjobs.conf import pgjobs_settings
from django_pgjobs.maintenance import MIN_DEAD_ROWS
from django_pgjobs.managers.floors import ClaimFloors
from django_pgjobs.models import Job
from django_pgjobs.models import Worker as WorkerRow
from django_pgjobs.records import ClaimCost


def settle_s() -> float:
    """How long a worker must have been up to have seen a held horizon: two looks of its
    table care, VACUUM_INTERVAL apart, a heartbeat to say so, and a margin. A worker up
    for less does not decide whether a pin's claim is sampled from the floors."""
    return 2 * pgjobs_settings.VACUUM_INTERVAL + pgjobs_settings.WORKER_HEARTBEAT + 5.0


#: A pin's end samples the claim this many times, this far apart (`_pin_end_buffers`): over
#: more than LOCK_WAIT_S, the longest a writer of the run's load waits with its transaction
#: open.
PIN_END_SAMPLES = 5
PIN_END_GAP_S = LOCK_WAIT_S / (PIN_END_SAMPLES - 2)

#: Tries of the operator's restart or failover command, this far apart, before the run
#: stops: an HA manager may refuse one for a moment (pg_auto_failover's monitor met a
#: deadlock of its own on a failover asked right after another, in the CI).
COMMAND_TRIES = 3
COMMAND_RETRY_S = 2.0


#: How long after its due time a stopped worker is resumed by its own timer, should the
#: run's loop not have resumed it.
RESUME_SLACK_S = 1.0
#: How often a pin held past its time looks whether every worker reads from floors.
FLOORS_LOOK_S = 0.5


def _resume_if_still_stopped(
    worker: Worker, process: subprocess.Popen[bytes], stopped_at: datetime
) -> None:
    """SIGCONT `process` if it is still the worker's, stopped by the same fault: not
    once the loop resumed it (and maybe stopped it again), killed or restarted it."""
    if worker.process is process and worker.stopped_at == stopped_at:
        with contextlib.suppress(ProcessLookupError):
            process.send_signal(signal.SIGCONT)


class HorizonPin(threading.Thread):
    """A connection of its own that holds the xmin horizon ("idle": an XID, "reader":
    a REPEATABLE READ snapshot of the job table) until `release()`, then rolls back."""

    def __init__(self, alias: str, how: str) -> None:
        super().__init__(name=f"chaos-pin-{how}", daemon=True)
        self.alias = alias
        self.how = how
        self.holding = threading.Event()
        self.error: BaseException | None = None
        self._release = threading.Event()

    def run(self) -> None:
        try:
            with transaction.atomic(using=self.alias):
                ChaosExecution.objects.hold_horizon(self.how, using=self.alias)
                self.holding.set()
                self._release.wait()
                transaction.set_rollback(True, using=self.alias)
        except DatabaseError as error:  # a restart, say: the pin ended early
            self.error = error
        finally:
            self.holding.set()
            connections[self.alias].close()

    def release(self) -> None:
        self._release.set()
        self.join(30)


@dataclass(slots=True)
class Pin:
    """A pin under way: its thread, when it began and ends, the claim's cost then."""

    thread: HorizonPin
    began: datetime
    release_at: float  # monotonic
    before: int
    #: When release_due next reads the registry, once the pin is past its time.
    look_at: float = 0.0


class Faults:
    """Choose and inject the run's faults, and resume the workers they stopped."""

    def __init__(self, state: RunState, workers: Workers, load: Load) -> None:
        self.state = state
        self.workers = workers
        self.load = load
        self.last_fault = 0.0  # monotonic time the last fault ended; 0: none yet
        self._last_of: dict[str, float] = {}  # monotonic end of the last fault of a kind
        self._deck: list[str] = []  # the kinds still to come in this round, next last
        self.pin: Pin | None = None  # the pin under way (one at a time)

    def gap(self) -> float:
        """Seconds until the next fault: random, about `fault_every` on average."""
        mean = self.state.config.fault_every
        return min(max(self.state.random.expovariate(1 / mean), mean / 10), mean * 3)

    def next_kind(self) -> str:
        """The kind of the next fault: the run's kinds dealt in rounds, each round a fresh
        shuffle, so that every kind comes up once in any len(faults) faults in a row of a
        round (a run of a few dozen faults meets them all, which a draw with replacement
        does not promise). A restart or failover too soon after the last one goes back
        under the deck and the next kind is dealt instead.
        """
        config = self.state.config
        if not self._deck:
            self._deck = list(config.faults)
            self.state.random.shuffle(self._deck)
        kind = self._deck.pop()
        last = self._last_of.get(kind, float("-inf"))
        if time.monotonic() - last < config.least_gap(kind):
            self._deck.insert(0, kind)
            kind = self._deck.pop() if len(self._deck) > 1 else "ghost"
        return kind

    def inject(self) -> None:
        """Inject one fault of the next kind (`next_kind`).

        A stop that would leave no worker running becomes a kill; a fault on a worker when
        none runs is only counted as missed.
        """
        random, slots = self.state.random, self.workers.slots
        kind = self.next_kind()
        running = [worker for worker in slots if worker.alive and worker.stopped_at is None]
        if kind in ("kill", "terminate", "stop") and not running:
            self.state.ledger.missed[kind] += 1
            return
        if kind == "stop" and sum(w.stopped_at is not None for w in slots) >= max(
            1, len(slots) - 1
        ):
            kind = "kill"
        if kind == "ghost":
            self._ghost_burst()
        elif kind == "poison":
            self._poison_burst()
        elif kind == "cancel":
            self._cancel()
        elif kind in ("restart", "failover"):
            self._database_command(kind)
        elif kind == "pin":
            self._pin()
        else:
            worker = random.choice(running)
            {"kill": self._kill, "stop": self._stop, "terminate": self._terminate}[kind](worker)

    def resume_due(self) -> None:
        """Resume (SIGCONT) the stopped workers whose time has come."""
        now = time.monotonic()
        for worker in self.workers.slots:
            if worker.stopped_at is not None and now >= worker.resume_at:
                self._resume(worker)

    def resume_all(self) -> None:
        """Resume every stopped worker, due or not."""
        for worker in self.workers.slots:
            if worker.stopped_at is not None:
                self._resume(worker)

    def release_due(self) -> None:
        """End the pin under way if its time has come; while a worker up long enough
        has not yet said that its claims read from floors, hold it on, up to settle_s()
        past its time: the table care sees the horizon held only once the pin's dead
        rows are there, and on a loaded machine the churn that makes them takes seconds
        of the pin. A worker that never says so fails the pin as before."""
        pin, now = self.pin, time.monotonic()
        if pin is None or now < pin.release_at:
            return
        if now < pin.release_at + settle_s():
            if now < pin.look_at:
                return
            pin.look_at = now + FLOORS_LOOK_S
            floors, settled = self._workers_read_floors()
            if settled and not floors:
                return  # held on; the run's loop goes on meanwhile
        self._release_pin(held=True)

    def release_all(self) -> None:
        """End the pin under way, due or not (cut short before its time: its cost is not
        judged). One held on past its time for a worker yet to read from floors is
        held on here, at the run's end, up to the same bound (`release_due`)."""
        pin = self.pin
        if pin is None:
            return
        held = time.monotonic() >= pin.release_at
        if not (held and pin.look_at):
            self._release_pin(held=held)
            return
        while self.pin is not None:
            time.sleep(FLOORS_LOOK_S)
            self.release_due()

    def _record(self, kind: str, worker: str | None, began: datetime) -> None:
        self.state.ledger.faults.append(Fault(kind, worker, began, self.state.clock()))
        self.last_fault = time.monotonic()

    def _kill(self, worker: Worker) -> None:
        began = self.state.clock()
        assert worker.process is not None
        worker.process.kill()
        worker.process.wait()
        self._record("kill", worker.name, began)
        self.workers.start(worker)

    def _stop(self, worker: Worker) -> None:
        assert worker.process is not None
        worker.stopped_at = self.state.clock()
        worker.process.send_signal(signal.SIGSTOP)
        delay = self.state.config.lease + self.state.random.uniform(0.5, 2.5)
        worker.resume_at = time.monotonic() + delay
        # The run's loop resumes it (`resume_due`), and records the fault; this timer
        # resumes it too, should the loop be waiting then for a lock the stopped worker
        # holds (only a SIGCONT would end that wait: the run would hang).
        timer = threading.Timer(
            delay + RESUME_SLACK_S,
            _resume_if_still_stopped,
            (worker, worker.process, worker.stopped_at),
        )
        timer.daemon = True
        timer.start()

    def _resume(self, worker: Worker) -> None:
        assert worker.stopped_at is not None and worker.process is not None
        with contextlib.suppress(ProcessLookupError):
            worker.process.send_signal(signal.SIGCONT)
        self._record("stop", worker.name, worker.stopped_at)
        worker.stopped_at = None

    def _terminate(self, worker: Worker) -> None:
        state = self.state
        began = state.clock()
        limit = state.random.choice([1, 1000])  # one connection, or all of them
        dropped = state.database(
            lambda: ChaosExecution.objects.terminate_connections(
                worker.name, limit=limit, using=state.alias
            ),
            "terminating connections",
        )
        if dropped:
            self._record("terminate", worker.name, began)
        else:  # not connected yet, or DATABASES names its connections itself
            state.ledger.missed["terminate"] += 1

    def _ghost_burst(self) -> None:
        began = self.state.clock()
        self.load.ghost_burst()
        self._record("ghost", None, began)

    def _poison_burst(self) -> None:
        began = self.state.clock()
        self.load.poison_burst()
        self._record("poison", None, began)

    def _cancel(self) -> None:
        state = self.state
        began = state.clock()
        job_id, cancelled = state.database(self.load.cancel_running, "cancelling a job")
        if not cancelled:
            state.ledger.missed["cancel"] += 1
            return
        ended = state.clock()
        state.ledger.cancelled[job_id] = ended
        self._record("cancel", None, began)

    def _database_command(self, kind: str) -> None:
        """Run the operator's command that restarts PostgreSQL, or moves the primary to a
        standby (a failover): a fault that hits every worker at once."""
        command = self.state.config.command(kind)
        assert command is not None
        what = "restarting PostgreSQL" if kind == "restart" else "failing over"
        self.state.on_event(f"{what}: {command}")
        began = self.state.clock()
        connections[self.state.alias].close()
        for attempt in range(1, COMMAND_TRIES + 1):
            completed = subprocess.run(
                shlex.split(command), capture_output=True, text=True, timeout=300, check=False
            )
            if completed.returncode == 0:
                break
            said = (completed.stderr or completed.stdout).strip()
            if attempt == COMMAND_TRIES:
                raise ChaosAborted(
                    f"The {kind} command failed {COMMAND_TRIES} times (the last with "
                    f"{completed.returncode}): {command}\n{said}"
                )
            last_line = said.splitlines()[-1] if said else ""
            self.state.on_event(
                f"the {kind} command failed ({completed.returncode}: {last_line}); "
                f"trying again in {COMMAND_RETRY_S:g} s"
            )
            time.sleep(COMMAND_RETRY_S)
        self._record(kind, None, began)
        self._last_of[kind] = time.monotonic()

    def _pin(self) -> None:
        """Hold the xmin horizon (an idle transaction, or a reader) for `pin_s`, and
        enqueue `pin_churn` quick jobs whose rows, once done, no VACUUM can remove
        meanwhile."""
        state = self.state
        if self.pin is not None:
            state.ledger.missed["pin"] += 1
            return
        began = state.clock()
        thread = HorizonPin(state.alias, state.random.choice(["idle", "reader"]))
        thread.start()
        if not thread.holding.wait(30) or thread.error is not None:
            thread.release()
            state.ledger.missed["pin"] += 1
            return
        try:
            before = self._claim_buffers(floors=False)
        except BaseException:
            thread.release()
            raise
        self.pin = Pin(thread, began, time.monotonic() + state.config.pin_s, before)
        self.load.enqueue_plain(state.config.pin_churn, sleep=0.0)

    def _release_pin(self, *, held: bool) -> None:
        state, pin = self.state, self.pin
        assert pin is not None
        self.pin = None
        try:
            floors, settled = self._workers_read_floors()
            after = self._pin_end_buffers(floors=floors)
            from_start = self._claim_buffers(floors=False) if floors else None
            dead, _, _ = state.database(
                lambda: Job.objects.table_upkeep(using=state.alias), "reading the job table"
            )
        finally:
            pin.thread.release()
        ended = state.clock()
        if not held or pin.thread.error is not None:
            unjudged = "cut short"
        elif not settled:
            unjudged = "no worker was up long enough to have seen it"
        elif dead < MIN_DEAD_ROWS:
            unjudged = f"{dead} dead rows, fewer than the table care's {MIN_DEAD_ROWS:,}"
        else:
            unjudged = None
        state.ledger.pins.append(
            PinSample(
                pin.thread.how,
                pin.began,
                ended,
                pin.before,
                after,
                floors,
                dead,
                unjudged,
                from_start,
            )
        )
        self._record("pin", None, pin.began)

    def drop_pin(self) -> None:
        """End the pin under way without a word (a run that stops short)."""
        if self.pin is not None:
            self.pin.thread.release()
            self.pin = None

    def _pin_end_buffers(self, *, floors: bool) -> int:
        """The cheapest of PIN_END_SAMPLES claims, PIN_END_GAP_S apart: an open writer of
        jobs holds every floor back to its transaction's start while it lasts (a keyed
        trigger waits up to LOCK_WAIT_S for its key's row lock), and a claim sampled then
        walks the dead entries since. The held horizon's cost lasts; a writer's passes."""
        samples = []
        for sample in range(PIN_END_SAMPLES):
            if sample:
                time.sleep(PIN_END_GAP_S)
            samples.append(self._claim_buffers(floors=floors))
        return min(samples)

    def _claim_buffers(self, *, floors: bool) -> int:
        """The buffers a claim of the run's queue reads now, as a worker sends it: from
        the queue's floor (as a worker that sees the horizon held), or from its start."""
        state = self.state
        from_floors = ClaimFloors(state.alias) if floors else None
        if from_floors is not None:
            from_floors.engage(True)
        cost: ClaimCost = state.database(
            lambda: Job.objects.claim_cost([state.queue], floors=from_floors, using=state.alias),
            "explaining a claim",
        )
        return cost.buffers

    def _workers_read_floors(self) -> tuple[bool, bool]:
        """Whether every worker up long enough to have seen the horizon held (and not
        stopped) says, in the registry, that its claims read from their queues' floors;
        and whether there was such a worker."""
        state = self.state
        settled = {
            worker.name
            for worker in self.workers.slots
            if worker.alive
            and worker.stopped_at is None
            and worker.started + settle_s() <= time.monotonic()
        }
        rows = state.database(
            lambda: WorkerRow.objects.status(using=state.alias), "reading the workers"
        )
        said = [row.claims_from_floors for row in rows if row.id in settled and row.live]
        return bool(said) and all(said), bool(said)
