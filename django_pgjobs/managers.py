"""The queue's whole vocabulary: the only code that runs queue SQL (see `sql.py`).

`Job.objects` enqueues, claims and completes; `DeadJob.objects` requeues. The worker,
the admin, the commands and the django.tasks backend call these methods and hold no SQL.
"""

from __future__ import annotations

import itertools
import json
import time
from collections.abc import Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, fields
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any, NamedTuple

import psycopg
from django.db import connections, models, transaction
from django.db.models.functions import Now

from django_pgjobs import options, registry, signals, sql
from django_pgjobs.conf import pgjobs_settings
from django_pgjobs.exceptions import InvalidJobOption
from django_pgjobs.handles import Failure, JobHandle
from django_pgjobs.options import UNSET

if TYPE_CHECKING:
    from django_pgjobs.models import (  # noqa: F401
        ChaosExecution,
        DeadJob,
        Job,
        JobStats,
        QueueControl,
        Schedule,
    )


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

    @property
    def is_dead(self) -> bool:
        return self.state == "dead"


_RECORD_FIELDS = tuple(f.name for f in fields(JobRecord))

#: Counts for the admin stop at this many rows; past it they are the planner's estimate.
COUNT_CAP = 1_000


@dataclass(frozen=True, slots=True)
class Count:
    """A number of rows: exact, or the planner's estimate past COUNT_CAP."""

    value: int
    estimated: bool = False

    def __str__(self) -> str:
        return f"≈ {self.value:,}" if self.estimated else f"{self.value:,}"


@dataclass(frozen=True, slots=True)
class QueueOverview:
    """One queue at a glance."""

    queue: str
    runnable: Count
    scheduled: Count
    running: Count
    dead: Count
    oldest_runnable_s: float | None

    @property
    def oldest_runnable(self) -> str:
        if self.oldest_runnable_s is None:
            return "-"
        seconds = self.oldest_runnable_s
        if seconds < 60:
            return f"{seconds:.0f} s"
        if seconds < 3600:
            return f"{seconds / 60:.0f} min"
        return f"{seconds / 3600:.1f} h"


