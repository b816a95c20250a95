"""Enqueue (S1-S5): one job in one statement, or many jobs in documents of ENQUEUE_JOBS.

A document is one parameter, a JSON array of rows (`options.ENQUEUE_ROW`), that the
server parses in C. A batch of more than one document is sent in one pipeline inside one
transaction (a savepoint in the caller's): the server writes each while the next is
validated, which one statement for all cannot do.
"""

from __future__ import annotations

import itertools
import logging
import warnings
from collections.abc import Iterable, Iterator, Mapping, Sequence
from typing import Any, Final

from django_pgjobs import exceptions, options, registry, signals, tracing
from django_pgjobs.conf import pgjobs_settings
from django_pgjobs.db import sql
from django_pgjobs.db.connection import (
    atomic,
    enqueue_params,
    fetchall,
    in_transaction,
    in_transaction_elsewhere,
    write_documents,
)
from django_pgjobs.dependencies import resolve_after
from django_pgjobs.exceptions import InvalidJobOption
from django_pgjobs.managers.workflows import enqueue_dependent
from django_pgjobs.payloads import encode_payload, utf8_size
from django_pgjobs.records import EnqueueResult

logger = logging.getLogger("django_pgjobs.enqueue")

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
    after: Any = None,
    **given: Any,
) -> EnqueueResult:
    """Validate, resolve and write one job; see JobManager.enqueue."""
    on_conflict = options.validate_conflict_mode(on_conflict)
    edges = resolve_after(after)
    defaults = registry.decorator_defaults(kind) if isinstance(kind, str) else None
    resolved = options.resolve_job(kind, payload, defaults=defaults, **given)
    known_kind(resolved.kind)
    fit_payload(resolved.kind, payload)
    resolved = with_limits(resolved, payload)
    using = using or routed(resolved.queue)
    with tracing.sending() as sent:
        if edges:
            (result,) = enqueue_dependent([resolved], [edges], using)
        else:
            params = {**resolved.as_params(), **enqueue_params()}
            if resolved.key is None:
                (row,) = fetchall(sql.INSERT_JOB, params, using)
            else:
                params["on_conflict"] = on_conflict
                (row,) = fetchall(sql.ENQUEUE_JOB, params, using)
            result = EnqueueResult(id=row[0], inserted=row[1])
            result.created_at = row[2]
        sent.sent([resolved.queue], [result.id])
    announce([resolved], [result])
    return result


def enqueue_many(
    jobs: Iterable[Mapping[str, Any]], on_conflict: str, using: str | None
) -> list[EnqueueResult]:
    """Validate and write many jobs; see JobManager.enqueue_many."""
    on_conflict = options.validate_conflict_mode(on_conflict)
    if not isinstance(jobs, (list, tuple)):
        jobs = list(jobs)
    if using is None and pgjobs_settings.QUEUE_DATABASES:
        return _enqueue_many_routed(jobs, on_conflict)
    if any(isinstance(job, Mapping) and job.get("after") is not None for job in jobs):
        return enqueue_many_dependent(jobs, using)
    if not jobs:
        return []
    with tracing.sending(len(jobs)) as sent:
        batch = EnqueueBatch(on_conflict)
        documents = batch.documents(jobs)
        document, last = next(documents)  # the first document's jobs, validated
        if last:  # every job is in it
            chunks = write_documents([document], using)
        else:
            # A document is written while the next is validated: a job found invalid
            # later rolls back the documents sent before it.
            rest = (document for document, _ in documents)
            with atomic(using):
                chunks = write_documents(itertools.chain([document], rest), using)
        results = batch.results(chunks)
        sent.sent([job.queue for job in batch.jobs], [result.id for result in results])
    announce(batch.jobs, results)
    return results


def routed(queue: str) -> str | None:
    """The database of `queue`'s jobs when PGJOBS["QUEUE_DATABASES"] names one (None: no
    routes), warned about when the caller's transaction is elsewhere (`warn_outside`)."""
    if not pgjobs_settings.QUEUE_DATABASES:
        return None
    alias = pgjobs_settings.database_of(queue)
    warn_outside(alias, queue)
    return alias


def database_of_jobs(jobs: Sequence[options.ResolvedJob], what: str) -> str | None:
    """The one database of `jobs` written together (a workflow, a batch) when
    PGJOBS["QUEUE_DATABASES"] routes queues (None: no routes), warned about as `routed`.

    Raises:
        InvalidJobOption: their queues live in different databases; nothing is written.
    """
    if not pgjobs_settings.QUEUE_DATABASES or not jobs:
        return None
    homes = {pgjobs_settings.database_of(job.queue): job.queue for job in jobs}
    if len(homes) > 1:
        spread = ", ".join(f"{queue} in {alias}" for alias, queue in sorted(homes.items()))
        raise InvalidJobOption(
            f"The jobs of {what} live in several databases ({spread}; "
            "PGJOBS['QUEUE_DATABASES']): its edges can only join jobs of one database. "
            "Keep its jobs' queues in one database. Nothing was written."
        )
    ((alias, queue),) = homes.items()
    warn_outside(alias, queue)
    return alias


