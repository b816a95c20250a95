"""A chaos run's settings, the progress it reports as it goes, and its final report."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from pathlib import Path

from django_pgjobs.chaos import invariants
from django_pgjobs.chaos.facts import PinSample
from django_pgjobs.chaos.invariants import Verdict

FAULT_KINDS = (
    "kill",
    "stop",
    "terminate",
    "ghost",
    "poison",
    "cancel",
    "restart",
    "failover",
    "pin",
)
#: The faults made by a command of the operator's: the option that gives it, and the
#: ChaosConfig fields of the command and of the least time between two such faults.
DATABASE_COMMANDS = {
    "restart": ("--allow-db-restart", "restart_command", "restart_every"),
    "failover": ("--failover", "failover_command", "failover_every"),
}
DEFAULT_FAULTS = ("kill", "stop", "terminate", "ghost", "poison", "cancel")


class ChaosAborted(Exception):
    """The run could not go on (a worker cannot start, the database is gone)."""


@dataclass(frozen=True, slots=True)
class ChaosConfig:
    """What a run does. Every duration is in seconds."""

    duration: float = 60.0
    workers: int = 3
    concurrency: int = 4
    jobs: int = 200  # enqueued before the first fault
    rate: float = 20.0  # plain jobs enqueued per second while faults go on
    keys: int = 8
    triggers: float = 4.0  # keyed triggers per second
    limited: float = 4.0  # jobs of the rate-limited concurrency key enqueued per second
    workflows: float = 1.0  # chains and batches with callbacks (S29-S31) written per second
    lease: int = 4
    max_attempts: int = 6
    faults: tuple[str, ...] = DEFAULT_FAULTS
    fault_every: float = 2.0  # mean time between two faults
    restart_command: str | None = None
    restart_every: float = 30.0  # least time between two database restarts
    failover_command: str | None = None  # moves the primary; returns once it took writes
    failover_every: float = 15.0  # least time between two failovers
    pin_s: float = 25.0  # how long a pin holds the xmin horizon
    pin_churn: int = 1500  # plain jobs enqueued as a pin begins, whose rows it keeps dead
    drain_timeout: float = 120.0
    seed: int | None = None
    keep: bool = False

    def __post_init__(self) -> None:
        problems = []
        if self.duration <= 0:
            problems.append("the duration must be more than 0 seconds")
        if self.workers < 1 or self.concurrency < 1:
            problems.append("there must be at least one worker of at least one thread")
        if min(self.jobs, self.rate, self.keys, self.triggers, self.limited, self.workflows) < 0:
            problems.append(
                "jobs, rate, keys, triggers, limited and workflows must not be negative"
            )
        if self.lease < 1 or self.max_attempts < 1:
            problems.append("the lease and max attempts must be at least 1")
        if self.pin_s <= 0 or self.pin_churn < 0:
            problems.append("a pin must last more than 0 seconds, with churn of 0 jobs or more")
        if self.fault_every <= 0 or self.drain_timeout <= 0:
            problems.append("the fault interval and the drain timeout must be positive")
        unknown = sorted(set(self.faults) - set(FAULT_KINDS))
        if unknown:
            problems.append(
                f"unknown faults {', '.join(unknown)} (known: {', '.join(FAULT_KINDS)})"
            )
        for kind, (option, _, _) in DATABASE_COMMANDS.items():
            if kind in self.faults and not self.command(kind):
                problems.append(f"a {kind} fault needs the command that makes it ({option} CMD)")
        if problems:
            raise ValueError("; ".join(problems) + ".")

    def command(self, kind: str) -> str | None:
        """The operator's command that makes a fault of `kind` (restart, failover)."""
        fields = DATABASE_COMMANDS.get(kind)
        return getattr(self, fields[1]) if fields else None

    def least_gap(self, kind: str) -> float:
        """The least time between two faults of `kind` (0: none)."""
        fields = DATABASE_COMMANDS.get(kind)
        return float(getattr(self, fields[2])) if fields else 0.0


@dataclass(frozen=True, slots=True)
class Progress:
    """Where a run is, for the progress bar."""

    phase: str  # "faults", "drain" or "check"
    elapsed: float
    total: float
    enqueued: int
    finished: int
    waiting: int  # pending or running
    faults: Counter[str]


@dataclass(slots=True)
class ChaosReport:
    """What a run did and what it found."""

    run_id: str
    queue: str
    config: ChaosConfig
    verdicts: list[Verdict]
    jobs: int
    triggers: int
    chains: int
    batches: Counter[str]  # by how each ended
    busy_triggers: int
    ghosts: int
    executions: int
    reruns: invariants.Reruns
    faults: Counter[str]
    missed_faults: Counter[str]
    dead: Counter[str]
    drain_s: float | None
    seconds: float
    log_dir: Path | None
    pins: list[PinSample]

    @property
    def passed(self) -> bool:
        return all(verdict.holds for verdict in self.verdicts)