@dataclass(frozen=True, slots=True)
class ThroughputPoint:
    """Jobs finished and failed attempts in one minute."""

    minute: datetime
    succeeded: int
    failed: int


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
        params.update(_wake_params())
        if resolved.key is None:
            (row,) = _fetchall(sql.INSERT_JOB, params, using)
        else:
            params["on_conflict"] = on_conflict
            (row,) = _fetchall(sql.ENQUEUE_JOB, params, using)
        result = EnqueueResult(id=row[0], inserted=row[1])
        result.created_at = row[2]
        _announce_enqueued([resolved], [result])
        return result

    def enqueue_many(
        self,
        jobs: Iterable[Mapping[str, Any]],
        *,
        on_conflict: str = "replace",
        using: str | None = None,
    ) -> list[EnqueueResult]:
        """Write many jobs in one statement (S5), with the same rules as `enqueue`.

        Each job is a mapping of `enqueue`'s arguments (`kind` required). Jobs sharing a
        (kind, key) merge in order, as if enqueued one after another. Nothing is written
        when any job is invalid.

        A batch of more than ENQUEUE_CHUNK jobs is one statement per ENQUEUE_CHUNK jobs,
        sent in one pipeline inside one transaction (a savepoint in the caller's): the
        server writes each while the next is validated, which one statement for all
        cannot do.

        Returns:
            One EnqueueResult per job, in the order given.
        """
        batch = _EnqueueBatch(options.validate_conflict_mode(on_conflict))
        documents = batch.documents(jobs)
        first = next(documents, None)  # the first document's jobs, validated
        if first is None:
            return []
        document, last = first
        if last:  # every job is in it
            chunks = _write_documents([document], using)
        else:
            # A document is written while the next is validated: a job found invalid
            # later rolls back the documents sent before it.
            rest = (document for document, _ in documents)
            with transaction.atomic(using=_alias(using)):
                chunks = _write_documents(itertools.chain([document], rest), using)
        results = batch.results(chunks)
        _announce_enqueued(batch.jobs, results)
        return results

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
        limited = sorted(_limited_queues(alias).intersection(names))
        handles, lapsed_waiting = self._claim(names, limited, n, worker_id, alias)
        if lapsed_waiting:
            # Rare: a claim lapsed in these queues (its worker died). Put it back in line
            # (or bury it), then fill what this claim has left.
            self.rescue_lapsed(names, pgjobs_settings.SWEEP_BATCH, using=alias)
            if len(handles) < n:
                handles += self._claim(names, limited, n - len(handles), worker_id, alias)[0]
        handles.sort(key=lambda handle: (-handle.priority, handle.run_after, handle.id))
        return handles

    def _claim(
        self, queues: list[str], limited: list[str], n: int, worker_id: str, alias: str
    ) -> tuple[list[JobHandle], bool]:
        """Claim from the limited queues first (a statement of their own), then the rest.

        The fast statement skips paused and limited queues by itself, whatever `limited`
        (a cache) says, so a stale cache can delay a limited queue's claims a moment but
        never exceed its limit.
        """
        handles: list[JobHandle] = []
        lapsed_waiting = False
        locked: set[str] = set()
        if limited:
            with transaction.atomic(using=alias):
                rows = _fetchall(sql.LOCK_LIMITED_QUEUES, {"queues": limited}, alias)
                locked = {row[0] for row in rows}
                if locked:
                    params = {
                        "queues": sorted(locked),
                        "limit": n,
                        "worker_id": worker_id,
                        "synchronous_commit": None,
                    }
                    rows = _fetchall(sql.CLAIM_LIMITED_JOBS, params, alias)
                    handles += _claimed_handles(rows, alias)
                    lapsed_waiting = bool(rows and rows[0][0])
            if locked != set(limited):  # a limit was lifted since the cache was read
                forget_limits()
        rest = [queue for queue in queues if queue not in locked]
        if rest and len(handles) < n:
            params = {"queues": rest, "worker_id": worker_id, **_bookkeeping(alias)}
            rows = _fetchall(sql.claim_jobs(n - len(handles)), params, alias)
            handles += _claimed_handles(rows, alias)
            lapsed_waiting = lapsed_waiting or bool(rows and rows[0][0])
        return handles, lapsed_waiting

    def rescue_lapsed(
        self, queues: Sequence[str] | None, limit: int, *, using: str | None = None
    ) -> RescueResult:
        """Take back up to `limit` lapsed claims of `queues` (None: every queue) (S9).

        Each becomes pending again (its attempt counted, the next claim consumes another),
        dead as "max attempts exceeded" when no attempt is left, or replaced by its key's
        pending trigger (S3).
        """
        params = {
            "queues": None if queues is None else list(queues),
            "limit": limit,
            "errors_kept": pgjobs_settings.ERRORS_KEPT,
            **_wake_params(),
        }
        ((requeued, dead, promoted, _woken),) = _fetchall(sql.RESCUE_LAPSED_JOBS, params, using)
        return RescueResult(requeued=int(requeued), dead=int(dead), promoted=int(promoted))

    def claim_one(
        self, queues: str | Sequence[str], worker_id: str, *, using: str | None = None
    ) -> JobHandle | None:
        """Claim the next job of `queues`, or return None when none is runnable."""
        handles = self.claim_batch(queues, 1, worker_id, using=using)
        return handles[0] if handles else None

    def next_due_in(self, queues: str | Sequence[str], *, using: str | None = None) -> float | None:
        """Return seconds until a job of `queues` next becomes claimable: the next scheduled
        job, or the next running job whose lease lapses. None when there is neither."""
        names = options.validate_queue_names(queues)
        ((seconds,),) = _fetchall(sql.NEXT_DUE_IN, {"queues": names}, using)
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
            **_claim_keys(handles),
            "results": encoded if any(encoded) else _nulls(len(encoded)),
            **_wake_params(),
            **_bookkeeping(_batch_alias(handles)),
        }
        ((acked, _woken, _),) = _fetchall(sql.ACK_JOBS, params, _batch_alias(handles))
        _mark_finished(handles, [(signals.SUCCEEDED, None)] * len(handles))
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
            **_claim_keys(handles),
            "errors": [failure.error for _, failure, _ in retries],
            "tracebacks": [failure.traceback for _, failure, _ in retries],
            "exceptions": [failure.exception for _, failure, _ in retries],
            "delays_s": delays,
            "errors_kept": pgjobs_settings.ERRORS_KEPT,
            **_wake_params(),
            **_bookkeeping(_batch_alias(handles)),
        }
        ((retried, promoted, dead, _woken, _),) = _fetchall(
            sql.RETRY_JOBS, params, _batch_alias(handles)
        )
        _mark_finished(
            handles,
            [
                (signals.DEAD, signals.MAX_ATTEMPTS_EXCEEDED)
                if handle.attempt >= handle.max_attempts
                else (signals.RETRIED, None)
                for handle in handles
            ],
        )
        return int(retried) + int(promoted) + int(dead)

    def fail_batch(self, failures: Sequence[tuple[JobHandle, Failure]]) -> int:
        """Dead-letter claimed jobs at once (S15): each (handle, failure); the failure's
        error is the reason, verbatim. Returns how many claims were current."""
        if not failures:
            return 0
        handles = [handle for handle, _ in failures]
        params = {
            **_claim_keys(handles),
            "errors": [failure.error for _, failure in failures],
            "tracebacks": [failure.traceback for _, failure in failures],
            "exceptions": [failure.exception for _, failure in failures],
            "errors_kept": pgjobs_settings.ERRORS_KEPT,
            **_wake_params(),
            **_bookkeeping(_batch_alias(handles)),
        }
        ((dead, promoted, _woken, _),) = _fetchall(sql.FAIL_JOBS, params, _batch_alias(handles))
        _mark_finished(handles, [(signals.DEAD, failure.error) for _, failure in failures])
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
            **_claim_keys(handles),
            "extends_s": [
                float(handle.lease_s) if extension is None else extension for handle in handles
            ],
            **_bookkeeping(_batch_alias(handles)),
        }
        by_id = {handle.id: handle for handle in handles}
        rows = _fetchall(statement, params, _batch_alias(handles))
        for job_id, claimed_until, _ in rows:
            by_id[job_id].claimed_until = claimed_until
        return {row[0] for row in rows}

    def release_batch(self, handles: Sequence[JobHandle]) -> int:
        """Hand claims back (S25): pending again, the attempt refunded. Returns how many."""
        if not handles:
            return 0
        params = {
            **_claim_keys(handles),
            **_wake_params(),
            **_bookkeeping(_batch_alias(handles)),
        }
        ((released, _woken, _),) = _fetchall(sql.RELEASE_JOBS, params, _batch_alias(handles))
        _mark_finished(handles)
        return int(released)

    def tune_worker_connection(self, *, using: str | None = None) -> None:
        """Make the current thread's connection a worker's bookkeeping connection.

        With PGJOBS["PREPARE"], its statements are prepared on first use and planned once
        (TUNE_WORKER_SESSION), which removes most of the cost of a small claim or ack.
        Session settings and prepared statements need a connection of one's own: switch
        PREPARE off behind a transaction-mode pooler. Cheap to call on every loop: a
        connection is tuned once, and again after a reconnect.
        """
        if not pgjobs_settings.PREPARE:
            return
        connection = connections[_alias(using)]
        connection.ensure_connection()
        raw = connection.connection
        if getattr(raw, "_pgjobs_tuned", False):
            return
        _fetchall(sql.TUNE_WORKER_SESSION, {}, using)
        raw.prepare_threshold = 0
        raw.prepared_max = max(raw.prepared_max or 0, 512)
        raw._pgjobs_tuned = True

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

    def run_now(self, job_ids: Sequence[int], *, using: str | None = None) -> int:
        """Make pending jobs runnable now; return how many were pending."""
        params = {"ids": _id_array(job_ids), **_wake_params()}
        ((moved, _woken),) = _fetchall(sql.RUN_JOBS_NOW, params, using)
        return int(moved)

    def cancel_many(
        self, job_ids: Sequence[int], *, reason: str = "cancelled", using: str | None = None
    ) -> int:
        """Move pending or running jobs to the dead table with `reason` (requeueable).

        Unlike `cancel` (S18, which deletes), the job stays on record. Returns how many
        were moved; finished jobs are skipped.
        """
        params = {"ids": _id_array(job_ids), "reason": reason}
        ((moved,),) = _fetchall(sql.CANCEL_JOBS, params, using)
        return int(moved)

    # Overview (the admin) ---------------------------------------------------------------

    def queue_names(self, *, dead: bool = False, using: str | None = None) -> list[str]:
        """Queues with jobs (or, with `dead`, with dead letters), and the configured ones."""
        statement = sql.DEAD_QUEUE_NAMES if dead else sql.LIVE_QUEUE_NAMES
        found = {row[0] for row in _fetchall(statement, {}, using)}
        if not dead:
            found.update(pgjobs_settings.QUEUES)
        return sorted(found)

    def overview(self, *, using: str | None = None) -> list[QueueOverview]:
        """Every queue's runnable, scheduled, running and dead jobs and its oldest runnable
        job's age, read along the partial indexes; counts past COUNT_CAP are estimates."""
        queues = sorted(
            set(self.queue_names(using=using)) | set(self.queue_names(dead=True, using=using))
        )
        if not queues:
            return []
        rows = _fetchall(sql.QUEUE_OVERVIEW, {"queues": queues, "cap": COUNT_CAP}, using)
        estimates = (sql.ESTIMATE_RUNNABLE, sql.ESTIMATE_SCHEDULED, sql.ESTIMATE_DEAD)
        overview = []
        for queue, runnable_n, scheduled_n, running_n, dead_n, oldest in rows:
            runnable, scheduled, dead = (
                Count(int(value))
                if value <= COUNT_CAP
                else Count(_estimate(statement, queue, using), estimated=True)
                for value, statement in zip(
                    (runnable_n, scheduled_n, dead_n), estimates, strict=True
                )
            )
            running = Count(int(running_n))  # exact: as many as the workers' slots at most
            overview.append(
                QueueOverview(queue, runnable, scheduled, running, dead, oldest_runnable_s=oldest)
            )
        return overview

    def throughput(self, minutes: int = 60, *, using: str | None = None) -> list[ThroughputPoint]:
        """Jobs finished and failed attempts per minute, oldest first (every minute)."""
        rows = _fetchall(sql.THROUGHPUT, {"minutes": int(minutes)}, using)
        return [ThroughputPoint(minute, int(ok), int(bad)) for minute, ok, bad in rows]

    def capped_count(self, queryset: models.QuerySet[Any]) -> int:
        """Count a queryset's rows up to COUNT_CAP; past it, return the planner's estimate."""
        exact = queryset.order_by()[: COUNT_CAP + 1].count()
        if exact <= COUNT_CAP:
            return exact
        plan = json.loads(queryset.order_by().explain(format="json"))
        return max(int(plan[0]["Plan"]["Plan Rows"]), exact)

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