def warn_outside(alias: str, queue: str) -> None:
    """An OutsideTransactionWarning when the caller is inside a transaction of another
    database than `alias` and not of `alias`: the job will not share its fate."""
    if in_transaction(alias) or not in_transaction_elsewhere(alias):
        return
    warnings.warn(
        f"The job of queue {queue!r} was written to database {alias!r} "
        "(PGJOBS['QUEUE_DATABASES']), outside the transaction you are in: it stays if "
        f"that transaction rolls back. Use transaction.atomic(using={alias!r}) around the "
        "enqueue to tie it to the writes there.",
        exceptions.OutsideTransactionWarning,
        stacklevel=5,
    )


def _enqueue_many_routed(
    jobs: Sequence[Mapping[str, Any]], on_conflict: str
) -> list[EnqueueResult]:
    """enqueue_many when queues live in databases of their own: every job validated
    first, then one enqueue_many per database, in the order they first appear, the
    results in the jobs' order. Each database's jobs are written in its own transaction:
    all of them or none; a database refusing its write (down, say) leaves the ones
    written before it."""
    by_database: dict[str, list[int]] = {}
    first_queue: dict[str, str] = {}
    for index, job in enumerate(jobs):
        queue = _queue_of(job)
        alias = pgjobs_settings.database_of(queue) if queue else pgjobs_settings.DATABASE
        by_database.setdefault(alias, []).append(index)
        first_queue.setdefault(alias, queue or pgjobs_settings.DEFAULT_QUEUE)
    for alias, queue in first_queue.items():
        warn_outside(alias, queue)
    if len(by_database) <= 1:
        return enqueue_many(jobs, on_conflict, next(iter(by_database), None))
    # Every job is validated before any database is written: an invalid one writes none.
    resolver = BatchResolver()
    for index, job in enumerate(jobs):
        try:
            given: Any = job  # a hostile list may hold anything: resolve refuses it
            if isinstance(given, Mapping):
                resolve_after(given.get("after"))
                given = {name: value for name, value in given.items() if name != "after"}
            resolver.resolve(given)
        except InvalidJobOption as error:
            raise type(error)(f"jobs[{index}]: {error} Nothing was written.") from None
    results: list[EnqueueResult | None] = [None] * len(jobs)
    for alias, indexes in by_database.items():
        written = enqueue_many([jobs[i] for i in indexes], on_conflict, alias)
        for index, result in zip(indexes, written, strict=True):
            results[index] = result
    return [result for result in results if result is not None]


def _queue_of(job: Any) -> str | None:
    """The queue a job of enqueue_many goes to, as its resolution will find it: its own,
    else its kind's decorator's, else the default (None: not a mapping; it is refused
    when resolved)."""
    if not isinstance(job, Mapping):
        return None
    queue = job.get("queue")
    if isinstance(queue, str):
        return queue
    kind = job.get("kind")
    defaults = registry.decorator_defaults(kind) if isinstance(kind, str) else {}
    default = defaults.get("queue")
    return default if isinstance(default, str) else pgjobs_settings.DEFAULT_QUEUE


def enqueue_many_dependent(
    jobs: Sequence[Mapping[str, Any]], using: str | None
) -> list[EnqueueResult]:
    """enqueue_many for jobs of which some have parents (S29): one statement for all."""
    resolver = BatchResolver()
    resolved: list[options.ResolvedJob] = []
    edges = []
    for index, job in enumerate(jobs):
        try:
            job_resolved, _ = resolver.resolve(job)
            edges.append(resolve_after(job.get("after")))
        except InvalidJobOption as error:
            raise type(error)(f"jobs[{index}]: {error}") from None
        resolved.append(job_resolved)
    with tracing.sending(len(resolved)) as sent:
        results = enqueue_dependent(resolved, edges, using)
        sent.sent([job.queue for job in resolved], [result.id for result in results])
    announce(resolved, results)
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
        resolver = BatchResolver()
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
            **enqueue_params(),
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


def with_limits(job: options.ResolvedJob, payload: Any) -> options.ResolvedJob:
    """`job` with the concurrency key value and limits its kind brings (S34, S35).

    Raises:
        InvalidLimit: the kind's key function raised or gave no usable value.
    """
    definition = registry.get_definition(job.kind)
    limits = definition.limits if definition is not None else None
    if limits is None:
        return job
    limit_key = limits.key_value(job.kind, payload if isinstance(payload, Mapping) else None)
    if limit_key is None:
        return job
    rate = limits.rate
    return job._replace(
        limit_key=limit_key,
        concurrency_limit=limits.concurrency,
        rate_limit=None if rate is None else rate.limit,
        rate_period_s=None if rate is None else rate.period_s,
    )


#: The enqueue options a job given to enqueue_many may carry.
ENQUEUE_MANY_KEYS: Final = frozenset(
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
        "timeout",
        "after",
    }
)


