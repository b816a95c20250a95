"""Plain values the managers return: what an enqueue, a claim rescue or a requeue did,
a job as stored, and the queues at a glance.

How one reads to a person ("≈ 1,000", "3 min", "3 of 5") is the business of the surface
that shows it (`labels`).
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from datetime import datetime
from typing import Any, NamedTuple

#: Counts stop at this many rows; past it they are the planner's estimate.
COUNT_CAP = 1_000


class _EnqueueRow(NamedTuple):
    id: int
    inserted: bool


class EnqueueResult(_EnqueueRow):
    """What an enqueue did: the job's id, and whether a row was inserted (else merged, S3).

    Unpacks and compares as `(id, inserted)`. `created_at` is when the job was created, by
    the database's clock (the live job's, when merged); None after enqueue_many.
    """

    created_at: datetime | None = None

    @property
    def merged(self) -> bool:
        return not self.inserted


class RescueResult(NamedTuple):
    """What a rescue of lapsed claims did: back to pending, dead, triggers promoted."""

    requeued: int
    dead: int
    promoted: int

    @property
    def total(self) -> int:
        return self.requeued + self.dead + self.promoted


class RequeueResult(NamedTuple):
    """What a requeue did: letters back in the live table, and letters merged into the
    live job of their key."""

    requeued: int
    merged: int


class DeadPartition(NamedTuple):
    """A partition of the dead-letter table (S44): its range (None: open on that side;
    both None: the default partition), its letters (the planner's estimate) and size."""

    name: str
    lower: datetime | None
    upper: datetime | None
    letters: int
    size_bytes: int


@dataclass(frozen=True, slots=True)
class JobRecord:
    """A job as stored, from either table (S19). `state` is "dead" for a dead letter."""

    id: int
    state: str
    queue: str
    kind: str
    key: str | None
    priority: int
    run_after: datetime
    attempts: int
    max_attempts: int
    lease_s: int
    claimed_by: Any
    claimed_until: datetime | None
    claimed_at: datetime | None
    started_at: datetime | None
    worker_id: str | None
    expires_at: datetime | None
    payload: dict[str, Any]
    result: Any
    last_error: str | None
    errors: list[dict[str, Any]]
    rerun_after: datetime | None
    rerun_payload: dict[str, Any] | None
    rerun_expires_at: datetime | None
    result_ttl_s: int | None
    created_at: datetime
    finished_at: datetime | None
    purge_at: datetime | None = None
    reason: str | None = None
    died_at: datetime | None = None
    timeout_s: float | None = None
    #: The handler's latest report: {"fraction", "message", "data", "at"} (None: none).
    progress: dict[str, Any] | None = None
    limit_key: str | None = None
    concurrency_limit: int | None = None
    rate_limit: int | None = None
    rate_period_s: float | None = None
    #: Dependencies (S29): whether it was written with parents, whether some job waits
    #: for it, and how many of its parents have not ended (it is waiting while above 0).
    has_parents: bool = False
    has_children: bool = False
    parents_left: int = 0
    #: Its parents' and its children's ids (filled by get_job).
    parents: tuple[int, ...] = ()
    children: tuple[int, ...] = ()

    @property
    def is_dead(self) -> bool:
        return self.state == "dead"

    @classmethod
    def of(cls, values: dict[str, Any]) -> JobRecord:
        """The record of a row's values (columns it does not know are left out)."""
        return cls(**{name: values[name] for name in _RECORD_FIELDS if name in values})


_RECORD_FIELDS = tuple(f.name for f in fields(JobRecord))


@dataclass(frozen=True, slots=True)
class BatchCallbackState:
    """One callback of a batch (S31): what it fires on, its job, and where that job is
    ('waiting', 'pending', 'running', 'done', 'dead'; None once acked or if never fired)."""

    fires_on: str
    job_id: int
    job_state: str | None


@dataclass(frozen=True, slots=True)
class BatchMember:
    """A member of a batch (S31): its job, its kind and where it is now ('pending',
    'running', 'done', 'dead'; None: acked and not kept), and how its end was recorded
    ('done', 'failed'; None: not ended)."""

    job_id: int
    kind: str | None
    state: str | None
    ended: str | None


@dataclass(frozen=True, slots=True)
class BatchRecord:
    """A batch as stored (S31). `done` and `failed` count the members that ended so far
    (recorded for good at the batch's end); `fired` the callbacks its end released."""

    id: int
    state: str
    members: int
    done: int
    failed: int
    created_at: datetime
    ended_at: datetime | None
    callbacks: tuple[BatchCallbackState, ...]

    @property
    def ended(self) -> bool:
        return self.state in ("succeeded", "failed")

    @property
    def fired(self) -> tuple[BatchCallbackState, ...]:
        """The callbacks released by the batch's end: on_complete, and on_success or
        on_failure as the members ended. Empty before the end."""
        if not self.ended:
            return ()
        matching = {"complete", "success" if self.state == "succeeded" else "failure"}
        return tuple(c for c in self.callbacks if c.fires_on in matching)


@dataclass(frozen=True, slots=True)
class RunningJob:
    """A job running now, as `jobsctl running` shows it."""

    id: int
    queue: str
    kind: str
    worker_id: str | None
    attempt: int
    max_attempts: int
    #: Seconds since its handler started (its claim, before that), on the database clock.
    running_s: float
    #: The handler's latest report: {"fraction", "message", "data", "at"} (None: none).
    progress: dict[str, Any] | None
    #: The database's clock when this was read (progress reports are dated by it).
    read_at: datetime


@dataclass(frozen=True, slots=True)
class DeadLetter:
    """A dead letter as a listing shows it (`jobsctl dead`)."""

    id: int
    queue: str
    kind: str
    key: str | None
    reason: str
    #: Its category as filed (a DeadCategory value: the stored one, or "dependency" read
    #: from its reason); None when none was recorded.
    category: str | None
    attempts: int
    max_attempts: int
    last_error: str | None
    created_at: datetime
    died_at: datetime
    #: Seconds since it died, on the database clock.
    died_s_ago: float


class Heartbeats(NamedTuple):
    """What a background heartbeat found: the claims extended, and the claims whose job
    is gone for good, each with why (their handlers are told, S32)."""

    extended: list[Any]
    gone: list[tuple[Any, str]]


@dataclass(frozen=True, slots=True)
class Count:
    """A number of rows: exact, or the planner's estimate past COUNT_CAP. It reads as its
    number in a template or an f-string ("1,000", "≈ 12,000" for an estimate); int() takes
    its value, and it is true when that is not 0."""

    value: int
    estimated: bool = False

    def __str__(self) -> str:
        return f"≈ {self.value:,}" if self.estimated else f"{self.value:,}"

    def __int__(self) -> int:
        return self.value

    def __index__(self) -> int:
        return self.value

    def __bool__(self) -> bool:
        return self.value > 0


@dataclass(frozen=True, slots=True)
class QueueOverview:
    """One queue at a glance."""

    queue: str
    runnable: Count
    scheduled: Count
    running: Count
    dead: Count
    oldest_runnable_s: float | None
    #: Pending jobs tried before (an attempt failed or lapsed), and done ones (retained).
    retrying: Count = Count(0)
    done: Count = Count(0)


@dataclass(frozen=True, slots=True)
class QueueStatus(QueueOverview):
    """One queue at a glance: its jobs, and its controls."""

    paused: bool = False
    max_running: int | None = None
    #: The queue's rate of claims ("100/m"; None: none), S35.
    rate: str | None = None


@dataclass(frozen=True, slots=True)
class ThroughputPoint:
    """Jobs finished in one bucket of time (a minute, a quarter of an hour), by ending:
    done, retried (an attempt failed, the job will run again), dead-lettered, cancelled."""

    at: datetime
    succeeded: int
    retried: int
    dead: int
    cancelled: int


class DueSchedule(NamedTuple):
    """A schedule whose next tick has come, as read with the database's now()."""

    name: str
    kind: str
    cron: str
    timezone: str
    payload: dict[str, Any]
    options: dict[str, Any]
    on_missed: str
    backfill_limit: int
    next_run_at: datetime
    now: datetime


@dataclass(frozen=True, slots=True)
class SyncResult:
    """What a sync of the declared schedules changed."""

    added: int
    changed: int
    retired: int


@dataclass(frozen=True, slots=True)
class WorkerStatus:
    """A worker of the registry as last reported, and whether it is live (seen within 3
    heartbeats on the database clock, not stopped)."""

    id: str
    host: str
    pid: int
    queues: list[str]
    concurrency: int
    version: str
    heartbeat_s: float
    started_at: datetime
    last_seen_at: datetime
    stopped_at: datetime | None
    running: int
    succeeded: int
    failed: int
    #: Its claims read from their queues' floors: the xmin horizon is held (S42).
    claims_from_floors: bool
    live: bool
    seen_s_ago: float
    #: What an operator asked of it (None, "quiet", "stop"), by whom, when.
    asked: str | None = None
    asked_by: str | None = None
    asked_at: datetime | None = None
    #: The queues an operator paused on it alone: each with who paused it ("by") and
    #: when ("at", ISO 8601).
    paused_queues: dict[str, dict[str, str]] = field(default_factory=dict)

    @property
    def claiming(self) -> list[str]:
        """The queues it claims from: its queues but those paused on it alone."""
        return [queue for queue in self.queues if queue not in self.paused_queues]


@dataclass(frozen=True, slots=True)
class WorkerAsked:
    """What a heartbeat read of what operators asked of its worker: to go quiet or stop
    (`asked`: None, "quiet", "stop"), and the queues paused on it alone."""

    asked: str | None = None
    paused_queues: frozenset[str] = frozenset()


@dataclass(frozen=True, slots=True)
class Latency:
    """Runs over a span (of a kind, of a queue, or in one bucket of time), and their
    queue wait and run time at p50 and p95, each the upper bound of a histogram bucket in
    seconds (None: no run)."""

    runs: int
    wait_p50_s: float | None
    wait_p95_s: float | None
    run_p50_s: float | None
    run_p95_s: float | None


@dataclass(frozen=True, slots=True)
class LatencyReport:
    """Queue wait and run time over a span ("hour", "day", "week"), from the workers'
    histograms: over time (one Latency per bucket of `bucket_min` minutes from `since`,
    oldest first), per queue and per kind. `queue` and `kind` say what it was narrowed to
    (None: all)."""

    span: str
    since: datetime
    bucket_min: int
    series: list[tuple[datetime, Latency]]
    queues: dict[str, Latency]
    kinds: dict[str, Latency]
    queue: str | None = None
    kind: str | None = None


@dataclass(frozen=True, slots=True)
class ClaimCost:
    """What one claim of a few jobs costs the server now, as a worker runs it
    (JobManager.claim_cost): its execution time, the shared buffers it read, and its plan."""

    ms: float
    buffers: int
    plan: str
