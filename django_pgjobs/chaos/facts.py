"""What a chaos run knows when it is judged: the executions its ledger holds, the faults
it injected, the jobs and batches it wrote and how they ended, its pins. Plain values, no
database, no clock: `invariants` judges them."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any, Protocol

#: How long after a worker was killed a statement it had sent may still start on the
#: server (a busy machine picks it up late).
IN_FLIGHT_SLACK = timedelta(seconds=2)


class Execution(Protocol):
    """One execution, as the ledger records it (a ChaosExecution row)."""

    job_id: int
    token: Any
    attempt: int
    max_attempts: int
    worker: str
    key: str | None
    version: int
    ghost: bool
    claimed_at: datetime
    started_at: datetime
    written_at: datetime | None
    outcome: str


@dataclass(frozen=True, slots=True)
class Fault:
    """One injected fault, stamped with the database's clock.

    `began` is read before the fault is injected, `ended` once it has taken effect (for
    a SIGSTOP, after the SIGCONT). `worker` is the worker it hit; None for a fault that
    hits every worker (a database restart, a failover) or none (a rolled-back burst).
    """

    kind: str
    worker: str | None
    began: datetime
    ended: datetime

    def may_explain(self, execution: Execution, rerun: Execution | None) -> bool:
        """Whether this fault can have cut `execution` short, before `rerun` was claimed."""
        if self.kind in ("ghost", "poison", "cancel", "pin"):  # not faults of a worker
            return False
        if self.worker is not None and self.worker != execution.worker:
            return False
        # A statement the worker sent just before it died still runs and commits on the
        # server: its start can be stamped a moment after the fault ended.
        slack = IN_FLIGHT_SLACK if self.kind in ("kill", "terminate") else timedelta(0)
        return self.ended + slack >= execution.started_at and (
            rerun is None or self.began <= rerun.claimed_at
        )


@dataclass(frozen=True, slots=True)
class PinSample:
    """A pin (the xmin horizon held by an idle transaction or a REPEATABLE READ reader)
    and what a claim of the run's queue cost as it began and as it ended: the shared
    buffers of the claim the workers send, from their queues' floors when they said they
    read from them (`floors`), and (`from_start`, with floors) what the claim from each
    queue's start read as it ended: the walk the floors spared. `unjudged` says why a
    pin's cost is not judged (None: it is): cut short (the run ended first, or its
    connection was lost), no worker up long enough to have seen it held, or fewer dead
    rows than the table care acts on."""

    how: str
    began: datetime
    ended: datetime
    before: int
    after: int
    floors: bool
    dead_rows: int  # the job table's dead rows as it ended
    unjudged: str | None = None
    from_start: int | None = None


@dataclass(frozen=True, slots=True)
class FinalJob:
    """A chaos job's row at the end of the run, live or dead."""

    id: int
    key: str | None
    state: str  # pending, running, done, or dead
    version: int | None = None  # the payload's trigger number
    result: Any = None  # a done job's result
    reason: str | None = None  # a dead job's reason
    poison: bool = False  # a hostile handler's job (chaos.poison)


@dataclass(frozen=True, slots=True)
class BatchWritten:
    """A batch the run committed (S31): its members, and its callbacks by what each fires
    on ("success", "failure", "complete")."""

    id: int
    members: tuple[int, ...]
    callbacks: dict[str, int]


@dataclass(frozen=True, slots=True)
class BatchEnd:
    """A batch's row at the end of the run: its state and tally."""

    state: str
    done: int
    failed: int


@dataclass(slots=True)
class Evidence:
    """Everything a run knows when it is judged."""

    executions: Sequence[Execution]
    #: Jobs the run committed, by id: what each was given (a key, or None).
    committed: dict[int, str | None]
    #: The last trigger number the run committed for each key.
    last_triggers: dict[str, int]
    #: Ids returned inside transactions that rolled back.
    ghosts: set[int]
    faults: Sequence[Fault]
    final: dict[int, FinalJob]
    #: Ids whose enqueue's commit the run cannot vouch for (the connection broke in it).
    uncertain: set[int] = field(default_factory=set)
    #: Keys whose last trigger is among the uncertain ones.
    uncertain_keys: set[str] = field(default_factory=set)
    #: Workers that exited without being told to, with what they said last.
    worker_exits: list[str] = field(default_factory=list)
    #: Jobs cancelled while they ran, with the database's time once the cancel committed.
    cancelled: dict[int, datetime] = field(default_factory=dict)
    #: Jobs of the run's rate-limited concurrency key.
    limited: set[int] = field(default_factory=set)
    #: Chains the run committed, each job after the one before it (S29, S30).
    chains: list[tuple[int, ...]] = field(default_factory=list)
    #: Batches the run committed (S31), and how each ended, by id.
    batches: list[BatchWritten] = field(default_factory=list)
    batch_ends: dict[int, BatchEnd] = field(default_factory=dict)
    #: The run's pins, with the claim's cost as each began and ended.
    pins: list[PinSample] = field(default_factory=list)
