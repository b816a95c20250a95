"""The queue's whole vocabulary: the only code that runs queue SQL (see `sql.py`).

`Job.objects` enqueues, claims and completes; `DeadJob.objects` requeues. The worker,
the admin, the commands and the django.tasks backend call these methods and hold no SQL.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, fields, replace
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any, NamedTuple

from django.db import connections, models, transaction

from django_pgjobs import options, registry, sql
from django_pgjobs.conf import pgjobs_settings
from django_pgjobs.exceptions import InvalidJobOption, InvalidSchedule
from django_pgjobs.handles import Failure, JobHandle
from django_pgjobs.options import UNSET

if TYPE_CHECKING:
    from django_pgjobs.models import DeadJob, Job  # noqa: F401

#: The enqueue options a job given to enqueue_many may carry.
ENQUEUE_MANY_KEYS = frozenset(
    {
        "kind",
        "payload",
        "queue",
        "key",
        "priority",
        "run_after",
        "delay",
        "max_attempts",
        "lease",
        "expires",
        "result_retention",
    }
)


class EnqueueResult(NamedTuple):
    """What an enqueue did: the job's id, and whether a row was inserted (else merged, S3)."""

    id: int
    inserted: bool

    @property
    def merged(self) -> bool:
        return not self.inserted


class RequeueResult(NamedTuple):
    """What a requeue did: letters back in the live table, and letters merged into the
    live job of their key."""

    requeued: int
    merged: int


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

    @property
    def is_dead(self) -> bool:
        return self.state == "dead"


_RECORD_FIELDS = tuple(f.name for f in fields(JobRecord))


def _record(values: dict[str, Any]) -> JobRecord:
    known: dict[str, Any] = {name: values[name] for name in _RECORD_FIELDS if name in values}
    return JobRecord(**known)


def _decode(value: Any) -> Any:
    """Decode a jsonb value once; Django's psycopg setup hands jsonb over as text."""
    return json.loads(value) if isinstance(value, str) else value


def _alias(using: str | None) -> str:
    return using or pgjobs_settings.DATABASE


