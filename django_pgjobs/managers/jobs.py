"""`Job.objects`: enqueue, claim, complete, and the operators' view of the live table.

The worker, the admin, the commands and the django.tasks backend call these methods and
hold no SQL. Each claim's handle carries this manager, so its writes come back here.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any

from django.db import transaction

from django_pgjobs import options, registry, signals
from django_pgjobs.claims import Backend, Failure, JobHandle
from django_pgjobs.conf import pgjobs_settings
from django_pgjobs.db import connection as db
from django_pgjobs.db import sql
from django_pgjobs.dependencies import Edge
from django_pgjobs.exceptions import Cancelled
from django_pgjobs.managers import batches, claiming, workflows
from django_pgjobs.managers import enqueue as enqueueing
from django_pgjobs.managers.floors import claim_floors
from django_pgjobs.managers.upkeep import JobUpkeep
from django_pgjobs.options import UNSET
from django_pgjobs.payloads import ERROR_TEXT_MAX_CHARS, encode_result, storable_text
from django_pgjobs.records import (
    BatchRecord,
    EnqueueResult,
    Heartbeats,
    RescueResult,
)
from django_pgjobs.states import DeadCategory

if TYPE_CHECKING:
    from django_pgjobs.models import Job  # noqa: F401


class JobManager(JobUpkeep):
    """Enqueue, claim and complete jobs (and read them, JobReads, and keep the table,
    JobUpkeep)."""

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
        timeout: float | timedelta | None = UNSET,
        after: Iterable[Any] | None = None,
        using: str | None = None,
    ) -> EnqueueResult:
        """Write one job in the caller's transaction (S1), merging by key (S3).

        Options left out come from the kind's @job decorator, then the queue's settings,
        then the app defaults (S2). Inside `transaction.atomic()` the job exists if and
        only if that transaction commits; workers are woken at commit (S23).

        With `after` (ids, enqueue results, `Parent(job, on_failure=)`), the job waits
        for every parent to end (S29) and dies with a dying one unless on_failure="run"
        (S30). A job with parents has no key.

        Returns:
            EnqueueResult(id, inserted): `inserted` is False when merged into a live job.

        Raises:
            InvalidJobOption: a subclass naming the bad argument; nothing is written.
        """
        return enqueueing.enqueue_one(
            kind,
            payload,
            on_conflict,
            using,
            after,
            queue=queue,
            key=key,
            priority=priority,
            run_after=run_after,
            delay=delay,
            max_attempts=max_attempts,
            lease=lease,
            expires=expires,
            result_retention=result_retention,
            timeout=timeout,
        )

    def enqueue_many(
        self,
        jobs: Iterable[Mapping[str, Any]],
        *,
        on_conflict: str = "replace",
        using: str | None = None,
    ) -> list[EnqueueResult]:
        """Write many jobs in one statement (S5), with the same rules as `enqueue`.

        Each job is a mapping of `enqueue`'s arguments (`kind` required; with `after`,
        the batch is one statement, without keys). Jobs sharing a (kind, key) merge in
        order, as if enqueued one after another. Nothing is written
        when any job is invalid. A batch of more than ENQUEUE_CHUNK jobs (or of more than
        ENQUEUE_DOCUMENT_BYTES of rows) is sent as several statements in one pipeline,
        inside one transaction (a savepoint in the caller's).

        Returns:
            One EnqueueResult per job, in the order given.
        """
        return enqueueing.enqueue_many(jobs, on_conflict, using)

    def enqueue_workflow(
        self,
        jobs: Sequence[options.ResolvedJob],
        edges: Sequence[Sequence[Edge]],
        *,
        using: str | None = None,
    ) -> list[EnqueueResult]:
        """Write resolved jobs and their edges in one statement (S29), for `workflow()`."""
        results = workflows.enqueue_dependent(jobs, edges, using)
        enqueueing.announce(jobs, results)
        return results

    # Claim -------------------------------------------------------------------------

    def claim_batch(
        self, queues: str | Sequence[str], n: int, worker_id: str, *, using: str | None = None
    ) -> list[JobHandle]:
        """Claim up to `n` jobs of `queues` in one statement (S6-S9).

        Lapsed claims (crash recovery) come first, then pending jobs in priority DESC,
        run_after, id order. Each claim consumes an attempt and gets a fresh token.
        Concurrent claimers get disjoint jobs. `n <= 0` returns [] without a query. A job
        a cancel request binds (S38: it went back in line as its cancel came) is
        dead-lettered with the request's reason instead of returned.
        """
        return self.claim_for_worker(queues, n, worker_id, using=using)[0]

    def claim_for_worker(
        self,
        queues: str | Sequence[str],
        n: int,
        worker_id: str,
        *,
        using: str | None = None,
        places: int = 0,
        loop_kinds: Sequence[str] = (),
    ) -> tuple[list[JobHandle], tuple[bool, float | None]]:
        """claim_batch, and what it learnt of the next due job: (True, the seconds until
        a job of `queues` is next due, None if none) when it came up short over every
        queue in one statement, else (False, None): ask `next_due_in`.

        A worker with an event loop gives its async kinds (`loop_kinds`) and the loop's
        free `places`: up to `n` jobs of other kinds are claimed for its threads and up
        to `places` of those kinds for the loop, each into capacity of its own kind.
        """
        n = options.validate_claim_size(n)
        worker_id = options.validate_worker_id(worker_id)
        names = options.validate_queue_names(queues)
        places = options.validate_claim_size(places)
        return claiming.claim_for_worker(
            self, names, n, worker_id, db.alias(using), places, sorted(loop_kinds)
        )

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
            **db.wake_params(),
        }
        ((requeued, dead, promoted, _woken, _dependents),) = db.fetchall(
            sql.RESCUE_LAPSED_JOBS, params, using
        )
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
        lease_floor = claim_floors(db.alias(using)).lease_floor
        params = {"queues": names, "lease_floor": lease_floor}
        ((seconds,),) = db.fetchall(sql.NEXT_DUE_IN, params, using)
        return None if seconds is None else max(float(seconds), 0.0)

    def tune_worker_connection(self, *, using: str | None = None) -> None:
        """Make this thread's connection a worker's (see db.connection)."""
        db.tune_worker_connection(using)

    # Completion (the handle's writes, one statement for any number of claims) ------------

    def ack_batch(self, handles: Sequence[JobHandle], results: Sequence[Any] | None = None) -> int:
        """Ack every handle whose claim is current (S12, S17); return how many were acked."""
        if not handles:
            return 0
        if results is None:
            results = [None] * len(handles)
        if len(results) != len(handles):
            raise ValueError("ack_batch needs one result per handle.")
        pairs = workflows.in_id_order(zip(handles, results, strict=True))
        handles, results = [pair[0] for pair in pairs], [pair[1] for pair in pairs]
        alias = _batch_alias(handles)
        encoded = [encode_result(result) for result in results]
        params = {
            **db.array_of_claims(handles),
            "results": encoded if any(encoded) else db.array_of_nulls(len(encoded)),
            **db.wake_params(),
            **db.commit_mode(alias),
        }
        ((acked, _woken, _, requested),) = db.fetchall(sql.ACK_JOBS, params, alias)
        cancelled = self._answer_cancels(handles, requested)
        _mark_finished(
            [handle for handle in handles if handle.id not in cancelled],
            [(signals.SUCCEEDED, None)] * (len(handles) - len(cancelled)),
        )
        return int(acked)

    def retry_batch(
        self,
        retries: Sequence[tuple[JobHandle, Failure, float | timedelta | None]],
    ) -> int:
        """Record failed attempts (S13): each (handle, failure, delay or None for backoff).

        A delay in the past means now (S27). Returns how many claims were current
        (retried, promoted or dead-lettered).

        Raises:
            InvalidSchedule: a delay that is no duration (NaN, over a century, a string).
        """
        return self._retry_statement(sql.RETRY_JOBS, retries)

    def _retry_statement(
        self,
        statement: str,
        retries: Sequence[tuple[JobHandle, Failure, float | timedelta | None]],
    ) -> int:
        if not retries:
            return 0
        retries = workflows.in_id_order(retries)
        handles = [handle for handle, _, _ in retries]
        alias = _batch_alias(handles)
        delays = [_retry_delay(handle, delay) for handle, _, delay in retries]
        failures = [failure for _, failure, _ in retries]
        params = {
            **db.array_of_claims(handles),
            **_failure_params(failures),
            "categories": _categories(failures, DeadCategory.MAX_ATTEMPTS),
            "delays_s": delays,
            **db.wake_params(),
            **db.commit_mode(alias),
        }
        ((retried, promoted, dead, _woken, _, requested),) = db.fetchall(statement, params, alias)
        cancelled = self._answer_cancels(handles, requested)
        ended = [handle for handle in handles if handle.id not in cancelled]
        _mark_finished(
            ended,
            [
                (signals.DEAD, signals.MAX_ATTEMPTS_EXCEEDED)
                if handle.is_last_attempt
                else (signals.RETRIED, None)
                for handle in ended
            ],
        )
        return int(retried) + int(promoted) + int(dead)

    def _answer_cancels(self, handles: Sequence[JobHandle], requested: Any) -> set[int]:
        """Stop the claims among `handles` that a cancel request binds (S38; `requested`:
        reasons by job id, as the statement returned them), which it did not complete:
        each handler is told, and the job is dead-lettered with the request's reason.
        Inside a transaction (a fence, transaction mode) the completion must not commit
        with it: Cancelled is raised, which rolls that transaction back. Returns the ids.
        """
        reasons: dict[str, str] = db.json_value(requested) or {}
        stopped = [handle for handle in handles if str(handle.id) in reasons]
        if not stopped:
            return set()
        first = stopped[0]
        if db.in_transaction(first.using):
            for handle in stopped:
                handle.control.cancel(reasons[str(handle.id)])
            raise Cancelled(
                f"Job {first.id} ({first.kind}) was cancelled while it ran: "
                f"{reasons[str(first.id)]}; its completion is refused (S38)."
            )
        return self.stop_cancelled(stopped, reasons)

    def stop_cancelled(self, handles: Sequence[JobHandle], reasons: dict[str, str]) -> set[int]:
        """Stop the claims among `handles` that a cancel request binds (S38; `reasons`:
        each request's reason by job id): each handler is told, and the job is
        dead-lettered with its request's reason. Returns their ids."""
        stopped = [handle for handle in handles if str(handle.id) in reasons]
        for handle in stopped:
            handle.control.cancel(reasons[str(handle.id)])
        self.fail_batch(
            [
                (handle, Failure(reasons[str(handle.id)], category=DeadCategory.CANCELLED))
                for handle in stopped
            ]
        )
        return {handle.id for handle in stopped}

    def fail_batch(self, failures: Sequence[tuple[JobHandle, Failure]]) -> int:
        """Dead-letter claimed jobs at once (S15): each (handle, failure); the failure's
        error is the reason, verbatim, and its category the letter's ("failed" when it
        names none). Returns how many claims were current."""
        if not failures:
            return 0
        failures = workflows.in_id_order(failures)
        handles = [handle for handle, _ in failures]
        alias = _batch_alias(handles)
        given = [failure for _, failure in failures]
        params = {
            **db.array_of_claims(handles),
            **_failure_params(given),
            "categories": _categories(given, DeadCategory.FAILED),
            **db.wake_params(),
            **db.commit_mode(alias),
        }
        ((dead, promoted, _woken, _),) = db.fetchall(sql.FAIL_JOBS, params, alias)
        _mark_finished(handles, [(signals.DEAD, failure.error) for _, failure in failures])
        return int(dead) + int(promoted)

    def heartbeat_batch(
        self, handles: Sequence[JobHandle], extend: float | timedelta | None = None
    ) -> int:
        """Extend current claims to now() + `extend` (default: each job's lease) (S11).

        An absolute reset, not additive; lapsed or superseded claims are refused. Returns
        how many were extended; each extended handle's `claimed_until` is updated.
        """
        if not handles:
            return 0
        alias = _batch_alias(handles)
        params = {**_heartbeat_params(handles, extend), **db.commit_mode(alias)}
        by_id = {handle.id: handle for handle in handles}
        rows = db.fetchall(sql.HEARTBEAT_JOBS, params, alias)
        for job_id, claimed_until, _ in rows:
            by_id[job_id].claimed_until = claimed_until
        return len(rows)

    def heartbeat_unlocked(
        self,
        handles: Sequence[JobHandle],
        progress: Sequence[str | None] | None = None,
    ) -> Heartbeats:
        """Heartbeat as `heartbeat_batch` does, skipping rows a transaction holds locked
        (a fence or a transaction-mode job: the lock already keeps claimers away), and
        store each claim's progress report (`progress[i]`, JSON; None: none).

        Returns the handles extended, and those whose handlers should stop, with why: a
        cancel request binds the job (S38: extended as well, for as long as its handler
        takes to stop), or the job was dead-lettered under their claim ("cancelled",
        say). A claim whose job is gone otherwise is neither: it lapsed (S16).
        """
        if not handles:
            return Heartbeats([], [])
        alias = _batch_alias(handles)
        params = {
            **_heartbeat_params(handles, None),
            "progress": list(progress) if progress is not None else [None] * len(handles),
            **db.commit_mode(alias),
        }
        by_id = {handle.id: handle for handle in handles}
        extended, gone = [], []
        for job_id, claimed_until, reason, _ in db.fetchall(
            sql.HEARTBEAT_UNLOCKED_JOBS, params, alias
        ):
            handle = by_id[job_id]
            if claimed_until is not None:
                handle.claimed_until = claimed_until
                extended.append(handle)
            if reason is not None:  # extended too when a cancel request binds it (S38)
                gone.append((handle, reason))
        return Heartbeats(extended, gone)

    def record_progress(self, handle: JobHandle, progress: str) -> bool:
        """Store `handle`'s progress report (JSON) if its claim is current."""
        params = {"id": handle.id, "token": handle.token, "progress": progress}
        return bool(db.fetchall(sql.RECORD_PROGRESS, params, handle.using))

    def release_batch(self, handles: Sequence[JobHandle]) -> int:
        """Hand claims back (S25): pending again, the attempt refunded. Returns how many."""
        if not handles:
            return 0
        alias = _batch_alias(handles)
        params = {
            **db.array_of_claims(handles),
            **db.wake_params(),
            **db.commit_mode(alias),
        }
        ((released, _woken, _),) = db.fetchall(sql.RELEASE_JOBS, params, alias)
        _mark_finished(handles)
        return int(released)

    def lock_claim(self, handle: JobHandle) -> bool:
        """Lock the job row for the current transaction if `handle`'s claim is current.

        Raises:
            Cancelled: a cancel request binds the claim (S38); the handler is told.
        """
        params = {"id": handle.id, "token": handle.token}
        rows = db.fetchall(sql.LOCK_CURRENT_CLAIM, params, handle.using)
        if rows:
            handle.control.backend = Backend(rows[0][2], rows[0][3])
        if rows and rows[0][1] is not None:
            handle.control.cancel(rows[0][1])
            raise Cancelled(
                f"Job {handle.id} ({handle.kind}) was cancelled while it ran: {rows[0][1]}."
            )
        return bool(rows)

    def cut_statement(self, backend: Backend, *, using: str | None = None) -> bool:
        """Cancel the statement `backend` runs now, if any and while it still runs its
        transaction (a transaction-mode job at its timeout, S33, S39); the transaction
        then fails and rolls back."""
        return _signalled(sql.CANCEL_STATEMENT, backend, using)

    def end_backend(self, backend: Backend, *, using: str | None = None) -> bool:
        """End `backend` while it still runs its transaction: a transaction-mode job's
        whose handler ran on past its timeout without a statement to cut (S39); its row
        lock goes with it."""
        return _signalled(sql.END_BACKEND, backend, using)

    def limit_statement_time(self, handle: JobHandle, seconds: float) -> None:
        """Cancel any statement of the current transaction that runs past `seconds` (a
        transaction-mode job's timeout, S33)."""
        timeout = f"{max(1, round(seconds * 1000))}ms"
        db.fetchall(sql.LIMIT_STATEMENT_TIME, {"timeout": timeout}, handle.using)

    def time_out_batch(
        self, timeouts: Sequence[tuple[JobHandle, Failure, float | timedelta | None]]
    ) -> int:
        """Record timed-out attempts whose handlers the worker abandoned (S33): each
        (handle, failure, delay or None for backoff), retried or dead when spent, as
        retry_batch does; a row a fence holds is skipped (it returns when its lease
        lapses). Returns how many were recorded."""
        return self._retry_statement(sql.TIME_OUT_JOBS, timeouts)

    # Operators -----------------------------------------------------------------------

    def cancel(self, job_id: int, *, using: str | None = None) -> bool:
        """Delete a pending or running job (S18). Returns False when there is no such job.

        A running handler is told (S32: `ctx.cancelled`), and its later writes are
        refused, since its claim is gone. A job whose row a transaction holds right now
        (a fence, transaction mode) gets a cancel request, recorded at once (S38): its
        handler is told by NOTIFY or at its next heartbeat, no completion of that claim
        is taken, and its worker dead-letters it as "cancelled".
        """
        params = {"ids": db.array_of_ids([job_id]), "reason": "cancelled", **db.wake_params()}
        ((deleted, told, _),) = db.fetchall(sql.CANCEL_JOB, params, using)
        return bool(deleted or told)

    def parent_results(self, handle: JobHandle) -> dict[int, Any]:
        """The results of `handle`'s job's parents that are done, by id (S29)."""
        return workflows.parent_results(handle.id, handle.using)

    def batch_of(self, handle: JobHandle) -> BatchRecord | None:
        """The batch `handle`'s job is a member or a callback of (S31), or None."""
        return batches.batch_of_job(handle.id, handle.using)

    def run_now(self, job_ids: Sequence[int], *, using: str | None = None) -> int:
        """Make pending jobs runnable now; return how many were pending."""
        params = {"ids": db.array_of_ids(job_ids), **db.wake_params()}
        ((moved, _woken),) = db.fetchall(sql.RUN_JOBS_NOW, params, using)
        return int(moved)

    def cancel_many(
        self, job_ids: Sequence[int], *, reason: str = "cancelled", using: str | None = None
    ) -> int:
        """Move pending or running jobs to the dead table with `reason` (requeueable).

        Unlike `cancel` (S18, which deletes), the job stays on record. Running handlers
        are told (S32). Returns how many were moved, or got a cancel request (S38: a
        transaction holds their row right now; no completion of that claim is taken, and
        their workers dead-letter them with `reason`); finished jobs are skipped. The
        reason is made storable as a failure's is (S27: NUL and lone surrogates escaped,
        its length bounded); the letters' category is "cancelled", whatever it says.
        """
        stored = storable_text(reason, ERROR_TEXT_MAX_CHARS)
        params = {"ids": db.array_of_ids(job_ids), "reason": stored, **db.wake_params()}
        ((moved, told, _),) = db.fetchall(sql.CANCEL_JOBS, params, using)
        return int(moved) + int(told)

    def cancel_requested_in_line(self, limit: int, *, using: str | None = None) -> int:
        """Cancel up to `limit` jobs back in line that a cancel request binds (S38): a
        retry, a lapse or a hand-back put each back as its cancel came. Each ends as its
        request says; one its claimer took meanwhile is cancelled as it runs. Returns
        how many were cancelled."""
        by_reason: dict[str, list[int]] = {}
        for job_id, reason in db.fetchall(sql.REQUESTED_IN_LINE, {"limit": limit}, using):
            by_reason.setdefault(reason, []).append(job_id)
        return sum(
            self.cancel_many(ids, reason=reason, using=using) for reason, ids in by_reason.items()
        )


def _signalled(statement: str, backend: Backend, using: str | None) -> bool:
    """Whether `statement` (a cancel or an end) reached `backend`: False when the backend
    no longer runs its transaction, so nothing else is reached."""
    rows = db.fetchall(statement, {"pid": backend.pid, "xact": backend.xact}, using)
    return bool(rows and rows[0][0])


def _retry_delay(handle: JobHandle, delay: float | timedelta | None) -> float:
    """The delay before a retry, in seconds: `delay` (a past one meaning now), or the
    kind's backoff when None. Raises InvalidSchedule for a delay that is no duration."""
    seconds = options.validate_retry_delay(delay)
    if seconds is None:
        return float(registry.backoff_for(handle.kind, handle.queue).delay(handle.attempt))
    return seconds


def _heartbeat_params(
    handles: Sequence[JobHandle], extend: float | timedelta | None
) -> dict[str, Any]:
    extension = None if extend is None else options.validate_extend(extend)
    return {
        **db.array_of_claims(handles),
        "extends_s": [
            float(handle.lease_s) if extension is None else extension for handle in handles
        ],
    }


def _failure_params(failures: Sequence[Failure]) -> dict[str, Any]:
    """The failures of a retry or fail statement, each already storable (S27)."""
    return {
        "errors": [failure.error for failure in failures],
        "tracebacks": [failure.traceback for failure in failures],
        "exceptions": [failure.exception for failure in failures],
        "errors_kept": pgjobs_settings.ERRORS_KEPT,
    }


def _categories(failures: Sequence[Failure], default: DeadCategory) -> list[str]:
    """The dead letters' categories of a retry or fail statement, one per failure."""
    return [(failure.category or default).value for failure in failures]


def _batch_alias(handles: Sequence[JobHandle]) -> str:
    aliases = {handle.using for handle in handles}
    if len(aliases) != 1:
        raise ValueError(f"A batch must hold claims of one database, not {sorted(aliases)}.")
    return aliases.pop()


def _mark_finished(
    handles: Sequence[JobHandle], ended: Sequence[tuple[str, str | None]] | None = None
) -> None:
    """Mark the handles finished once the current transaction commits (now, if none),
    with how each ended (signals.SUCCEEDED ... and a dead letter's reason), if given.
    A keyed job's end makes the next keyed claim due at once: its key has room."""
    if not handles:
        return

    def mark() -> None:
        if any(handle.keyed for handle in handles):
            claiming.keyed_freed(handles[0].using)
        for index, handle in enumerate(handles):
            handle.finished = True
            if ended is not None:
                handle.ended, handle.dead_reason = ended[index]

    transaction.on_commit(mark, using=_batch_alias(handles))
