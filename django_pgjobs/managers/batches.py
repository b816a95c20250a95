"""`Batch.objects`: batches of member jobs whose callbacks fire once, when the last
member ends (S31); the statements and the locking rule are in db/sql/batches.py.

A batch is written in one transaction (a savepoint in the caller's): WRITE_BATCH with
its callbacks and the first members, ADD_BATCH_MEMBERS for the rest when they do not fit
one document, then, unless it stays open, its seal ended. Members added later (by
anyone, a running member included) and the seal take the callbacks' locks first.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING

from django.db import models

from django_pgjobs import exceptions, tracing
from django_pgjobs.conf import pgjobs_settings
from django_pgjobs.db import connection as db
from django_pgjobs.db import sql
from django_pgjobs.dependencies import MAX_JOB_ID
from django_pgjobs.managers import enqueue as enqueueing
from django_pgjobs.options import ResolvedJob
from django_pgjobs.payloads import utf8_size
from django_pgjobs.records import BatchCallbackState, BatchMember, BatchRecord, EnqueueResult

if TYPE_CHECKING:
    from django_pgjobs.models import Batch  # noqa: F401

#: What a callback may fire on, as `batch()` names them.
FIRES_ON = {"on_success": "success", "on_failure": "failure", "on_complete": "complete"}


class BatchManager(models.Manager["Batch"]):
    """Batches: write, add members, seal, read, prune."""

    def write(
        self,
        members: Sequence[ResolvedJob],
        callbacks: Sequence[tuple[str, ResolvedJob]],
        *,
        seal: bool,
        using: str | None = None,
    ) -> tuple[int, list[EnqueueResult], list[EnqueueResult]]:
        """Write a batch: its `members`, its `callbacks` (each with what it fires on:
        "success", "failure" or "complete"), sealed unless `seal` is false. Returns the
        batch's id, the members' and the callbacks' results, in the order given.

        Raises:
            InvalidBatch: no callback; nothing is written.
        """
        if not callbacks:
            raise exceptions.InvalidBatch(
                "A batch needs a callback (on_success=, on_failure= or on_complete=): its "
                "end is what it is for. Use enqueue_many for jobs without one. Nothing "
                "was written."
            )
        chunks = _row_chunks(members)
        first = next(chunks, [])
        rows_of_jobs = [*first, *(job.as_json_row() for _, job in callbacks)]
        jobs = [*members, *(job for _, job in callbacks)]
        with tracing.sending(len(jobs)) as sent, db.atomic(using):
            params = {
                "jobs": "[" + ",".join(rows_of_jobs) + "]",
                "members": len(first),
                "fires_on": [fires_on for fires_on, _ in callbacks],
                **db.enqueue_params(),
            }
            rows = db.fetchall(sql.WRITE_BATCH, params, using)
            batch_id = int(rows[0][0])
            ids = [int(row[1]) for row in rows]
            member_ids, callback_ids = ids[: len(first)], ids[len(first) :]
            for chunk in chunks:
                member_ids += _add_members(batch_id, callback_ids, chunk, using)
            if seal:
                self.seal(batch_id, using=using)
            sent.sent([job.queue for job in jobs], [*member_ids, *callback_ids])
        written = [EnqueueResult(id=job_id, inserted=True) for job_id in member_ids]
        fired = [EnqueueResult(id=job_id, inserted=True) for job_id in callback_ids]
        enqueueing.announce(jobs, [*written, *fired])
        return batch_id, written, fired

    def add(
        self, batch_id: int, members: Sequence[ResolvedJob], *, using: str | None = None
    ) -> list[EnqueueResult]:
        """Add `members` to a batch that has not ended (open, or sealed with members
        still running: a running member may fan out). One transaction.

        Raises:
            BatchEnded: its callbacks were released; nothing is written.
            InvalidBatch: no such batch.
        """
        batch_id = valid_batch_id(batch_id)
        if not members:
            return []
        with db.atomic(using):
            callbacks = self._lock_callbacks(batch_id, using)
            if not callbacks:
                raise self._why_closed(batch_id, using)
            ids = []
            for chunk in _row_chunks(members):
                ids += _add_members(batch_id, callbacks, chunk, using)
        results = [EnqueueResult(id=job_id, inserted=True) for job_id in ids]
        enqueueing.announce(members, results)
        return results

    def seal(self, batch_id: int, *, using: str | None = None) -> bool:
        """Seal an open batch: it ends with its last member, at once if none is left.
        Returns False if it was sealed already (or has ended).

        Raises:
            InvalidBatch: no such batch.
        """
        batch_id = valid_batch_id(batch_id)
        with db.atomic(using):
            if not self._lock_callbacks(batch_id, using):
                if self.get_batch(batch_id, using=using) is None:
                    raise exceptions.InvalidBatch(f"No batch has the id {batch_id}.")
                return False
            if not db.fetchall(sql.SEAL_BATCH, {"batch": batch_id}, using):
                return False
            db.fetchall(sql.END_BATCH_SEAL, {"batch": batch_id, **db.wake_params()}, using)
        return True

    def get_batch(self, batch_id: int, *, using: str | None = None) -> BatchRecord | None:
        """The batch as stored, with its tally so far and its callbacks; None if none."""
        return read_batch(valid_batch_id(batch_id), using)

    def members(
        self, batch_id: int, *, after: int = 0, limit: int = 50, using: str | None = None
    ) -> list[BatchMember]:
        """Up to `limit` of the batch's members with ids above `after`, in id order, each
        with its kind, state and recorded end: while a callback of the batch keeps its
        edges (until it is acked). Pages by the last id shown, so that the last page of
        100,000 members costs what the first does."""
        params = {"batch": valid_batch_id(batch_id), "after": int(after), "limit": int(limit)}
        return [
            BatchMember(int(job_id), kind, state, ended)
            for job_id, kind, state, ended in db.fetchall(sql.BATCH_MEMBERS, params, using)
        ]

    def prune(self, older_than_s: float, limit: int, *, using: str | None = None) -> int:
        """Delete up to `limit` batches that ended over `older_than_s` ago."""
        params = {"older_than_s": float(older_than_s), "limit": int(limit)}
        ((pruned,),) = db.fetchall(sql.PRUNE_BATCHES, params, using)
        return int(pruned)

    def _lock_callbacks(self, batch_id: int, using: str | None) -> list[int]:
        rows = db.fetchall(sql.LOCK_BATCH_CALLBACKS, {"batch": int(batch_id)}, using)
        return [int(row[0]) for row in rows]

    def _why_closed(self, batch_id: int, using: str | None) -> exceptions.PgJobsError:
        record = self.get_batch(batch_id, using=using)
        if record is None:
            return exceptions.InvalidBatch(f"No batch has the id {batch_id}. Nothing was written.")
        if not record.ended:
            return exceptions.InvalidBatch(
                f"Batch {batch_id} has no callback left waiting (each was cancelled by hand): "
                "it can never end, so it takes no members. Start another batch. Nothing "
                "was written."
            )
        return exceptions.BatchEnded(
            f"Batch {batch_id} has ended ({record.state}, {record.done} done, "
            f"{record.failed} failed): its callbacks were released, so it takes no more "
            "members. Start another batch. Nothing was written."
        )


def valid_batch_id(value: object) -> int:
    """`value` as a batch id (an int in bigint's positive range).

    Raises:
        InvalidBatch: anything else.
    """
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= MAX_JOB_ID:
        raise exceptions.InvalidBatch(
            f"A batch id is a positive integer (Batch.id, batch().id), not {value!r:.80}."
        )
    return int(value)


def database_of_batch(batch_id: object, using: str | None, what: str) -> str | None:
    """The database `what` (a function's name) acts on for batch `batch_id`: `using`,
    else the one database of jobs (None: PGJOBS["DATABASE"]).

    Raises:
        InvalidBatch: a batch id that is none (valid_batch_id), or no `using` while
            PGJOBS["QUEUE_DATABASES"] keeps queues in several databases: each numbers
            its batches, so an id alone names none of them.
    """
    valid_batch_id(batch_id)
    databases = pgjobs_settings.databases()
    if using is not None or len(databases) == 1:
        return using
    raise exceptions.InvalidBatch(
        f"{what}({batch_id}) needs using=: PGJOBS['QUEUE_DATABASES'] keeps jobs in several "
        f"databases ({', '.join(databases)}), each with batches of its own ids. Pass the "
        "database of the batch's queues: b.using of the batch() that wrote it, or ctx.using "
        "in one of its members or callbacks. Nothing was done."
    )


def read_batch(batch_id: int, using: str | None) -> BatchRecord | None:
    """Batch `batch_id` as stored, with its tally so far and its callbacks; None if none."""
    rows = db.fetchall(sql.BATCH, {"batch": int(batch_id)}, using)
    if not rows:
        return None
    batch_id, state, members, done, failed, created_at, ended_at, callbacks = rows[0]
    return BatchRecord(
        id=batch_id,
        state=state,
        members=members,
        done=int(done or 0),
        failed=int(failed or 0),
        created_at=created_at,
        ended_at=ended_at,
        callbacks=tuple(
            BatchCallbackState(fires_on, int(job_id), job_state)
            for fires_on, job_id, job_state in db.json_value(callbacks)
        ),
    )


def batch_of_job(job_id: int, using: str | None) -> BatchRecord | None:
    """The batch job `job_id` is a callback or a member of (a member's, until the batch
    ends), or None."""
    rows = db.fetchall(sql.BATCH_OF_JOB, {"id": int(job_id)}, using)
    return read_batch(rows[0][0], using) if rows else None


def _add_members(
    batch_id: int, callbacks: Sequence[int], rows: Sequence[str], using: str | None
) -> list[int]:
    params = {
        "batch": batch_id,
        "callbacks": list(callbacks),
        "jobs": "[" + ",".join(rows) + "]",
        **db.enqueue_params(),
    }
    return [int(row[0]) for row in db.fetchall(sql.ADD_BATCH_MEMBERS, params, using)]


def _row_chunks(members: Sequence[ResolvedJob]) -> Iterator[list[str]]:
    """The JSON rows of `members` (each made once), cut as enqueue_many cuts its
    documents: ENQUEUE_CHUNK rows, fewer when they would pass ENQUEUE_DOCUMENT_BYTES of
    UTF-8 (with their separators)."""
    chunk: list[str] = []
    size = 0
    for job in members:
        row = job.as_json_row()
        row_size = utf8_size(row)
        if chunk and (
            len(chunk) == enqueueing.ENQUEUE_CHUNK
            or size + row_size > enqueueing.ENQUEUE_DOCUMENT_BYTES
        ):
            yield chunk
            chunk, size = [], 0
        chunk.append(row)
        size += row_size + 1
    if chunk:
        yield chunk