class JobManager(models.Manager["Job"]):
    """Enqueue, claim and complete jobs."""

    # Enqueue -----------------------------------------------------------------------

    def enqueue(
        self,
        kind: str,
        payload: Mapping[str, Any] | None = None,
        *,
        queue: str = UNSET,
        key: str | None = None,
        on_conflict: str = "replace",
        priority: int = UNSET,
        run_after: datetime | None = None,
        delay: float | timedelta | None = None,
        max_attempts: int = UNSET,
        lease: float | timedelta = UNSET,
        expires: float | timedelta | None = UNSET,
        result_retention: float | timedelta | None = UNSET,
        using: str | None = None,
    ) -> EnqueueResult:
        """Write one job in the caller's transaction (S1), merging by key (S3).

        Options left out come from the kind's @job decorator, then the queue's settings,
        then the app defaults (S2). Inside `transaction.atomic()` the job exists if and
        only if that transaction commits; workers are woken at commit (S23).

        Returns:
            EnqueueResult(id, inserted): `inserted` is False when merged into a live job.

        Raises:
            InvalidJobOption: a subclass naming the bad argument; nothing is written.
        """
        on_conflict = options.validate_conflict_mode(on_conflict)
        resolved = options.resolve_job(
            kind,
            payload,
            queue=queue,
            key=key,
            priority=priority,
            run_after=run_after,
            delay=delay,
            max_attempts=max_attempts,
            lease=lease,
            expires=expires,
            result_retention=result_retention,
            defaults=registry.decorator_defaults(kind) if isinstance(kind, str) else None,
        )
        params = resolved.as_params()
        params.update(on_conflict=on_conflict, **_wake_params())
        (row,) = _fetchall(sql.ENQUEUE_JOB, params, using)
        return EnqueueResult(id=row[0], inserted=row[1])

    def enqueue_many(
        self,
        jobs: Iterable[Mapping[str, Any]],
        *,
        on_conflict: str = "replace",
        using: str | None = None,
    ) -> list[EnqueueResult]:
        """Write many jobs in one statement (S5), with the same rules as `enqueue`.

        Each job is a mapping of `enqueue`'s arguments (`kind` required). Jobs sharing a
        (kind, key) merge in order, as if enqueued one after another. All are validated
        before anything is written.

        Returns:
            One EnqueueResult per job, in the order given.
        """
        on_conflict = options.validate_conflict_mode(on_conflict)
        resolved: list[options.ResolvedJob] = []
        for index, job in enumerate(jobs):
            try:
                resolved.append(self._resolve_mapping(job))
            except InvalidJobOption as error:
                raise type(error)(f"jobs[{index}]: {error}") from None
        if not resolved:
            return []
        rows, positions = _fold_duplicate_keys(resolved, on_conflict)
        params = {
            "queues": [job.queue for job in rows],
            "kinds": [job.kind for job in rows],
            "keys": [job.key for job in rows],
            "priorities": [job.priority for job in rows],
            "delays_s": [job.delay_s for job in rows],
            "run_afters": [job.run_after for job in rows],
            "max_attempts": [job.max_attempts for job in rows],
            "leases_s": [job.lease_s for job in rows],
            "expires_s": [job.expires_s for job in rows],
            "payloads": [job.payload_json for job in rows],
            "result_ttls_s": [job.result_ttl_s for job in rows],
            "on_conflict": on_conflict,
            **_wake_params(),
        }
        written = [
            EnqueueResult(id=row[0], inserted=row[1])
            for row in _fetchall(sql.ENQUEUE_JOBS, params, using)
        ]
        return [
            written[row] if first else EnqueueResult(id=written[row].id, inserted=False)
            for row, first in positions
        ]

    def _resolve_mapping(self, job: Mapping[str, Any]) -> options.ResolvedJob:
        if not isinstance(job, Mapping):
            raise InvalidJobOption(f"Each job must be a mapping of enqueue options, not {job!r}.")
        unknown = sorted(set(job) - ENQUEUE_MANY_KEYS)
        if unknown:
            raise InvalidJobOption(
                f"Unknown option(s) {unknown}; a job may give {sorted(ENQUEUE_MANY_KEYS)}."
            )
        if "kind" not in job:
            raise InvalidJobOption("A job needs a 'kind'.")
        values = {name: job[name] for name in job if name not in ("kind", "payload")}
        kind = job["kind"]
        return options.resolve_job(
            kind,
            job.get("payload"),
            defaults=registry.decorator_defaults(kind) if isinstance(kind, str) else None,
            **values,
        )

    # Claim -------------------------------------------------------------------------

    def claim_batch(
        self, queues: str | Sequence[str], n: int, worker_id: str, *, using: str | None = None
    ) -> list[JobHandle]:
        """Claim up to `n` jobs of `queues` in one statement (S6-S9).

        Lapsed claims (crash recovery) come first, then pending jobs in priority DESC,
        run_after, id order. Each claim consumes an attempt and gets a fresh token.
        Concurrent claimers get disjoint jobs. `n <= 0` returns [] without a query.
        """
        n = options.validate_claim_size(n)
        worker_id = options.validate_worker_id(worker_id)
        names = options.validate_queue_names(queues)
        if n <= 0:
            return []
        alias = _alias(using)
        params = {
            "queues": names,
            "limit": n,
            "worker_id": worker_id,
            "errors_kept": pgjobs_settings.ERRORS_KEPT,
        }
        handles = [
            JobHandle(
                id=row[0],
                queue=row[1],
                kind=row[2],
                key=row[3],
                priority=row[4],
                run_after=row[5],
                attempt=row[6],
                max_attempts=row[7],
                lease_s=row[8],
                token=row[9],
                claimed_at=row[10],
                claimed_until=row[11],
                worker_id=row[12],
                expires_at=row[13],
                created_at=row[14],
                payload=_decode(row[15]),
                using=alias,
            )
            for row in _fetchall(sql.CLAIM_JOBS, params, alias)
        ]
        handles.sort(key=lambda handle: (-handle.priority, handle.run_after, handle.id))
        return handles

    def claim_one(
        self, queues: str | Sequence[str], worker_id: str, *, using: str | None = None
    ) -> JobHandle | None:
        """Claim the next job of `queues`, or return None when none is runnable."""
        handles = self.claim_batch(queues, 1, worker_id, using=using)
        return handles[0] if handles else None

    def next_scheduled_in(
        self, queues: str | Sequence[str], *, using: str | None = None
    ) -> float | None:
        """Return seconds until the earliest scheduled job of `queues` may run, or None."""
        names = options.validate_queue_names(queues)
        ((seconds,),) = _fetchall(sql.NEXT_SCHEDULED_IN, {"queues": names}, using)
        return None if seconds is None else max(float(seconds), 0.0)

    # Completion (the handle's writes, one statement for any number of claims) ------------

    def ack_batch(self, handles: Sequence[JobHandle], results: Sequence[Any] | None = None) -> int:
        """Ack every handle whose claim is current (S12, S17); return how many were acked."""
        if not handles:
            return 0
        if results is None:
            results = [None] * len(handles)
        if len(results) != len(handles):
            raise ValueError("ack_batch needs one result per handle.")
        encoded = [options.encode_result(result) for result in results]
        params = {
            "ids": [handle.id for handle in handles],
            "tokens": [handle.token for handle in handles],
            "results": encoded,
            **_wake_params(),
        }
        ((acked, _woken),) = _fetchall(sql.ACK_JOBS, params, _batch_alias(handles))
        _mark_finished(handles)
        return int(acked)

    def retry_batch(
        self,
        retries: Sequence[tuple[JobHandle, Failure, float | timedelta | None]],
    ) -> int:
        """Record failed attempts (S13): each (handle, failure, delay or None for backoff).

        Returns how many claims were current (retried, promoted or dead-lettered).
        """
        if not retries:
            return 0
        handles = [handle for handle, _, _ in retries]
        delays = [_retry_delay(handle, delay) for handle, _, delay in retries]
        params = {
            "ids": [handle.id for handle in handles],
            "tokens": [handle.token for handle in handles],
            "errors": [failure.error for _, failure, _ in retries],
            "tracebacks": [failure.traceback for _, failure, _ in retries],
            "exceptions": [failure.exception for _, failure, _ in retries],
            "delays_s": delays,
            "errors_kept": pgjobs_settings.ERRORS_KEPT,
            **_wake_params(),
        }
        ((retried, promoted, dead, _woken),) = _fetchall(
            sql.RETRY_JOBS, params, _batch_alias(handles)
        )
        _mark_finished(handles)
        return int(retried) + int(promoted) + int(dead)

    def fail_batch(self, failures: Sequence[tuple[JobHandle, Failure]]) -> int:
        """Dead-letter claimed jobs at once (S15): each (handle, failure); the failure's
        error is the reason, verbatim. Returns how many claims were current."""
        if not failures:
            return 0
        handles = [handle for handle, _ in failures]
        params = {
            "ids": [handle.id for handle in handles],
            "tokens": [handle.token for handle in handles],
            "errors": [failure.error for _, failure in failures],
            "tracebacks": [failure.traceback for _, failure in failures],
            "exceptions": [failure.exception for _, failure in failures],
            "errors_kept": pgjobs_settings.ERRORS_KEPT,
            **_wake_params(),
        }
        ((dead, promoted, _woken),) = _fetchall(sql.FAIL_JOBS, params, _batch_alias(handles))
        _mark_finished(handles)
        return int(dead) + int(promoted)

    def heartbeat_batch(
        self, handles: Sequence[JobHandle], extend: float | timedelta | None = None
    ) -> int:
        """Extend current claims to now() + `extend` (default: each job's lease) (S11).

        An absolute reset, not additive; lapsed or superseded claims are refused. Returns
        how many were extended; each extended handle's `claimed_until` is updated.
        """
        return len(self._heartbeat(sql.HEARTBEAT_JOBS, handles, extend))

    def heartbeat_unlocked(
        self, handles: Sequence[JobHandle], extend: float | timedelta | None = None
    ) -> list[JobHandle]:
        """Heartbeat as `heartbeat_batch` does, skipping rows a transaction holds locked
        (a fence or a transaction-mode job: the lock already keeps claimers away).
        Returns the handles extended."""
        extended = self._heartbeat(sql.HEARTBEAT_UNLOCKED_JOBS, handles, extend)
        return [handle for handle in handles if handle.id in extended]

    def _heartbeat(
        self, statement: str, handles: Sequence[JobHandle], extend: float | timedelta | None
    ) -> set[int]:
        """Run a heartbeat statement; update the handles extended and return their ids."""
        if not handles:
            return set()
        extension = None if extend is None else options.validate_extend(extend)
        params = {
            "ids": [handle.id for handle in handles],
            "tokens": [handle.token for handle in handles],
            "extends_s": [
                float(handle.lease_s) if extension is None else extension for handle in handles
            ],
        }
        by_id = {handle.id: handle for handle in handles}
        rows = _fetchall(statement, params, _batch_alias(handles))
        for job_id, claimed_until in rows:
            by_id[job_id].claimed_until = claimed_until
        return {job_id for job_id, _ in rows}

    def release_batch(self, handles: Sequence[JobHandle]) -> int:
        """Hand claims back (S25): pending again, the attempt refunded. Returns how many."""
        if not handles:
            return 0
        params = {
            "ids": [handle.id for handle in handles],
            "tokens": [handle.token for handle in handles],
            **_wake_params(),
        }
        ((released, _woken),) = _fetchall(sql.RELEASE_JOBS, params, _batch_alias(handles))
        _mark_finished(handles)
        return int(released)

    def lock_claim(self, handle: JobHandle) -> bool:
        """Lock the job row for the current transaction if `handle`'s claim is current."""
        params = {"id": handle.id, "token": handle.token}
        return bool(_fetchall(sql.LOCK_CURRENT_CLAIM, params, handle.using))

    # Operators -----------------------------------------------------------------------

    def cancel(self, job_id: int, *, using: str | None = None) -> bool:
        """Delete a pending or running job (S18). Returns False when there is no such job.

        A running handler's later writes are refused, since its claim is gone.
        """
        return bool(_fetchall(sql.CANCEL_JOB, {"id": job_id}, using))

    def get_job(self, job_id: int, *, using: str | None = None) -> JobRecord | None:
        """Read a job from the live or the dead table (S19), or return None."""
        from django_pgjobs.models import DeadJob

        alias = _alias(using)
        live = self.using(alias).filter(pk=job_id).values().first()
        if live is not None:
            return _record(dict(live))
        dead = DeadJob.objects.using(alias).filter(pk=job_id).values().first()
        if dead is not None:
            return _record({**dead, "state": "dead"})
        return None

    # Maintenance (used by the sweeper) -------------------------------------------------

    def sweep_expired(self, limit: int, *, using: str | None = None) -> tuple[int, int]:
        """Dead-letter up to `limit` live jobs past `expires_at` (S24).

        Returns (dead-lettered, triggers promoted).
        """
        params = {
            "limit": limit,
            "errors_kept": pgjobs_settings.ERRORS_KEPT,
            **_wake_params(),
        }
        ((dead, promoted),) = _fetchall(sql.SWEEP_EXPIRED, params, using)
        return int(dead), int(promoted)

    def sweep_lapsed_exhausted(self, limit: int, *, using: str | None = None) -> tuple[int, int]:
        """Dead-letter up to `limit` lapsed running jobs with no attempts left (S9, S24).

        Returns (dead-lettered, triggers promoted).
        """
        params = {
            "limit": limit,
            "errors_kept": pgjobs_settings.ERRORS_KEPT,
            **_wake_params(),
        }
        ((dead, promoted),) = _fetchall(sql.SWEEP_LAPSED_EXHAUSTED, params, using)
        return int(dead), int(promoted)

    def prune_done(self, limit: int, *, using: str | None = None) -> int:
        """Delete up to `limit` done jobs whose result retention has ended (S24)."""
        return _rowcount(sql.PRUNE_DONE, {"limit": limit}, using)

    def try_sweep_lock(self, *, using: str | None = None) -> bool:
        """Take the sweeper's turn for the current transaction (False: another has it)."""
        ((taken,),) = _fetchall(sql.SWEEP_LOCK, {"lock_id": SWEEP_LOCK_ID}, using)
        return bool(taken)