def _announce_enqueued(
    jobs: Sequence[options.ResolvedJob], results: Sequence[EnqueueResult]
) -> None:
    """Send job_enqueued for each job written (when anyone listens)."""
    if not signals.job_enqueued.receivers:
        return
    for job, result in zip(jobs, results, strict=True):
        signals.send(
            signals.job_enqueued,
            job.kind,
            job_id=result.id,
            queue=job.queue,
            inserted=result.inserted,
        )


def _claimed_handles(rows: Sequence[Any], alias: str) -> list[JobHandle]:
    """The handles of a claim statement's rows (an empty claim returns one row of NULLs)."""
    return [
        JobHandle(
            id=row[1],
            queue=row[2],
            kind=row[3],
            key=row[4],
            priority=row[5],
            run_after=row[6],
            attempt=row[7],
            max_attempts=row[8],
            lease_s=row[9],
            token=row[10],
            claimed_at=row[11],
            claimed_until=row[12],
            worker_id=row[13],
            expires_at=row[14],
            created_at=row[15],
            payload=_decode(row[16]),
            using=alias,
        )
        for row in rows
        if row[1] is not None
    ]


#: Seconds a process trusts its list of limited queues (see JobManager._claim).
LIMITS_CACHE_S = 1.0
_limits_cache: dict[str, tuple[float, frozenset[str]]] = {}


