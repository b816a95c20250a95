"""Where claims start reading each queue while the xmin horizon is held (issue 27): a
process's claim floors per database, read by CLAIM_FLOORS, engaged by the table care
(django_pgjobs.maintenance.TableCare)."""

from __future__ import annotations

import threading
import time
from typing import Any

from django_pgjobs.db import connection as db
from django_pgjobs.db import sql

#: While floors are engaged: seconds between two readings of them from the last ones on,
#: in the claims' path, and between two from the start (which finds a job put back behind
#: a floor, and walks every dead entry the held horizon keeps: a second's worth of claims
#: once, at 500 jobs/s two minutes into a held horizon), by the worker's maintenance
#: thread, off the claims' path (`lower`).
FLOORS_STEP_S = 0.2
FLOORS_RESET_S = 10.0


class ClaimFloors:
    """Where the claims of one database start reading each queue (CLAIM_FLOORS): engaged
    while the xmin horizon is held (TableCare sees it), off otherwise.

    While something holds the horizon (a transaction left open, a long report), VACUUM
    removes nothing, and every job a claim took leaves an entry in the claim index that
    only a visit of its row shows to be dead. A claim reading from the start of a queue's
    level walks all of them: its cost grows with the job rate times the horizon's age.
    From a floor, a claim reads the live part only. A floor is never above a pending job
    a writer could still make visible (CLAIM_FLOORS says how), save one made pending with
    a run_after older than its writer's start: a backdated job or a claim put back with
    its old run_after waits until the floors are read from the start and lowered to it
    (`lower`, every FLOORS_RESET_S). Off, a claim reads every level from its start, as it
    always did.

    The claims' thread reads the floors on (`params`), the maintenance thread lowers them
    (`lower`): a floor only ever goes down outside the claims' own readings, so a reading
    in flight while they are lowered keeps the lower of the two.
    """

    def __init__(self, alias: str) -> None:
        self.alias = alias
        self.engaged = False
        self._lock = threading.Lock()
        self._floors: dict[str, Any] = {}
        self._tops: dict[str, int] = {}
        #: No running job's lease ends before it (None: read leases from the start).
        self.lease_floor: Any = None
        self._step_at = 0.0
        #: How many times the floors were lowered: a reading that began before the last
        #: lowering keeps the lower floors.
        self._lowered = 0

    def engage(self, held: bool) -> None:
        """The horizon is held (engage) or moves (off)."""
        with self._lock:
            if held and not self.engaged:
                self._step_at = 0.0
            elif not held:
                self._tops.clear()
            if held != self.engaged:
                self._floors.clear()
                self.lease_floor = None
            self.engaged = held

    def params(self, queues: list[str]) -> dict[str, list[Any]]:
        """The %(floors)s and %(tops)s of a claim of `queues` (NULLs when off)."""
        if not self.engaged:
            return {"floors": [None] * len(queues), "tops": [None] * len(queues)}
        now = time.monotonic()
        if now >= self._step_at or any(queue not in self._floors for queue in queues):
            self._read(queues)
            self._step_at = now + FLOORS_STEP_S
        with self._lock:
            return {
                "floors": [self._floors.get(queue) for queue in queues],
                "tops": [self._tops.get(queue) for queue in queues],
            }

    def lower(self) -> None:
        """Read the floors of the queues claimed so far from the start, and lower the
        claims' floors to them: a job put back behind its queue's floor (a claim handed
        back or rescued with its old run_after, a released child, a job backdated by hand)
        is claimed from then on. Walks every dead entry the held horizon keeps, so the
        maintenance thread runs it, not the claims."""
        with self._lock:
            queues = list(self._floors) if self.engaged else []
        if not queues:
            return
        rows = db.fetchall(
            sql.CLAIM_FLOORS,
            {"queues": queues, "floors": [None] * len(queues), "lease_floor": None},
            self.alias,
        )
        with self._lock:
            if not self.engaged:
                return
            for queue, floor, _top, lease_floor in rows:
                self._floors[queue] = _lowest(self._floors.get(queue), floor)
                self.lease_floor = _lowest(self.lease_floor, lease_floor)
            self._lowered += 1

    def _read(self, queues: list[str]) -> None:
        with self._lock:
            sent = [self._floors.get(queue) for queue in queues]
            lease_floor, lowered = self.lease_floor, self._lowered
        rows = db.fetchall(
            sql.CLAIM_FLOORS,
            {"queues": queues, "floors": sent, "lease_floor": lease_floor},
            self.alias,
        )
        with self._lock:
            if not self.engaged:
                return  # let go while the reading was on its way: nothing of it counts
            lowered_since = self._lowered != lowered
            for queue, floor, top, lease_floor in rows:
                if lowered_since:
                    floor = _lowest(self._floors.get(queue), floor)
                    lease_floor = _lowest(self.lease_floor, lease_floor)
                self._floors[queue] = floor
                self.lease_floor = lease_floor
                if top is not None:  # none pending: the last top stays the likeliest
                    self._tops[queue] = top


def _lowest(current: Any, found: Any) -> Any:
    """The lower of two floors (None: none known, so the one found)."""
    return found if current is None else min(current, found)


_floors: dict[str, ClaimFloors] = {}


def claim_floors(alias: str) -> ClaimFloors:
    """Where this process's claims of database `alias` start reading each queue."""
    floors = _floors.get(alias)
    if floors is None:
        floors = _floors[alias] = ClaimFloors(alias)
    return floors