class DeadJobManager(models.Manager["DeadJob"]):
    """Dead letters: requeue and prune."""

    def requeue(self, ids: Iterable[int], *, using: str | None = None) -> RequeueResult:
        """Move dead letters back to pending, attempts reset and expiry cleared.

        A letter whose key already has a live job is merged into that job (S3, replace)
        instead. Ids that are not dead letters are skipped. All in one transaction.
        """
        alias = _alias(using)
        requeued = merged = 0
        params = _wake_params()
        with transaction.atomic(using=alias), connections[alias].cursor() as cursor:
            for job_id in dict.fromkeys(ids):
                cursor.execute(sql.REQUEUE_DEAD_JOB, {**params, "id": int(job_id)})
                for _id, inserted, _woken in cursor.fetchall():
                    if inserted:
                        requeued += 1
                    else:
                        merged += 1
        return RequeueResult(requeued=requeued, merged=merged)

    def prune_in_queues(
        self, queues: Sequence[str], retention_s: float, limit: int, *, using: str | None = None
    ) -> int:
        """Delete up to `limit` dead letters of `queues` that died over `retention_s` ago."""
        params = {"queues": list(queues), "retention_s": retention_s, "limit": limit}
        return _rowcount(sql.PRUNE_DEAD_IN_QUEUES, params, using)

    def prune_outside_queues(
        self, queues: Sequence[str], retention_s: float, limit: int, *, using: str | None = None
    ) -> int:
        """Delete up to `limit` dead letters of queues other than `queues` that died over
        `retention_s` ago: the default retention, for queues without their own."""
        params = {"queues": list(queues), "retention_s": retention_s, "limit": limit}
        return _rowcount(sql.PRUNE_DEAD_OUTSIDE_QUEUES, params, using)