def _limited_queues(alias: str) -> frozenset[str]:
    cached = _limits_cache.get(alias)
    now = time.monotonic()
    if cached is not None and cached[0] > now:
        return cached[1]
    names = frozenset(row[0] for row in _fetchall(sql.LIMITED_QUEUES, {}, alias))
    _limits_cache[alias] = (now + LIMITS_CACHE_S, names)
    return names


def forget_limits() -> None:
    """Make the next claim read the limited queues afresh (after a change)."""
    _limits_cache.clear()


def _wake_params() -> dict[str, Any]:
    return {"channel": pgjobs_settings.CHANNEL, "notify": pgjobs_settings.NOTIFY}


def _fetchall(statement: str, params: Mapping[str, Any], using: str | None) -> list[Any]:
    with _executed(statement, params, using) as cursor:
        return cursor.fetchall() if cursor.description else []


def _rowcount(statement: str, params: Mapping[str, Any], using: str | None) -> int:
    with _executed(statement, params, using) as cursor:
        return int(cursor.rowcount)


def _write_documents(documents: Iterable[Mapping[str, Any]], using: str | None) -> list[list[Any]]:
    """Run ENQUEUE_JOBS for each document (ENQUEUE_KEYLESS_JOBS when it has no keys), and
    return each run's rows.

    psycopg's pipeline mode sends each run as soon as its document is made, without
    waiting for the one before: the server writes while the caller validates the next.
    The runs join the caller's transaction, as in _executed; an exception from
    `documents` ends the pipeline and comes out (the caller rolls back what was sent).
    """
    connection = _usable_connection(using)
    raw = connection.connection
    prepare = _prepares(connection)
    started = time.monotonic()
    cursors: list[psycopg.Cursor[Any]] = []
    sent: list[str] = []
    try:
        with connection.wrap_database_errors, raw.pipeline():
            for params in documents:
                statement = sql.ENQUEUE_JOBS if params["keyed"] else sql.ENQUEUE_KEYLESS_JOBS
                cursor = psycopg.Cursor(raw)
                cursors.append(cursor)
                sent.append(statement)
                cursor.execute(statement, params, prepare=prepare)
        with connection.wrap_database_errors:
            return [cursor.fetchall() for cursor in cursors]
    finally:
        for cursor in cursors:
            cursor.close()
        if connection.queries_logged:
            _log_queries(connection, sent, started)


@contextmanager
def _executed(
    statement: str, params: Mapping[str, Any], using: str | None
) -> Iterator[psycopg.Cursor[Any]]:
    """Run one statement on Django's connection (so it joins the caller's transaction).

    The cursor binds parameters on the server, so that large arrays travel as data, and
    a worker's tuned connection prepares each statement once (tune_worker_connection),
    instead of going through Django's client-side binding cursor. Errors come out as Django's
    database exceptions, and the statement is logged where Django would log queries.
    """
    connection = _usable_connection(using)
    logged = connection.queries_logged
    started = time.monotonic() if logged else 0.0
    with connection.wrap_database_errors, psycopg.Cursor(connection.connection) as cursor:
        cursor.execute(statement, params, prepare=_prepares(connection))
        yield cursor
    if logged:
        _log_queries(connection, [statement], started)


def _usable_connection(using: str | None) -> Any:
    """Django's connection of `using`, connected, and not in a transaction an error broke."""
    connection = connections[_alias(using)]
    connection.ensure_connection()
    connection.validate_no_broken_transaction()
    return connection


def _log_queries(connection: Any, statements: Sequence[str], started: float) -> None:
    """Log statements where Django logs queries, each with its share of the time since
    `started` (time.monotonic())."""
    elapsed = f"{(time.monotonic() - started) / max(len(statements), 1):.3f}"
    connection.queries_log.extend({"sql": text.strip(), "time": elapsed} for text in statements)


def _prepares(connection: Any) -> bool:
    """Whether to prepare the queue's statements on this connection.

    Preparing saves the parse of every later execution, which on a small statement costs
    more than running it. It pays only on a connection that lives on: a worker's, or one
    of Django's persistent or pooled connections (CONN_MAX_AGE, OPTIONS["pool"]); a
    connection opened for one request would pay a round trip more instead. Only our
    statements are prepared: a connection Django left without prepared statements gets a
    threshold no other statement reaches.
    """
    if not pgjobs_settings.PREPARE:
        return False
    raw = connection.connection
    if getattr(raw, "_pgjobs_tuned", False):
        return True
    settings_dict = connection.settings_dict
    if not settings_dict.get("CONN_MAX_AGE") and not settings_dict["OPTIONS"].get("pool"):
        return False
    if raw.prepare_threshold is None:
        raw.prepare_threshold = 2**31 - 1
    return True


def _bookkeeping(using: str | None) -> dict[str, Any]:
    """The commit mode of a claim or completion statement.

    Outside a transaction, a claim, heartbeat or completion is a transaction of its own,
    and with ASYNC_BOOKKEEPING it commits without waiting for the WAL flush: a database
    crash can lose the last moments of them, and those jobs then run again, exactly as
    after a worker crash. Inside the caller's transaction (a fence, transaction mode) the
    caller's commit decides, and nothing is changed.
    """
    connection = connections[_alias(using)]
    asynchronous = pgjobs_settings.ASYNC_BOOKKEEPING and not connection.in_atomic_block
    return {"synchronous_commit": "off" if asynchronous else None}


