"""Enqueue (S1-S5): one job in one statement, or many jobs in documents of ENQUEUE_JOBS.

A document is one parameter, a JSON array of rows (`options.ENQUEUE_ROW`), that the
server parses in C. A batch of more than one document is sent in one pipeline inside one
transaction (a savepoint in the caller's): the server writes each while the next is
validated, which one statement for all cannot do.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable, Iterator, Mapping, Sequence
from typing import Any

from django_pgjobs import options, registry, signals
from django_pgjobs.db import sql
from django_pgjobs.db.connection import atomic, fetchall, wake_params, write_documents
from django_pgjobs.exceptions import InvalidJobOption
from django_pgjobs.payloads import utf8_size
from django_pgjobs.records import EnqueueResult

#: Jobs per statement of enqueue_many: big enough that a statement's cost is its rows,
#: small enough that the server starts writing soon after the call starts.
ENQUEUE_CHUNK = 2000
#: Most bytes of one document of enqueue_many (a single job larger than it goes alone):
#: far below PostgreSQL's 1 GB message and 255 MB jsonb limits, whatever the payloads.
ENQUEUE_DOCUMENT_BYTES = 64 * 1024 * 1024


def enqueue_one(
    kind: str,
    payload: Mapping[str, Any] | None,
    on_conflict: str,
    using: str | None,
    **given: Any,
) -> EnqueueResult:
    """Validate, resolve and write one job; see JobManager.enqueue."""
    on_conflict = options.validate_conflict_mode(on_conflict)
    defaults = registry.decorator_defaults(kind) if isinstance(kind, str) else None
    resolved = options.resolve_job(kind, payload, defaults=defaults, **given)
    options.known_kind(resolved.kind)
    options.fit_payload(resolved.kind, payload)
    params = {**resolved.as_params(), **wake_params()}
    if resolved.key is None:
        (row,) = fetchall(sql.INSERT_JOB, params, using)
    else:
        params["on_conflict"] = on_conflict
        (row,) = fetchall(sql.ENQUEUE_JOB, params, using)
    result = EnqueueResult(id=row[0], inserted=row[1])
    result.created_at = row[2]
    announce([resolved], [result])
    return result


def enqueue_many(
    jobs: Iterable[Mapping[str, Any]], on_conflict: str, using: str | None
) -> list[EnqueueResult]:
    """Validate and write many jobs; see JobManager.enqueue_many."""
    batch = EnqueueBatch(options.validate_conflict_mode(on_conflict))
    documents = batch.documents(jobs)
    first = next(documents, None)  # the first document's jobs, validated
    if first is None:
        return []
    document, last = first
    if last:  # every job is in it
        chunks = write_documents([document], using)
    else:
        # A document is written while the next is validated: a job found invalid later
        # rolls back the documents sent before it.
        rest = (document for document, _ in documents)
        with atomic(using):
            chunks = write_documents(itertools.chain([document], rest), using)
    results = batch.results(chunks)
    announce(batch.jobs, results)
    return results


def announce(jobs: Sequence[options.ResolvedJob], results: Sequence[EnqueueResult]) -> None:
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


class EnqueueBatch:
    """The jobs of one enqueue_many, validated and cut into ENQUEUE_JOBS' documents."""

    def __init__(self, on_conflict: str) -> None:
        self.on_conflict = on_conflict
        self.jobs: list[options.ResolvedJob] = []
        self._positions: list[list[tuple[int, bool]]] = []

    def documents(self, jobs: Iterable[Mapping[str, Any]]) -> Iterator[tuple[dict[str, Any], bool]]:
        """ENQUEUE_JOBS' parameters for each ENQUEUE_CHUNK jobs
        (fewer when their rows would pass ENQUEUE_DOCUMENT_BYTES), validated as they
        come, with whether it is the last.

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
            row_size = utf8_size(row)
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
        written, positions = fold_duplicate_keys(chunk, rows, self.on_conflict)
        self._positions.append(positions)
        return {
            "jobs": "[" + ",".join(written) + "]",
            "keyed": any(job.key is not None for job in chunk),
            "on_conflict": self.on_conflict,
            **wake_params(),
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


def fold_duplicate_keys(
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
