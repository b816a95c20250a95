"""The state a chaos run's parts share: its identity, its ledger, and its database access.

`ChaosRun` makes one `RunState` and hands it to the workers, the load and the faults; none
of them imports another's module through it.
"""

from __future__ import annotations

import contextlib
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime
from random import Random
from typing import Any

from django.db import DatabaseError, InterfaceError, OperationalError, connections

from django_pgjobs.chaos.config import ChaosAborted, ChaosConfig
from django_pgjobs.chaos.facts import BatchWritten, Fault, PinSample
from django_pgjobs.chaos.models import ChaosExecution

#: How long the run waits for its database to come back before it gives up.
DATABASE_PATIENCE_S = 120.0


@dataclass(slots=True)
class Ledger:
    """What the run did, for the judgement."""

    committed: dict[int, str | None] = field(default_factory=dict)
    uncertain: set[int] = field(default_factory=set)
    ghosts: set[int] = field(default_factory=set)
    versions: dict[str, int] = field(default_factory=dict)  # the last trigger number given
    last_triggers: dict[str, int] = field(default_factory=dict)  # ... and committed
    uncertain_keys: set[str] = field(default_factory=set)
    triggers: int = 0
    skipped_busy: int = 0  # triggers given up: their key's job was locked too long
    faults: list[Fault] = field(default_factory=list)
    #: Jobs the run cancelled while they ran, with the database's time after the cancel.
    cancelled: dict[int, datetime] = field(default_factory=dict)
    #: Jobs of the run's rate-limited concurrency key.
    limited: set[int] = field(default_factory=set)
    #: The chains the run committed (each job after the one before it), and its batches.
    chains: list[tuple[int, ...]] = field(default_factory=list)
    batches: list[BatchWritten] = field(default_factory=list)
    missed: Counter[str] = field(default_factory=Counter)
    #: The pins that ended, with the claim's cost at each one's start and end.
    pins: list[PinSample] = field(default_factory=list)
    worker_exits: list[str] = field(default_factory=list)


@dataclass(slots=True)
class RunState:
    """One run's identity, settings, random source, ledger and event sink."""

    config: ChaosConfig
    run_id: str
    queue: str
    alias: str
    # One source for every random choice, so that a seed replays the whole run.
    random: Random
    on_event: Callable[[str], None]
    ledger: Ledger = field(default_factory=Ledger)

    def clock(self) -> datetime:
        """Read the database's clock: it times the faults as it times the executions."""
        now: datetime = self.database(
            lambda: ChaosExecution.objects.clock(using=self.alias), "reading the clock"
        )
        return now

    def database(self, operation: Callable[[], Any], doing: str) -> Any:
        """Run `operation`, waiting out a database that went away (a restart)."""
        deadline = time.monotonic() + DATABASE_PATIENCE_S
        while True:
            try:
                return operation()
            except (OperationalError, InterfaceError) as error:
                if time.monotonic() > deadline:
                    raise ChaosAborted(
                        f"The database did not answer for {DATABASE_PATIENCE_S:g} s while "
                        f"{doing}: {str(error).strip().splitlines()[0]}"
                    ) from None
                self.reconnect()
                time.sleep(0.5)

    def reconnect(self) -> None:
        """Drop the run's connection, so that its next query opens a fresh one."""
        with contextlib.suppress(DatabaseError):
            connections[self.alias].close()