class JobStatsManager(models.Manager["JobStats"]):
    """The per-minute rollup the admin's chart reads."""

    def record(
        self, counts: Mapping[str, tuple[int, int, int]], *, using: str | None = None
    ) -> None:
        """Add (succeeded, retried, dead) per queue to the current minute."""
        if not counts:
            return
        queues = sorted(counts)
        params = {
            "queues": queues,
            "succeeded": [counts[queue][0] for queue in queues],
            "retried": [counts[queue][1] for queue in queues],
            "dead": [counts[queue][2] for queue in queues],
        }
        _rowcount(sql.RECORD_STATS, params, using)

    def prune(self, limit: int, *, using: str | None = None) -> int:
        """Delete up to `limit` minutes older than a day."""
        return _rowcount(sql.PRUNE_STATS, {"limit": limit}, using)


@dataclass(frozen=True, slots=True)
class QueueStatus(QueueOverview):
    """One queue at a glance: its jobs, and its controls."""

    paused: bool = False
    max_running: int | None = None

    @property
    def running_of_limit(self) -> str:
        return running_of_limit(self.running, self.max_running)


def running_of_limit(running: Count | int, max_running: int | None) -> str:
    """A queue's running jobs, and its limit if it has one: "3 of 5", or "3"."""
    return f"{running} of {max_running}" if max_running else str(running)


class QueueControlManager(models.Manager["QueueControl"]):
    """Pause, resume and limit queues; every replica's claims obey at once."""

    def pause(self, queues: str | Sequence[str], *, using: str | None = None) -> list[str]:
        """Pause `queues` (rows are made for queues without one); return their names."""
        names = options.validate_queue_names(queues)
        return sorted(row[0] for row in _fetchall(sql.PAUSE_QUEUES, {"queues": names}, using))

    def resume(self, queues: str | Sequence[str], *, using: str | None = None) -> list[str]:
        """Resume the paused ones of `queues` and wake their workers; return those resumed."""
        names = options.validate_queue_names(queues)
        params = {"queues": names, **_wake_params()}
        return sorted(row[0] for row in _fetchall(sql.RESUME_QUEUES, params, using))

    def set_limit(self, queue: str, max_running: int | None, *, using: str | None = None) -> bool:
        """Allow at most `max_running` running jobs of `queue` across every worker (None:
        no limit). Returns False when the limit was already so.

        Raises:
            InvalidJobOption: a bad queue name or limit.
            ValueError: the queue's limit is set in settings (change it there).
        """
        name = options.validate_queue_name(queue)
        limit = _validated_limit(max_running)
        configured = pgjobs_settings.queue_limits()
        if name in configured:
            raise ValueError(
                f"Queue {name!r} has its limit in settings "
                f"(PGJOBS['QUEUES'][{name!r}]['MAX_RUNNING'] = {configured[name]}): "
                "change it there."
            )
        changed = self._write_limit(name, limit, from_settings=False, using=using)
        forget_limits()
        return changed

    def sync_settings(self, *, using: str | None = None) -> None:
        """Apply the limits of PGJOBS['QUEUES'] (as every worker does when it starts)."""
        configured = pgjobs_settings.queue_limits()
        alias = _alias(using)
        with transaction.atomic(using=alias):
            for name, limit in sorted(configured.items()):
                self._write_limit(name, limit, from_settings=True, using=alias)
            _fetchall(sql.LIFT_SETTINGS_LIMITS, {"queues": sorted(configured)}, alias)
        forget_limits()

    def _write_limit(
        self, name: str, limit: int | None, *, from_settings: bool, using: str | None
    ) -> bool:
        params = {
            "queue": name,
            "max_running": limit,
            "from_settings": from_settings,
            **_wake_params(),
        }
        return bool(_fetchall(sql.SET_QUEUE_LIMIT, params, using))

    def status(self, *, using: str | None = None) -> list[QueueStatus]:
        """Every queue with jobs, dead letters, a control or a setting, at a glance."""
        from django_pgjobs.models import Job

        alias = _alias(using)
        controls = {row.name: row for row in self.using(alias).all()}
        overview = {row.queue: row for row in Job.objects.overview(using=alias)}
        empty = QueueOverview("", Count(0), Count(0), Count(0), Count(0), None)
        statuses = []
        for name in sorted(set(overview) | set(controls)):
            seen = overview.get(name, empty)
            control = controls.get(name)
            counts = {field.name: getattr(seen, field.name) for field in fields(QueueOverview)}
            counts["queue"] = name
            statuses.append(
                QueueStatus(
                    **counts,
                    paused=bool(control and control.paused),
                    max_running=control.max_running if control else None,
                )
            )
        return statuses

    def ensure(self, queues: Iterable[str], *, using: str | None = None) -> None:
        """Give every queue of `queues` a row (no pause, no limit) if it has none."""
        from django_pgjobs.models import QueueControl

        names = options.validate_queue_names(list(queues)) if queues else []
        self.using(_alias(using)).bulk_create(
            [QueueControl(name=name) for name in names], ignore_conflicts=True
        )


def _validated_limit(max_running: Any) -> int | None:
    if max_running is None:
        return None
    if not isinstance(max_running, int) or isinstance(max_running, bool) or max_running < 1:
        raise InvalidJobOption(
            f"A queue's max_running must be a whole number >= 1 or None, not {max_running!r}."
        )
    if max_running > 2**31 - 1:
        raise InvalidJobOption(f"max_running {max_running} is too large.")
    return max_running


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


