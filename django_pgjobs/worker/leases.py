"""The claims a worker holds: when each lease ends, the heartbeats that keep long jobs
claimed (S11), and handing claims back at a stop (S25)."""

from __future__ import annotations

import logging
import time
import uuid
from collections.abc import Sequence
from dataclasses import dataclass

from django_pgjobs import registry
from django_pgjobs.claims import JobHandle
from django_pgjobs.managers import JobManager
from django_pgjobs.worker.faults import Faults, describe

logger = logging.getLogger("django_pgjobs.worker")

#: Heartbeat a running job when this fraction of its lease has passed since the last one.
HEARTBEAT_FRACTION = 1 / 3


@dataclass(eq=False)
class Running:
    """One claim this worker holds, from its claim until its outcome is collected."""

    handle: JobHandle
    next_heartbeat: float
    #: Transaction mode: once started, the job's row lock keeps claimers away.
    atomic: bool
    #: When the claim lapses at the latest, on this process's monotonic clock: measured
    #: from after the claim or heartbeat statement returned, so never before the
    #: database's claimed_until. A job still waiting for a thread then is not started.
    lease_ends: float
    #: Set by the handler thread that takes the job (a prefetched job waits until then).
    started: bool = False

    @property
    def heartbeats(self) -> bool:
        return not (self.atomic and self.started)


class Leases:
    """The claims held, by token, and their heartbeats."""

    def __init__(self, jobs: JobManager, faults: Faults) -> None:
        self.jobs = jobs
        self.faults = faults
        self._running: dict[uuid.UUID, Running] = {}
        #: The earliest next_heartbeat among the claims (inf: none due).
        self.next_heartbeat_at = float("inf")

    def __len__(self) -> int:
        return len(self._running)

    def hold(self, handles: Sequence[JobHandle]) -> list[Running]:
        """Hold the claims just made; return them, to be handed to the threads."""
        claimed_at = time.monotonic()
        held = []
        for handle in handles:
            definition = registry.get_definition(handle.kind)
            running = Running(
                handle=handle,
                next_heartbeat=claimed_at + handle.lease_s * HEARTBEAT_FRACTION,
                atomic=definition is not None and definition.atomic,
                lease_ends=claimed_at + handle.lease_s,
            )
            self._running[handle.token] = running
            self.next_heartbeat_at = min(self.next_heartbeat_at, running.next_heartbeat)
            held.append(running)
        return held

    def drop(self, handle: JobHandle) -> None:
        """Forget a claim whose outcome is in (or that was handed back)."""
        self._running.pop(handle.token, None)

    def handles(self) -> list[JobHandle]:
        return [running.handle for running in self._running.values()]

    def heartbeat_due(self, now: float) -> None:
        """Extend the leases whose heartbeat is due, in one statement (S11)."""
        if now < self.next_heartbeat_at or self.faults.waiting(now):
            return
        due = []
        self.next_heartbeat_at = float("inf")
        for running in self._running.values():
            if not running.heartbeats:
                continue
            if running.next_heartbeat <= now:
                due.append(running)
            else:
                self.next_heartbeat_at = min(self.next_heartbeat_at, running.next_heartbeat)
        if not due:
            return
        try:
            extended = self.jobs.heartbeat_unlocked([running.handle for running in due])
        except Exception as error:
            self.next_heartbeat_at = now  # try again once the database is back
            self.faults.failed("heartbeat", error)
            return
        self.faults.recovered()
        extended_tokens = {handle.token for handle in extended}
        extended_at = time.monotonic()
        for running in due:
            every = running.handle.lease_s * HEARTBEAT_FRACTION
            if running.handle.token in extended_tokens:
                running.next_heartbeat = now + every
                running.lease_ends = extended_at + running.handle.lease_s
            else:
                # Locked by a fence right now, or no longer ours: look again soon.
                running.next_heartbeat = now + min(1.0, every)
            self.next_heartbeat_at = min(self.next_heartbeat_at, running.next_heartbeat)

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
        logger.log(
            level,
            "handed back %s of %s %s (the rest return when their lease lapses)",
            released,
            len(handles),
            which,
        )