def _wake_params() -> dict[str, Any]:
    return {"channel": pgjobs_settings.CHANNEL, "notify": pgjobs_settings.NOTIFY}


def _fetchall(statement: str, params: Mapping[str, Any], using: str | None) -> list[Any]:
    with connections[_alias(using)].cursor() as cursor:
        cursor.execute(statement, params)
        return list(cursor.fetchall())


def _rowcount(statement: str, params: Mapping[str, Any], using: str | None) -> int:
    with connections[_alias(using)].cursor() as cursor:
        cursor.execute(statement, params)
        return int(cursor.rowcount)


#: Advisory lock key of the sweeper: "pgjobs" as a number, so other locks rarely clash.
SWEEP_LOCK_ID = int.from_bytes(b"pgjobsSW", "big") & 0x7FFF_FFFF_FFFF_FFFF


def _retry_delay(handle: JobHandle, delay: float | timedelta | None) -> float:
    if delay is None:
        return float(registry.backoff_for(handle.kind, handle.queue).delay(handle.attempt))
    seconds = delay.total_seconds() if isinstance(delay, timedelta) else float(delay)
    if not math.isfinite(seconds) or seconds < 0:
        raise InvalidSchedule(f"A retry delay must be a non-negative duration, not {delay!r}.")
    return seconds


