"""Where claims start reading each queue while the xmin horizon is held (issue 27): a
process's claim floors per database, read by CLAIM_FLOORS, engaged by the table care
(django_pgjobs.maintenance.TableCare)."""

from __future__ import annotations

import time
from typing import Any

from django_pgjobs.db import connection as db
from django_pgjobs.db import sql

#: While floors are engaged: seconds between two readings of them from the last ones on,
#: and between two from the start (which finds a job put back behind a floor, and walks
#: every dead entry the held horizon keeps: a second's worth of claims once, at 500 jobs/s
#: two minutes into a held horizon; a 1 s period cost a worker 60 % of its rate after five).
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
    its old run_after waits at most FLOORS_RESET_S, when the floors are read from the
    start. Off, a claim reads every level from its start, as it always did.
    """

    def __init__(self, alias: str) -> None:
        self.alias = alias
        self.engaged = False
        self._floors: dict[str, Any] = {}
        self._tops: dict[str, int] = {}
        #: No running job's lease ends before it (None: read leases from the start).
        self.lease_floor: Any = None
        self._step_at = 0.0
        self._reset_at = 0.0

    def engage(self, held: bool) -> None:
        """The horizon is held (engage) or moves (off)."""
        if held and not self.engaged:
            self._step_at = self._reset_at = 0.0
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
        if now >= self._reset_at:
            self._floors.clear()
            self.lease_floor = None
            self._reset_at = now + FLOORS_RESET_S
        if now >= self._step_at or any(queue not in self._floors for queue in queues):
            self._read(queues)
            self._step_at = now + FLOORS_STEP_S
        return {
            "floors": [self._floors.get(queue) for queue in queues],
            "tops": [self._tops.get(queue) for queue in queues],
        }

    def _read(self, queues: list[str]) -> None:
        rows = db.fetchall(
            sql.CLAIM_FLOORS,
            {
                "queues": queues,
                "floors": [self._floors.get(queue) for queue in queues],
                "lease_floor": self.lease_floor,
            },
            self.alias,
        )
        for queue, floor, top, lease_floor in rows:
            self._floors[queue] = floor
            self.lease_floor = lease_floor
            if top is not None:  # none pending: the last top stays the likeliest
                self._tops[queue] = top


_floors: dict[str, ClaimFloors] = {}


def claim_floors(alias: str) -> ClaimFloors:
    """Where this process's claims of database `alias` start reading each queue."""
    floors = _floors.get(alias)
    if floors is None:
        floors = _floors[alias] = ClaimFloors(alias)
    return floors