class ScheduleManager(models.Manager["Schedule"]):
    """Periodic jobs: sync the declarations, fire due ticks exactly once, admin actions."""

    def sync(self, declarations: Iterable[Any], *, using: str | None = None) -> Any:
        """Write `declarations` (schedules.Declaration); retire the rows no longer declared."""
        from django_pgjobs.schedules import SyncResult, next_tick

        alias = _alias(using)
        added = changed = 0
        names = []
        with transaction.atomic(using=alias):
            [(now,)] = _fetchall(sql.DATABASE_CLOCK, {}, alias)
            for declaration in declarations:
                names.append(declaration.name)
                params = {
                    "name": declaration.name,
                    "kind": declaration.kind,
                    "cron": declaration.cron,
                    "timezone": declaration.timezone,
                    "payload": json.dumps(declaration.payload),
                    "options": json.dumps(declaration.options),
                    "on_missed": declaration.on_missed,
                    "backfill_limit": declaration.backfill_limit,
                    "next_run_at": next_tick(declaration.cron, declaration.timezone, now),
                }
                for (inserted,) in _fetchall(sql.UPSERT_SCHEDULE, params, alias):
                    added += bool(inserted)
                    changed += not inserted
            retired = len(_fetchall(sql.RETIRE_SCHEDULES, {"names": names}, alias))
        return SyncResult(added=added, changed=changed, retired=retired)

    def due(self, *, limit: int = 100, using: str | None = None) -> list[DueSchedule]:
        rows = _fetchall(sql.DUE_SCHEDULES, {"limit": limit}, using)
        schedules = [DueSchedule._make(row) for row in rows]
        return [
            due._replace(payload=_decode(due.payload), options=_decode(due.options))
            for due in schedules
        ]

    def fire(
        self,
        due: DueSchedule,
        ticks: Sequence[datetime],
        following: datetime,
        *,
        using: str | None = None,
    ) -> list[int]:
        """Take `due`'s tick and enqueue a job per tick in `ticks`, in one transaction.

        Returns the jobs' ids, or [] when another replica took the tick first.
        """
        from django_pgjobs.models import Job

        alias = _alias(using)
        params = {
            "name": due.name,
            "seen": due.next_run_at,
            "next_run_at": following,
            "last_tick": ticks[-1],
            "ticks": len(ticks),
        }
        with transaction.atomic(using=alias):
            if not _fetchall(sql.ADVANCE_SCHEDULE, params, alias):
                return []
            job_ids = [
                Job.objects.enqueue(
                    due.kind, due.payload, run_after=tick, using=alias, **due.options
                ).id
                for tick in ticks
            ]
            _rowcount(sql.RECORD_SCHEDULE_JOB, {"name": due.name, "job_id": job_ids[-1]}, alias)
        return job_ids

    def run_now(self, names: Sequence[str], *, using: str | None = None) -> list[int]:
        """Enqueue a job of each schedule now, leaving its next tick as it is."""
        from django_pgjobs.models import Job

        alias = _alias(using)
        job_ids = []
        with transaction.atomic(using=alias):
            for schedule in self.using(alias).filter(name__in=names).order_by("name"):
                job_id = Job.objects.enqueue(
                    schedule.kind, schedule.payload, using=alias, **schedule.options
                ).id
                self.using(alias).filter(pk=schedule.pk).update(
                    last_job_id=job_id, runs=models.F("runs") + 1, updated_at=Now()
                )
                job_ids.append(job_id)
        return job_ids

    def enable(self, names: Sequence[str], *, using: str | None = None) -> int:
        """Enable schedules from their next tick after now (missed ticks are not run).

        A retired schedule (no longer declared) stays disabled: declare it again."""
        from django_pgjobs.schedules import next_tick

        alias = _alias(using)
        enabled = 0
        with transaction.atomic(using=alias):
            [(now,)] = _fetchall(sql.DATABASE_CLOCK, {}, alias)
            disabled = self.using(alias).filter(name__in=names, enabled=False, declared=True)
            for schedule in disabled.select_for_update():
                self.using(alias).filter(pk=schedule.pk).update(
                    enabled=True,
                    next_run_at=next_tick(schedule.cron, schedule.timezone, now),
                    updated_at=Now(),
                )
                enabled += 1
        return enabled

    def disable(self, names: Sequence[str], *, using: str | None = None) -> int:
        return int(
            self.using(_alias(using))
            .filter(name__in=names, enabled=True)
            .update(enabled=False, updated_at=Now())
        )

    def next_due_in(self, *, using: str | None = None) -> float | None:
        """Seconds until the next tick of an enabled schedule (None: no enabled schedule)."""
        ((seconds,),) = _fetchall(sql.NEXT_SCHEDULE_IN, {}, using)
        return None if seconds is None else max(float(seconds), 0.0)