class BatchResolver:
    """Validate and resolve the jobs of one enqueue_many, each a mapping of enqueue's
    arguments, into ResolvedJobs and their rows of ENQUEUE_JOBS' JSON document.

    The jobs of a batch mostly differ in payload and key only, so each distinct set of
    the other options (with the kind) is resolved, and its row head written, once.
    """

    def __init__(self) -> None:
        self._resolved: dict[tuple[Any, ...], tuple[options.ResolvedJob, str]] = {}
        #: (kind, the payload's argument names) found to fit the kind's handler (S28):
        #: the payloads of a batch mostly share a shape, bound to the signature once.
        self._fitting: set[tuple[str, tuple[str, ...]]] = set()
        #: The kinds of this batch whose jobs carry limits (S34), by their definition.
        self._limited: set[str] = set()

    def resolve(self, job: Any) -> tuple[options.ResolvedJob, str]:
        """Return the job resolved and its JSON row, or raise InvalidJobOption."""
        if type(job) is not dict and not isinstance(job, Mapping):
            raise exceptions.InvalidJobOption(
                f"Each job must be a mapping of enqueue options, not {job!r}."
            )
        unknown = job.keys() - ENQUEUE_MANY_KEYS
        if unknown:
            raise exceptions.InvalidJobOption(
                f"Unknown option(s) {sorted(unknown)}; a job may give {sorted(ENQUEUE_MANY_KEYS)}."
            )
        if "kind" not in job:
            raise exceptions.InvalidJobOption("A job needs a 'kind'.")
        # Types are part of the identity: 1, 1.0 and True are equal, not equally valid.
        given = tuple(
            (name, type(value), value)
            for name, value in job.items()
            if name != "payload" and name != "key" and name != "after"
        )
        try:
            template, head = self._resolved[given]
        except KeyError:
            template, head = self._resolved[given] = self._template(given)
        except TypeError:  # an unhashable option, which resolving rejects
            template, head = self._template(given)
        key = options.validate_key(job.get("key"))
        payload = job.get("payload")
        payload_json = encode_payload(payload)
        shape = (template.kind, tuple(payload) if payload else ())
        if shape not in self._fitting:
            fit_payload(template.kind, payload)
            self._fitting.add(shape)
        # The template with this job's key and payload (fields 2 and 3).
        resolved = options.ResolvedJob(template[0], template[1], key, payload_json, *template[4:])
        if template.kind in self._limited:
            # Its limits differ from the template's (none) when it has a key value.
            resolved = with_limits(resolved, payload)
            return resolved, resolved.as_json_row()
        return resolved, resolved.as_json_row(head)

    def _template(self, given: tuple[Any, ...]) -> tuple[options.ResolvedJob, str]:
        values = {name: value for name, _, value in given}
        kind = values.pop("kind")
        defaults = registry.decorator_defaults(kind) if isinstance(kind, str) else None
        template = options.resolve_job(kind, defaults=defaults, **values)
        known_kind(template.kind)
        definition = registry.get_definition(template.kind)
        if definition is not None and definition.limits is not None:
            self._limited.add(template.kind)
        return template, template.json_head()


#: Kinds this process was asked to enqueue without a handler of them (warned once each).
_unknown_kinds: set[str] = set()


def fit_payload(kind: str, payload: Any) -> None:
    """Refuse a payload that does not fit the handler this process has for `kind` (S28);
    a kind without a handler here is left to `known_kind`.

    Raises:
        InvalidPayload: naming the argument; nothing is written.
    """
    definition = registry.get_definition(kind)
    if definition is None:
        return
    misfit = definition.misfit({} if payload is None else payload)
    if misfit is not None:
        raise exceptions.InvalidPayload(f"{misfit[0].upper()}{misfit[1:]}. Nothing was written.")


def known_kind(kind: str) -> None:
    """Accept a kind this process has no handler for (another service's workers may own
    it), warning once per kind with the closest registered names; PGJOBS["STRICT_KINDS"]
    refuses it instead.

    Raises:
        InvalidKind: an unknown kind under STRICT_KINDS; nothing is written.
    """
    if registry.get_definition(kind) is not None:
        module = registry.undiscovered_module(kind)
        if module is not None and kind not in _unknown_kinds:
            _unknown_kinds.add(kind)
            logger.warning(
                "enqueued a job of kind %r, defined in %s, a module no app loads: a worker "
                "knows it only if it happens to import that module too, and otherwise fails "
                "it with 'unknown job kind' (%s). Move it to a jobs.py module of its app, or "
                "add %r to PGJOBS['JOB_MODULES']. (Warned once per kind.)",
                kind,
                module,
                registry.HOW_WORKERS_FIND_KINDS,
                module,
            )
        return
    close = registry.closest_kinds(kind)
    guess = f" Did you mean {' or '.join(map(repr, close))}?" if close else ""
    if pgjobs_settings.STRICT_KINDS:
        raise exceptions.InvalidKind(
            f"No job is registered as {kind!r} in this process, and PGJOBS['STRICT_KINDS'] "
            f"refuses unknown kinds.{guess}"
        )
    if kind not in _unknown_kinds:
        _unknown_kinds.add(kind)
        logger.warning(
            "enqueued a job of kind %r, which this process has no handler for: fine if "
            "another service's workers own it, else a typo.%s (Warned once per kind; "
            "PGJOBS['STRICT_KINDS'] = True refuses unknown kinds.)",
            kind,
            guess,
        )