def _batch_alias(handles: Sequence[JobHandle]) -> str:
    aliases = {handle.using for handle in handles}
    if len(aliases) != 1:
        raise ValueError(f"A batch must hold claims of one database, not {sorted(aliases)}.")
    return aliases.pop()


def _mark_finished(handles: Sequence[JobHandle]) -> None:
    """Mark the handles finished once the current transaction commits (now, if none)."""

    def mark() -> None:
        for handle in handles:
            handle.finished = True

    transaction.on_commit(mark, using=_batch_alias(handles))


def _fold_duplicate_keys(
    jobs: list[options.ResolvedJob], on_conflict: str
) -> tuple[list[options.ResolvedJob], list[tuple[int, bool]]]:
    """Merge jobs sharing a (kind, key) into the first of them, in order (S3 within a batch).

    Returns the rows to write and, per input job, (row index, whether it is that row's
    first job). ON CONFLICT cannot change one row twice in a statement, so a batch must
    never carry one key twice.
    """
    rows: list[options.ResolvedJob] = []
    positions: list[tuple[int, bool]] = []
    row_of_key: dict[tuple[str, str], int] = {}
    for job in jobs:
        if job.key is None:
            positions.append((len(rows), True))
            rows.append(job)
            continue
        existing = row_of_key.get((job.kind, job.key))
        if existing is None:
            row_of_key[(job.kind, job.key)] = len(rows)
            positions.append((len(rows), True))
            rows.append(job)
            continue
        positions.append((existing, False))
        rows[existing] = _fold(rows[existing], job, on_conflict)
    return rows, positions


def _fold(
    first: options.ResolvedJob, later: options.ResolvedJob, on_conflict: str
) -> options.ResolvedJob:
    if on_conflict == "ignore":
        return first
    if on_conflict == "keep_schedule":
        return replace(first, payload_json=later.payload_json, expires_s=later.expires_s)
    return replace(
        first,
        payload_json=later.payload_json,
        delay_s=later.delay_s,
        run_after=later.run_after,
        expires_s=later.expires_s,
    )