class ChaosExecutionManager(models.Manager["ChaosExecution"]):
    """The ledger of a `manage.py chaosjobs` run: one row per execution of one of its jobs."""

    def record_start(
        self, handle: JobHandle, *, run_id: str, version: int, ghost: bool
    ) -> ChaosExecution:
        """Commit that `handle`'s job started (at the database's clock) and return the row."""
        return self.using(handle.using).create(
            run_id=run_id,
            job_id=handle.id,
            token=handle.token,
            attempt=handle.attempt,
            max_attempts=handle.max_attempts,
            worker=handle.worker_id,
            key=handle.key,
            version=version,
            ghost=ghost,
            claimed_at=handle.claimed_at,
        )

    def record_outcome(self, execution: ChaosExecution, outcome: str, *, wrote: bool) -> None:
        """Set how an execution ended; `wrote`: it committed its result (stamps the time)."""
        from django_pgjobs.functions import ClockTimestamp

        changes: dict[str, Any] = {"outcome": outcome}
        if wrote:
            changes["written_at"] = ClockTimestamp()
        self.using(execution._state.db).filter(pk=execution.pk).update(**changes)

    def of_run(self, run_id: str, *, using: str | None = None) -> list[ChaosExecution]:
        return list(self.using(_alias(using)).filter(run_id=run_id).order_by("claimed_at", "id"))

    def forget_run(self, run_id: str, queue: str, *, using: str | None = None) -> None:
        """Delete what a run left: its ledger, its jobs (live and dead) and their stats."""
        from django_pgjobs.models import DeadJob, Job, JobStats

        alias = _alias(using)
        with transaction.atomic(using=alias):
            self.using(alias).filter(run_id=run_id).delete()
            Job.objects.using(alias).filter(queue=queue).delete()
            DeadJob.objects.using(alias).filter(queue=queue).delete()
            JobStats.objects.using(alias).filter(queue=queue).delete()

    def census(self, queue: str, *, using: str | None = None) -> dict[str, int]:
        """How many jobs of `queue` are in each state, the dead ones under "dead"."""
        from django_pgjobs.models import DeadJob, Job

        alias = _alias(using)
        counts = dict(
            Job.objects.using(alias)
            .filter(queue=queue)
            .values_list("state")
            .annotate(models.Count("id"))
            .order_by()
        )
        counts["dead"] = DeadJob.objects.using(alias).filter(queue=queue).count()
        return counts

    def final_rows(self, queue: str, *, using: str | None = None) -> list[dict[str, Any]]:
        """Every job of `queue`, live and dead: id, key, state, payload, result, reason."""
        from django_pgjobs.models import DeadJob, Job

        alias = _alias(using)
        live = Job.objects.using(alias).filter(queue=queue)
        dead = DeadJob.objects.using(alias).filter(queue=queue)
        return [
            *(dict(row) for row in live.values("id", "key", "state", "payload", "result")),
            *(
                {**row, "state": "dead"}
                for row in dead.values("id", "key", "payload", "result", "reason")
            ),
        ]

    def limit_lock_wait(self, seconds: float, *, using: str | None = None) -> None:
        """Make the current transaction give up (LockNotAvailable) on a lock it waits for
        longer than `seconds`."""
        _fetchall(sql.LIMIT_LOCK_WAIT, {"timeout": f"{int(seconds * 1000)}ms"}, using)

    def clock(self, *, using: str | None = None) -> datetime:
        """The database's time now (S22): what a run stamps its faults with."""
        [(now,)] = _fetchall(sql.DATABASE_CLOCK, {}, using)
        return now  # type: ignore[no-any-return]

    def terminate_connections(
        self, application_name: str, *, limit: int, using: str | None = None
    ) -> int:
        """Drop up to `limit` server connections of `application_name`; return how many."""
        [(count,)] = _fetchall(
            sql.TERMINATE_BACKENDS, {"application_name": application_name, "limit": limit}, using
        )
        return int(count)


#: Advisory lock key of the sweeper: "pgjobs" as a number, so other locks rarely clash.
SWEEP_LOCK_ID = int.from_bytes(b"pgjobsSW", "big") & 0x7FFF_FFFF_FFFF_FFFF


def _retry_delay(handle: JobHandle, delay: float | timedelta | None) -> float:
    """The delay before a retry, in seconds: `delay` (a past one meaning now), or the
    kind's backoff when None. Raises InvalidSchedule for a delay that is no duration."""
    seconds = options.validate_retry_delay(delay)
    if seconds is None:
        return float(registry.backoff_for(handle.kind, handle.queue).delay(handle.attempt))
    return seconds


def _claim_keys(handles: Sequence[JobHandle]) -> dict[str, str]:
    """The ids and tokens of claims as array literals: `{1,2}` and `{uuid,uuid}`.

    Numbers and UUIDs need no quoting, and a literal is parsed by the server in C, where
    psycopg would adapt the lists element by element in Python: on the worker's hot path
    that adaptation cost more than the statements' own work.
    """
    return {
        "ids": "{" + ",".join([str(handle.id) for handle in handles]) + "}",
        "tokens": "{" + ",".join([str(handle.token) for handle in handles]) + "}",
    }


def _nulls(count: int) -> str:
    """An array literal of `count` NULLs, for results that are all None."""
    return "{" + ",".join(["NULL"] * count) + "}"


def _id_array(job_ids: Sequence[int]) -> str:
    """Job ids as an array literal (`{1,2}`); each must be a whole number."""
    return "{" + ",".join(str(int(job_id)) for job_id in job_ids) + "}"


def _estimate(statement: str, queue: str, using: str | None) -> int:
    ((plan,),) = _fetchall(statement, {"queue": queue}, using)
    document = json.loads(plan) if isinstance(plan, str) else plan
    return int(document[0]["Plan"]["Plan Rows"])


def _batch_alias(handles: Sequence[JobHandle]) -> str:
    aliases = {handle.using for handle in handles}
    if len(aliases) != 1:
        raise ValueError(f"A batch must hold claims of one database, not {sorted(aliases)}.")
    return aliases.pop()


