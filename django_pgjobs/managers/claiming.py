"""How a claim takes its jobs (S6-S9, S34, S35): keyed jobs first when some wait, then
the limited queues (a statement of their own), then the rest in one fast statement.

Keyed jobs go first so that a backlog of unkeyed ones never starves them; their limits
bound how many a claim takes. Each claim statement's rows start with two flags: whether
a lapsed claim waits in its queues, and whether keyed jobs do.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, NamedTuple

from django.db import transaction

from django_pgjobs.claims import ClaimWriter, JobHandle
from django_pgjobs.conf import pgjobs_settings
from django_pgjobs.db import connection as db
from django_pgjobs.db import sql
from django_pgjobs.managers.floors import ClaimFloors, claim_floors
from django_pgjobs.managers.queues import limited_queues, limits_seen
from django_pgjobs.records import ClaimCost

if TYPE_CHECKING:
    from django_pgjobs.managers.jobs import JobManager

logger = logging.getLogger("django_pgjobs.jobs")


class Kinds(NamedTuple):
    """The kinds a claim takes: of `only` (None: any) and not of `other_than` (None: none)."""

    only: tuple[str, ...] | None = None
    other_than: tuple[str, ...] | None = None

    def admits(self, kind: str) -> bool:
        if self.only is not None and kind not in self.only:
            return False
        return self.other_than is None or kind not in self.other_than

    def params(self) -> dict[str, list[str] | None]:
        return {
            "only_kinds": None if self.only is None else list(self.only),
            "not_kinds": None if self.other_than is None else list(self.other_than),
        }


#: A claim of any kind.
ANY_KIND = Kinds()


class Claimed(NamedTuple):
    """What claim statements returned: their rows, whether a lapsed claim waits in
    their queues, and, when the claim came up short, the seconds until a job of its
    queues is next due (`due_known`; `due_in` None: nothing is due)."""

    rows: list[Any]
    lapsed_waiting: bool
    due_known: bool = False
    due_in: float | None = None
    #: A queue was found limited that the claimer took for unlimited: its jobs were
    #: skipped, and the claim is to be made again at once.
    limits_changed: bool = False


def claim_for_worker(
    jobs: JobManager,
    names: list[str],
    n: int,
    worker_id: str,
    alias: str,
    places: int,
    loop_kinds: list[str],
) -> tuple[list[JobHandle], tuple[bool, float | None]]:
    """JobManager.claim_for_worker: up to `n` jobs, of kinds other than `loop_kinds`
    for a worker's threads, and up to `places` of `loop_kinds` for its event loop (each
    into capacity of its own kind); with what was learnt of the next due job.

    The event loop's keyed jobs and those of limited queues are claimed first, by
    statements of their own; the rest of both kinds in one statement, one round trip
    (a wake-up's claim is most of its latency)."""
    if not loop_kinds:
        return _claim_handles(jobs, names, n + places, worker_id, alias, ANY_KIND)
    loop = Kinds(only=tuple(loop_kinds))
    threads = Kinds(other_than=tuple(loop_kinds))
    handles: list[JobHandle] = []
    if places > 0:
        handles, _ = _claim_handles(jobs, names, places, worker_id, alias, loop, unkeyed=False)
    left = few_sizes(places - len(handles), places)
    more, due = _claim_handles(jobs, names, n, worker_id, alias, threads, loop=(loop, left))
    handles += more
    # The statement may have found the loop's keyed jobs waiting (its flag): take them
    # now, as a claim of one kind does, not at the next poll.
    left = places - sum(1 for handle in handles if loop.admits(handle.kind))
    if left > 0 and keyed_claims(alias, loop).due():
        more, _ = _claim_handles(jobs, names, left, worker_id, alias, loop, unkeyed=False)
        handles += more
    return sorted(handles, key=_claim_order), due


def few_sizes(wanted: int, whole: int) -> int:
    """`wanted` when it is `whole`, else the largest power of two of it: each size of a
    claim is a statement of its own (sql.claim_jobs), prepared once per connection."""
    if wanted <= 0 or wanted >= whole:
        return max(wanted, 0)
    return 1 << (wanted.bit_length() - 1)


def _claim_handles(
    jobs: JobManager,
    names: list[str],
    n: int,
    worker_id: str,
    alias: str,
    kinds: Kinds,
    *,
    unkeyed: bool = True,
    loop: tuple[Kinds, int] | None = None,
) -> tuple[list[JobHandle], tuple[bool, float | None]]:
    """Claim up to `n` jobs of `kinds`, and with `loop`, up to its number of its kinds
    too, in the same statement as the unkeyed ones of `kinds`; `unkeyed=False`: the
    keyed jobs and those of limited queues only."""
    places = loop[1] if loop is not None else 0
    if n <= 0 and places <= 0:
        return [], (False, None)
    limited = sorted(limited_queues(alias, names))
    found = claim(names, limited, n, worker_id, alias, kinds, unkeyed=unkeyed, loop=loop)
    handles, stopped = _runnable(jobs, found.rows, alias)
    if found.lapsed_waiting or found.limits_changed:
        # Rare: a claim lapsed in these queues (its worker died): put it back in line (or
        # bury it). Or a queue was found limited that this process took for unlimited,
        # its jobs skipped: they are claimed now by the limited queues' own way. Then
        # fill what this claim has left.
        if found.lapsed_waiting:
            jobs.rescue_lapsed(names, pgjobs_settings.SWEEP_BATCH, using=alias)
        limited = sorted(limited_queues(alias, names))
        mine = sum(1 for handle in handles if kinds.admits(handle.kind))
        rest = None if loop is None else (loop[0], places - (len(handles) - mine))
        if mine < n or (rest is not None and rest[1] > 0):
            found = claim(
                names, limited, n - mine, worker_id, alias, kinds, unkeyed=unkeyed, loop=rest
            )
            more, also = _runnable(jobs, found.rows, alias)
            handles += more
            stopped = stopped or also
    handles.sort(key=_claim_order)
    if stopped or found.limits_changed:
        # The claim was short of the jobs it buried, or of a queue limited since: look
        # again at once.
        return handles, (True, 0.0)
    return handles, (found.due_known, found.due_in)


def _claim_order(handle: JobHandle) -> tuple[int, Any, int]:
    return (-handle.priority, handle.run_after, handle.id)


def claim(
    queues: list[str],
    limited: list[str],
    n: int,
    worker_id: str,
    alias: str,
    kinds: Kinds = ANY_KIND,
    *,
    unkeyed: bool = True,
    loop: tuple[Kinds, int] | None = None,
) -> Claimed:
    """Claim keyed jobs first when some wait (S34), then from the limited queues (a
    statement of their own), then the rest (`unkeyed`; with `loop`, its kinds' too, up
    to its number).

    Keyed jobs go first so that a backlog of unkeyed ones never starves them; their
    limits, and those of their queues (S37), bound how many a claim takes. Whether
    keyed jobs wait is what the last claim statement said; a claim that finds them
    waiting, unexpected, takes them at once with what it has left.
    """
    keyed = keyed_claims(alias, kinds)
    rows: list[Any] = []
    lapsed_waiting = tried = False
    if keyed.due() and n > 0:
        tried = True
        rows, lapsed_waiting = _claim_keyed(queues, limited, n, worker_id, alias, kinds)
    unkeyed_part = _claim_unkeyed(
        queues, limited, n - claimed(rows), worker_id, alias, kinds, fast=unkeyed, loop=loop
    )
    rows += unkeyed_part.rows
    lapsed_waiting = lapsed_waiting or unkeyed_part.lapsed_waiting
    mine = claimed(rows, kinds)
    # Not with a list of limited queues found stale: the caller claims again at once.
    if not tried and keyed.due() and mine < n and not unkeyed_part.limits_changed:
        more, lapsed = _claim_keyed(queues, limited, n - mine, worker_id, alias, kinds)
        rows += more
        lapsed_waiting = lapsed_waiting or lapsed
    return unkeyed_part._replace(rows=rows, lapsed_waiting=lapsed_waiting)


def _runnable(jobs: JobManager, rows: Sequence[Any], alias: str) -> tuple[list[JobHandle], bool]:
    """The handles of claim statements' rows, less the claims a cancel request binds
    (S38, each statement's next-to-last column): a retry, a lapse or a hand-back put
    their jobs back in line as their cancel came. Those are dead-lettered with their
    request's reason, never run; the second value says whether there were any."""
    handles = handles_of(rows, alias, jobs)
    reasons: dict[str, str] = {}
    for row in rows:
        if row[-2] is not None:
            reasons.update(db.json_value(row[-2]))
    if not reasons:
        return handles, False
    stopped = jobs.stop_cancelled(handles, reasons)
    logger.info("jobs ids=%s were cancelled before they ran again", sorted(stopped))
    return [handle for handle in handles if handle.id not in stopped], bool(stopped)


def handles_of(rows: Sequence[Any], alias: str, manager: ClaimWriter) -> list[JobHandle]:
    """The handles of a claim statement's rows (an empty claim returns one row of
    NULLs), each writing back through `manager`."""
    return [
        JobHandle(
            id=row[2],
            queue=row[3],
            kind=row[4],
            key=row[5],
            priority=row[6],
            run_after=row[7],
            attempt=row[8],
            max_attempts=row[9],
            lease_s=row[10],
            token=row[11],
            claimed_at=row[12],
            claimed_until=row[13],
            worker_id=row[14],
            expires_at=row[15],
            created_at=row[16],
            payload=db.json_value(row[17]),
            timeout_s=row[18],
            keyed=row[19],
            trace_context=db.json_value(row[20]),
            using=alias,
            manager=manager,
        )
        for row in rows
        if row[2] is not None
    ]


def claimed(rows: Sequence[Any], kinds: Kinds = ANY_KIND) -> int:
    """How many jobs of `kinds` claim statements' rows hold (an empty claim returns one
    row of NULLs, for its flags)."""
    return sum(1 for row in rows if row[2] is not None and kinds.admits(row[4]))


def _claim_keyed(
    queues: list[str], limited: list[str], n: int, worker_id: str, alias: str, kinds: Kinds
) -> tuple[list[Any], bool]:
    """Claim up to `n` keyed jobs of `queues`, each key up to its limits (S34, S35) and
    each limited queue up to its own (S37), in rounds of a few keys per queue each: until
    `n` are claimed, a round takes nothing (every key seen is at its limit, or none is
    left), or KEYED_ROUNDS. Fewer than `n` then means the keyed jobs ran dry for now."""
    keyed = keyed_claims(alias, kinds)
    rows: list[Any] = []
    lapsed_waiting = False
    for _ in range(KEYED_ROUNDS):
        wanted = n - claimed(rows)
        if wanted <= 0:
            break
        resumed = keyed.resumes(queues)
        more, lapsed = _claim_keyed_round(queues, limited, wanted, worker_id, alias, kinds)
        rows += more
        lapsed_waiting = lapsed_waiting or lapsed
        wrapped = resumed and not keyed.resumes(queues)  # the keys before the cursors are left
        if not claimed(more) and not wrapped:
            break
    return rows, lapsed_waiting


def _claim_keyed_round(
    queues: list[str], limited: list[str], n: int, worker_id: str, alias: str, kinds: Kinds
) -> tuple[list[Any], bool]:
    keyed = keyed_claims(alias, kinds)
    with transaction.atomic(using=alias):
        db.fetchall(sql.PLAN_KEYED_CLAIM, {}, alias)
        params: dict[str, Any] = {
            "queues": queues,
            "afters": [keyed.after.get(queue, "") for queue in queues],
            "keys": min(KEYS_PER_CLAIM, n),
            **kinds.params(),
        }
        ((pair_queues, pair_keys, last_seen, more_keys),) = db.fetchall(
            sql.LOCK_KEYS, params, alias
        )
        # Next time, each queue's keys after the last one seen: every key gets its turn.
        for queue, last, more in zip(queues, last_seen, more_keys, strict=True):
            keyed.after[queue] = last if more and last is not None else ""
        if not pair_keys:
            keyed.claimed(0, waiting=any(last is not None for last in last_seen))
            return [], False
        # The limited queues among the keys' take their claim turn as an unkeyed claim of
        # theirs does, so that their limits count keyed and unkeyed jobs alike (S37). A
        # queue limited since the list was read is not offered (the statement checks).
        turns = sorted(set(pair_queues).intersection(limited))
        locked = (
            [row[0] for row in db.fetchall(sql.LOCK_LIMITED_QUEUES, {"queues": turns}, alias)]
            if turns
            else []
        )
        params = {
            "lease_floor": claim_floors(alias).lease_floor,
            "queues": queues,
            "pair_queues": pair_queues,
            "pair_keys": pair_keys,
            "limited": locked,
            "limit": n,
            "worker_id": worker_id,
            "synchronous_commit": None,
            "due": False,  # the unkeyed claim after it answers for every queue
            **kinds.params(),
        }
        rows = db.fetchall(sql.CLAIM_KEYED_JOBS, params, alias)
    keyed.claimed(claimed(rows), waiting=bool(rows and rows[0][1]))
    return list(rows), bool(rows and rows[0][0])


def _claim_unkeyed(
    queues: list[str],
    limited: list[str],
    n: int,
    worker_id: str,
    alias: str,
    kinds: Kinds,
    *,
    fast: bool = True,
    loop: tuple[Kinds, int] | None = None,
) -> Claimed:
    """Claim from the limited queues first (a statement of their own), then the rest
    (`fast`), with `loop`'s kinds up to its number in the same statement.

    The fast statement skips paused and limited queues by itself, whatever `limited`
    (a cache) says, so a stale cache can delay a limited queue's claims a moment but
    never exceed its limit. When it ran over every queue and came up short, its
    answer of when the next job is due stands for the whole claim. A limited queue's
    claim cannot answer (the claims it counts against a rate are its own writes, which
    it cannot read back): its worker asks next_due_in, which sees them.
    """
    taken: list[Any] = []
    lapsed_waiting = False
    locked: set[str] = set()
    #: Whether keyed jobs wait in the limited queues: the fast claim reads the others.
    keyed_in_locked = False
    places = 0 if loop is None else loop[1]
    if n <= 0 and places <= 0:
        return Claimed(taken, lapsed_waiting)
    if limited and n > 0:
        with transaction.atomic(using=alias):
            rows = db.fetchall(sql.LOCK_LIMITED_QUEUES, {"queues": limited}, alias)
            locked = {row[0] for row in rows}
            if locked:
                params = {
                    "lease_floor": claim_floors(alias).lease_floor,
                    "queues": sorted(locked),
                    "limited": sorted(locked),
                    "limit": n,
                    "worker_id": worker_id,
                    "synchronous_commit": None,
                    "due": False,  # see above
                    **kinds.params(),
                }
                rows = db.fetchall(sql.CLAIM_LIMITED_JOBS, params, alias)
                taken += rows
                lapsed_waiting = bool(rows and rows[0][0])
                keyed_in_locked = bool(rows and rows[0][1])
        # Those not locked lost their limit since, or are paused: the fast claim below
        # covers them, and says which.
    rest = [queue for queue in queues if queue not in locked]
    wanted = few_sizes(n - claimed(taken), n)
    if not fast or not rest or wanted + places <= 0:
        if keyed_in_locked:  # a claim of some of the queues never says "none wait"
            keyed_claims(alias, kinds).found_waiting()
        return Claimed(taken, lapsed_waiting)
    # The loop's part takes the kinds the threads' part leaves out (its %(not_kinds)s).
    assert loop is None or (kinds.only is None and kinds.other_than == loop[0].only)
    # Asked only when it covers every queue of the claim: no limited queue was claimed.
    floors = claim_floors(alias)
    params = {
        "queues": rest,
        **floors.params(rest),  # may read them anew, the lease floor with them
        "lease_floor": floors.lease_floor,
        "worker_id": worker_id,
        "due": not locked,
        **kinds.params(),
        **db.commit_mode(alias),
    }
    rows = db.fetchall(sql.claim_jobs(wanted, places), params, alias)
    taken += rows
    lapsed_waiting = lapsed_waiting or bool(rows and rows[0][0])
    keyed_claims(alias, kinds).seen(rows, elsewhere=keyed_in_locked)
    if loop is not None:
        keyed_claims(alias, loop[0]).seen(rows, elsewhere=keyed_in_locked)
    if rows and limits_seen(alias, rest, rows[0][-3]):
        # A queue was limited since this process last looked: this statement skipped its
        # jobs, and so may a keyed claim before it have. The caller claims again at once,
        # the keyed claim too, each by the limited queue's own way.
        keyed_freed(alias)
        return Claimed(taken, lapsed_waiting, limits_changed=True)
    due = rows[0][-1] if rows else None  # NULL: full, or not asked
    if due is None:
        return Claimed(taken, lapsed_waiting)
    return Claimed(taken, lapsed_waiting, True, None if math.isinf(due) else max(due, 0.0))


#: Most concurrency key values one keyed claim visits (and no more than the jobs it
#: wants); the next claim goes on from the last one seen, so every key gets its turn
#: however many there are.
KEYS_PER_CLAIM = 64
#: Most rounds of keys one claim goes through to fill its slots.
KEYED_ROUNDS = 8
#: After a keyed claim that took nothing (every key at its limit, say), the longest the
#: next waits; from KEYED_BACKOFF_MIN_S, doubled each time. A completion of a keyed job
#: by this process, or a claim that finds keys anew, makes it due at once.
KEYED_BACKOFF_MIN_S = 0.05
KEYED_BACKOFF_MAX_S = 1.0


class KeyedClaims:
    """What a process knows of the keyed jobs of one database (S34): whether some wait,
    where the next keyed claim starts, and when it is due."""

    def __init__(self) -> None:
        # Until a claim statement says some wait: a claim where none wait stays one
        # statement (S6).
        self.waiting = False
        #: Per queue, the key after which its next keyed claim starts ("": the first).
        self.after: dict[str, str] = {}
        self._backoff_s = 0.0
        self._due_at = 0.0

    def resumes(self, queues: Sequence[str]) -> bool:
        """Whether the next keyed claim of `queues` starts past the first key of one."""
        return any(self.after.get(queue, "") for queue in queues)

    def due(self) -> bool:
        return self.waiting and time.monotonic() >= self._due_at

    def claimed(self, taken: int, *, waiting: bool) -> None:
        self.waiting = waiting
        if taken:
            self._backoff_s = 0.0
            self._due_at = 0.0
        else:
            self._backoff_s = min(
                KEYED_BACKOFF_MAX_S, max(KEYED_BACKOFF_MIN_S, self._backoff_s * 2)
            )
            self._due_at = time.monotonic() + self._backoff_s

    def seen(self, rows: Sequence[Any], *, elsewhere: bool = False) -> None:
        """A claim statement said whether keyed jobs wait in its queues (its second flag);
        `elsewhere`: another statement of the claim found some in the claimer's others."""
        if rows:
            if bool(rows[0][1]) or elsewhere:
                self.found_waiting()
            else:
                self.waiting = False

    def found_waiting(self) -> None:
        """A claim statement found keyed jobs waiting (in some of the claimer's queues)."""
        if not self.waiting:
            self._backoff_s = self._due_at = 0.0
        self.waiting = True

    def freed(self) -> None:
        """A keyed job finished here: its key may take another now."""
        self._backoff_s = self._due_at = 0.0


_keyed: dict[tuple[str, Kinds], KeyedClaims] = {}


def keyed_claims(alias: str, kinds: Kinds = ANY_KIND) -> KeyedClaims:
    """What this process knows of the keyed jobs of database `alias`, for claims of
    `kinds`: a worker's threads and its event loop each keep their own cursor and
    backoff, so that keys of one kind never hold back claims of the other."""
    key = (alias, kinds)
    claims = _keyed.get(key)
    if claims is None:
        claims = _keyed[key] = KeyedClaims()
    return claims


def keyed_freed(alias: str) -> None:
    """A keyed job of database `alias` finished here: its key may take another now."""
    for (of_alias, _), claims in list(_keyed.items()):
        if of_alias == alias:
            claims.freed()


#: The claim `claim_cost` explains: what a worker with this many free places sends.
COST_SAMPLE_LIMIT = 10


def claim_cost(queues: list[str], floors: ClaimFloors | None, alias: str) -> ClaimCost:
    """JobManager.claim_cost: EXPLAIN (ANALYZE, BUFFERS) of the claim of COST_SAMPLE_LIMIT
    jobs of `queues` a worker sends now, from `floors` (None: from each queue's start)."""
    floors = floors or ClaimFloors(alias)
    params = {
        "queues": queues,
        **floors.params(queues),
        "lease_floor": floors.lease_floor,
        "worker_id": "pgjobs-claim-cost",
        "synchronous_commit": None,
        "due": True,
        **ANY_KIND.params(),
    }
    plan = db.explained_as_worker(sql.claim_jobs(COST_SAMPLE_LIMIT), params, alias)
    return ClaimCost(*db.plan_cost(plan), plan)