def _mark_finished(
    handles: Sequence[JobHandle], ended: Sequence[tuple[str, str | None]] | None = None
) -> None:
    """Mark the handles finished once the current transaction commits (now, if none),
    with how each ended (signals.SUCCEEDED ... and a dead letter's reason), if given."""

    def mark() -> None:
        for index, handle in enumerate(handles):
            handle.finished = True
            if ended is not None:
                handle.ended, handle.dead_reason = ended[index]

    transaction.on_commit(mark, using=_batch_alias(handles))


#: Jobs per statement of enqueue_many: big enough that a statement's cost is its rows,
#: small enough that the server starts writing soon after the call starts.
ENQUEUE_CHUNK = 2000
#: Most bytes of one document of enqueue_many (a single job larger than it goes alone):
#: far below PostgreSQL's 1 GB message and 255 MB jsonb limits, whatever the payloads.
ENQUEUE_DOCUMENT_BYTES = 64 * 1024 * 1024


class _EnqueueBatch:
    """The jobs of one enqueue_many, validated and cut into ENQUEUE_JOBS' documents."""

    def __init__(self, on_conflict: str) -> None:
        self.on_conflict = on_conflict
        self.jobs: list[options.ResolvedJob] = []
        self._positions: list[list[tuple[int, bool]]] = []

    def documents(self, jobs: Iterable[Mapping[str, Any]]) -> Iterator[tuple[dict[str, Any], bool]]:
        """ENQUEUE_JOBS' parameters for each ENQUEUE_CHUNK jobs (fewer when their rows
        would pass ENQUEUE_DOCUMENT_BYTES), validated as they come, each with whether it
        is the last.

        Raises:
            InvalidJobOption: naming the job's index; its document is not yielded.
        """
        resolver = options.BatchResolver()
        chunk: list[options.ResolvedJob] = []
        rows: list[str] = []
        size = 0
        remaining = iter(enumerate(jobs))
        upcoming = next(remaining, None)
        while upcoming is not None:
            index, job = upcoming
            try:
                resolved, row = resolver.resolve(job)
            except InvalidJobOption as error:
                raise type(error)(f"jobs[{index}]: {error}") from None
            row_size = options.utf8_size(row)
            if chunk and size + row_size > ENQUEUE_DOCUMENT_BYTES:
                yield self._document(chunk, rows), False
                chunk, rows, size = [], [], 0
            chunk.append(resolved)
            rows.append(row)
            size += row_size + 1
            upcoming = next(remaining, None)
            if len(chunk) == ENQUEUE_CHUNK or upcoming is None:
                yield self._document(chunk, rows), upcoming is None
                chunk, rows, size = [], [], 0

    def _document(self, chunk: list[options.ResolvedJob], rows: list[str]) -> dict[str, Any]:
        self.jobs += chunk
        written, positions = _fold_duplicate_keys(chunk, rows, self.on_conflict)
        self._positions.append(positions)
        return {
            "jobs": "[" + ",".join(written) + "]",
            "keyed": any(job.key is not None for job in chunk),
            "on_conflict": self.on_conflict,
            **_wake_params(),
        }

    def results(self, chunks: Sequence[Sequence[Any]]) -> list[EnqueueResult]:
        """One EnqueueResult per job, in order, from the rows each document returned."""
        results: list[EnqueueResult] = []
        for rows, positions in zip(chunks, self._positions, strict=True):
            written = [EnqueueResult(id=row[0], inserted=row[1]) for row in rows]
            results += [
                written[row] if first else EnqueueResult(id=written[row].id, inserted=False)
                for row, first in positions
            ]
        return results


def _fold_duplicate_keys(
    jobs: list[options.ResolvedJob], rows: list[str], on_conflict: str
) -> tuple[list[str], list[tuple[int, bool]]]:
    """Merge jobs sharing a (kind, key) into the first of them, in order (S3 within a batch).

    `rows[i]` is `jobs[i]`'s row of ENQUEUE_JOBS' document. Returns the rows to write
    and, per job, (row index, whether it is that row's first job). ON CONFLICT cannot
    change one row twice in a statement, so a document must never carry one key twice;
    documents that follow one another merge in the database, with the same result.
    """
    written: list[str] = []
    positions: list[tuple[int, bool]] = []
    first_of_key: dict[tuple[str, str], tuple[int, options.ResolvedJob]] = {}
    for job, row in zip(jobs, rows, strict=True):
        if job.key is None:
            positions.append((len(written), True))
            written.append(row)
            continue
        seen = first_of_key.get((job.kind, job.key))
        if seen is None:
            first_of_key[(job.kind, job.key)] = (len(written), job)
            positions.append((len(written), True))
            written.append(row)
            continue
        index, merged = seen
        merged = _fold(merged, job, on_conflict)
        first_of_key[(job.kind, job.key)] = (index, merged)
        written[index] = merged.as_json_row()
        positions.append((index, False))
    return written, positions


def _fold(
    first: options.ResolvedJob, later: options.ResolvedJob, on_conflict: str
) -> options.ResolvedJob:
    if on_conflict == "ignore":
        return first
    if on_conflict == "keep_schedule":
        return first._replace(payload_json=later.payload_json, expires_s=later.expires_s)
    return first._replace(
        payload_json=later.payload_json,
        delay_s=later.delay_s,
        run_after=later.run_after,
        expires_s=later.expires_s,
    )
