"""A claim and what becomes of it: the handle a handler receives as `ctx`, one failed
attempt (`Failure`), and how a run ended (`Outcome`, `Verdict`).

Every write through a handle is conditioned on the claim still being the job's current
one (DESIGN S10): a lapsed, superseded or cancelled claim gets `False` and changes
nothing. The handle holds no SQL: it asks the manager that made it.
"""

from __future__ import annotations

import logging
import threading
import traceback as traceback_module
import uuid
from collections.abc import AsyncIterator, Callable, Iterable, Iterator, Sequence
from contextlib import asynccontextmanager, contextmanager
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from enum import Enum
from typing import Any, NamedTuple, Protocol

from django.db import connections, transaction

from django_pgjobs.exceptions import Cancelled, LeaseLost
from django_pgjobs.payloads import (
    ERROR_TEXT_MAX_CHARS,
    TRACEBACK_MAX_CHARS,
    encode_progress,
    safe_str,
    storable_text,
)
from django_pgjobs.records import BatchRecord
from django_pgjobs.states import DeadCategory

logger = logging.getLogger("django_pgjobs.jobs")

#: How a run ended, as the signals and the counters say it.
SUCCEEDED, RETRIED, DEAD, LOST = "succeeded", "retried", "dead", "lost"
CANCELLED = "cancelled"
MAX_ATTEMPTS_EXCEEDED = "max attempts exceeded"


class ClaimWriter(Protocol):
    """The writes a claim makes (JobManager's): each checks the claim is current (S10)."""

    def ack_batch(
        self, handles: Sequence[JobHandle], results: Sequence[Any] | None = ...
    ) -> int: ...

    def retry_batch(
        self, retries: Sequence[tuple[JobHandle, Failure, float | timedelta | None]]
    ) -> int: ...

    def fail_batch(self, failures: Sequence[tuple[JobHandle, Failure]]) -> int: ...

    def heartbeat_batch(
        self, handles: Sequence[JobHandle], extend: float | timedelta | None = ...
    ) -> int: ...

    def release_batch(self, handles: Sequence[JobHandle]) -> int: ...

    def lock_claim(self, handle: JobHandle) -> bool: ...

    def record_progress(self, handle: JobHandle, progress: str) -> bool: ...

    def limit_statement_time(self, handle: JobHandle, seconds: float) -> None: ...

    def parent_results(self, handle: JobHandle) -> dict[int, Any]: ...

    def batch_of(self, handle: JobHandle) -> BatchRecord | None: ...


class Backend(NamedTuple):
    """A transaction on a database server: the backend's process id and the transaction's
    id. A process id alone can name another connection by the time it is used (the
    transaction ended and the connection runs the thread's next job, or a new connection
    took the id); the pair names that transaction while it runs. A signal is sent after
    the check, so a transaction that ends in between is the one instant it can miss."""

    pid: int
    xact: str


class RunControl:
    """What passes between a running handler and its worker: a cancellation (S32), and
    the handler's latest progress report. Used from the handler's thread (or the event
    loop) and the worker's loop at once, so every change is made under a lock.
    """

    __slots__ = (
        "_cancelled",
        "_end_told",
        "_hooks",
        "_lock",
        "_report",
        "_woken",
        "abandoned",
        "backend",
        "carrier",
        "reason",
        "trace",
    )

    def __init__(self) -> None:
        self._cancelled = False
        #: Made by the first `wait` only: most runs never sleep on their control, and a
        #: claim makes one control per job (an Event is a Condition and a Lock more).
        self._woken: threading.Event | None = None
        self._lock = threading.Lock()
        self._hooks: list[Callable[[], None]] = []
        self._report: str | None = None
        self._end_told = False
        #: Why the run must stop ("cancelled", "expired", "timed out after 30 s" ...).
        self.reason: str | None = None
        #: Called when a report waits, by the worker that carries reports to the
        #: database with its heartbeats (None: no worker; a report is written at once).
        self.carrier: Callable[[], None] | None = None
        #: Set by the worker that gave up on the handler at its timeout (S33): whatever
        #: the handler meets after (its transaction ended, say) is none of its business.
        self.abandoned = False
        #: The database backend of a transaction-mode job's transaction while it runs,
        #: and that transaction: the worker cancels its statement at the job's timeout,
        #: and ends it past the grace, only while that backend still runs it (S39).
        self.backend: Backend | None = None
        #: The run's span while it runs (tracing.Run), for the worker to end when it
        #: abandons the handler at its timeout (None: tracing is off).
        self.trace: Any = None

    @property
    def cancelled(self) -> bool:
        return self._cancelled

    def cancel(self, reason: str) -> bool:
        """Tell the handler to stop; False if it was told already."""
        with self._lock:
            if self._cancelled:
                return False
            self.reason = reason
            self._cancelled = True
            if self._woken is not None:
                self._woken.set()
            hooks, self._hooks = self._hooks, []
        for hook in hooks:
            try:
                hook()
            except Exception:  # a hook must not keep the others from running
                logger.exception("a cancellation hook raised")
        return True

    def tell_end(self) -> bool:
        """True the first time only: how the run ended is told (log, signals) once, by
        whoever comes first, the handler's thread or the worker that abandoned it at
        its timeout (S27, S33)."""
        with self._lock:
            first, self._end_told = not self._end_told, True
        return first

    def on_cancel(self, hook: Callable[[], None]) -> None:
        """Call `hook` when the run is cancelled (at once, if it is already)."""
        with self._lock:
            if not self._cancelled:
                self._hooks.append(hook)
                return
        hook()

    def wait(self, timeout: float | None) -> bool:
        """Sleep up to `timeout` seconds or until cancelled; True when cancelled."""
        with self._lock:
            if self._cancelled:
                return True
            if self._woken is None:
                self._woken = threading.Event()
            woken = self._woken
        return woken.wait(timeout)

    def report(self, progress: str) -> bool:
        """Keep `progress` for the worker to store; False when no worker carries it."""
        with self._lock:
            self._report = progress
            carrier = self.carrier
        if carrier is None:
            return False
        carrier()
        return True

    def take_report(self) -> str | None:
        with self._lock:
            report, self._report = self._report, None
        return report


@dataclass(frozen=True, slots=True)
class Failure:
    """One failed attempt, as recorded in a job's `errors`.

    Its texts are made storable as it is made (S27): whatever a handler raised, its
    failure can be written (NUL and lone surrogates escaped, lengths bounded).
    `category` is the dead letter's if this failure ends the job; None: the
    statement's own ("failed" for a fail, "max attempts exceeded" for a spent retry).
    """

    error: str
    traceback: str | None = None
    exception: str | None = None
    category: DeadCategory | None = None

    def __post_init__(self) -> None:
        error = reason_text(self.error, "(no error text)")
        object.__setattr__(self, "error", storable_text(error, ERROR_TEXT_MAX_CHARS))
        if self.traceback is not None:
            traceback = storable_text(self.traceback, TRACEBACK_MAX_CHARS)
            object.__setattr__(self, "traceback", traceback)
        if self.exception is not None:
            exception = storable_text(self.exception, ERROR_TEXT_MAX_CHARS)
            object.__setattr__(self, "exception", exception)

    @classmethod
    def from_exception(
        cls,
        error: BaseException,
        text: str | None = None,
        category: DeadCategory | None = None,
    ) -> Failure:
        """The failure an exception describes; `text` replaces its "Class: message"."""
        kind = type(error)
        if text is None:
            message = safe_str(error)
            text = f"{kind.__name__}: {message}" if message else kind.__name__
        return cls(
            error=text,
            traceback=_formatted(error),
            exception=f"{safe_str(kind.__module__)}.{kind.__qualname__}",
            category=category,
        )

    @classmethod
    def of(cls, error: str | BaseException | Failure) -> Failure:
        if isinstance(error, Failure):
            return error
        if isinstance(error, BaseException):
            return cls.from_exception(error)
        if isinstance(error, str):
            return cls(error=error)
        raise TypeError(f"An error must be a string or an exception, not {type(error).__name__}.")


def reason_text(reason: object, default: str) -> str:
    """A reason as given (S15: a dead letter's, verbatim), or `default` when it says
    nothing (None, or blank)."""
    text = "" if reason is None else safe_str(reason)
    return text if text.strip() else default


def _formatted(error: BaseException) -> str:
    """The traceback of `error` as text; never raises, whatever the exception holds."""
    try:
        return "".join(traceback_module.format_exception(error))
    except BaseException as failure:  # a hostile __notes__ or cause chain
        return f"(the traceback could not be formatted: {type(failure).__name__})"


@dataclass(slots=True, eq=False)
class JobHandle:
    """One claim of one job: its row as claimed, and the writes the claim may make."""

    id: int
    queue: str
    kind: str
    key: str | None
    priority: int
    run_after: datetime
    attempt: int
    max_attempts: int
    lease_s: int
    token: uuid.UUID
    claimed_at: datetime
    claimed_until: datetime
    worker_id: str
    expires_at: datetime | None
    created_at: datetime
    payload: dict[str, Any]
    using: str
    #: Where this claim's writes go: the manager that made it (JobManager).
    manager: ClaimWriter = field(repr=False)
    #: Set once this claim's completion (ack, retry, fail or release) has committed.
    finished: bool = field(default=False)
    #: How that completion ended the run ("succeeded", "retried", "dead"), and a dead
    #: letter's reason: what the signals report of a handler that completed its claim.
    ended: str | None = field(default=None)
    dead_reason: str | None = field(default=None)
    #: Seconds the attempt may run (S33; None: no timeout).
    timeout_s: float | None = field(default=None)
    #: The job has a concurrency key (S34).
    keyed: bool = field(default=False)
    #: The W3C trace context its enqueue stored (None: enqueued outside a trace, or
    #: with tracing off): its run's span links to it.
    trace_context: dict[str, str] | None = field(default=None, repr=False)
    #: Cancellation and progress between the handler and its worker (S32).
    control: RunControl = field(default_factory=RunControl, repr=False)
    #: Called once this claim's outcome is saved, by whoever saved it (the worker, or the
    #: handler's own transaction): the django.tasks backend's task_finished, for one.
    #: See `run_after_recorded`.
    after_recorded: list[Callable[[], None]] = field(default_factory=list, repr=False)

    @property
    def job_id(self) -> int:
        return self.id

    @property
    def cancelled(self) -> bool:
        """Whether the job was cancelled while it runs (S32): the handler should stop."""
        return self.control.cancelled

    def raise_if_cancelled(self) -> None:
        """Raise Cancelled if the job was cancelled (S32); a cheap check between steps."""
        if self.control.cancelled:
            raise Cancelled(
                f"Job {self.id} ({self.kind}) was cancelled while it ran: "
                f"{self.control.reason or 'cancelled'}."
            )

    def sleep(self, seconds: float) -> None:
        """Sleep up to `seconds`, waking at once if the job is cancelled (then raising
        Cancelled): a wait between polls of a remote service that a cancel cuts short."""
        self.control.wait(seconds)
        self.raise_if_cancelled()

    def progress(
        self, fraction: float | None = None, message: str | None = None, **data: Any
    ) -> None:
        """Report how far the run got: a fraction from 0 to 1, a message, JSON data.

        The latest report is stored on the job with the time it was made, carried by
        the worker's next heartbeat (at most one write per second per job); outside a
        worker it is written at once. Shown by get_job, the admin and jobsctl.

        Raises:
            InvalidPayload: a fraction outside 0..1, data that is not JSON, a report
                past PROGRESS_MAX_BYTES.
        """
        report = encode_progress(fraction, message, data)
        if not self.control.report(report):
            taken = self.control.take_report()
            if taken is not None:
                self.manager.record_progress(self, taken)

    @property
    def is_last_attempt(self) -> bool:
        """Whether a failure of this claim's run dead-letters the job (S13): its attempts
        are spent."""
        return self.attempt >= self.max_attempts

    def parent_results(self) -> dict[int, Any]:
        """The results of this job's parents that are done, by parent id (S29).

        Every parent done is there, with what its handler returned (None included: a
        parent that left no trace of its end cannot be named, S40). Kept with the
        dependency whatever the parent's result retention, until this job is acked. A
        parent that died under on_failure="run" is not among them.
        """
        return self.manager.parent_results(self)

    def batch(self) -> BatchRecord | None:
        """The batch this job is a member or a callback of (S31), as stored now: its
        state, tally (members done and failed so far) and callbacks; None if none. A
        member may add siblings to it (`add_to_batch(ctx.batch().id, ...)`) while it
        runs."""
        return self.manager.batch_of(self)

    def ack(self, result: Any = None) -> bool:
        """Complete the job (S12). Returns False, changing nothing, if the claim is not current."""
        return self.manager.ack_batch([self], [result]) == 1

    def retry(self, error: str | BaseException, delay: float | timedelta | None = None) -> bool:
        """Record a failed attempt and run again after `delay` or the backoff (S13).

        With no attempts left the job is dead-lettered as "max attempts exceeded".
        Returns False, changing nothing, if the claim is not current.
        """
        given = reason_text(error, "retry requested") if isinstance(error, str) else error
        return self.manager.retry_batch([(self, Failure.of(given), delay)]) == 1

    def fail(self, error: str | BaseException | None = None) -> bool:
        """Dead-letter the job at once with `error` as its reason, "failed" by default (S15)."""
        given = reason_text(error, "failed") if error is None or isinstance(error, str) else error
        failure = Failure.of(given)
        return self.manager.fail_batch([(self, failure)]) == 1

    def heartbeat(self, extend: float | timedelta | None = None) -> bool:
        """Reset the lease to now() + `extend` (default: the job's lease) (S11).

        Returns False if the claim is no longer current: a late heartbeat is refused.
        """
        return self.manager.heartbeat_batch([self], extend) == 1

    def release(self) -> bool:
        """Give the claim back: pending again, the attempt refunded (S25)."""
        return self.manager.release_batch([self]) == 1

    @contextmanager
    def fenced(self) -> Iterator[JobHandle]:
        """Open a transaction whose writes commit only while this claim is current (S16).

        The job row stays locked until the block ends, so no other claim can take the
        job over meanwhile; `ack()` inside the block commits together with the block's
        writes. A claim that is no longer current raises LeaseLost on entry; a cancelled
        one raises Cancelled, on entry or from an `ack()` inside the block, which rolls
        the block back (S38).
        """
        with transaction.atomic(using=self.using):
            if not self.manager.lock_claim(self):
                raise LeaseLost(
                    f"Job {self.id} ({self.kind}): claim {self.token} is no longer current; "
                    "its lease lapsed, it was cancelled, or another claim took the job over."
                )
            yield self

    @asynccontextmanager
    async def afenced(self) -> AsyncIterator[JobHandle]:
        """`fenced()` for an async handler: `async with ctx.afenced():`.

        The block's transaction lives on a thread of its own, and the async ORM calls
        made inside the block (`await Model.objects.acreate(...)`) run on that thread,
        so they commit with the block, only while the claim is current (S16). Use
        `await ctx.aack(result)` inside it to complete the job with the block.
        """
        from asgiref.sync import ThreadSensitiveContext, sync_to_async

        block = transaction.atomic(using=self.using)

        def enter() -> None:
            block.__enter__()
            try:
                current = self.manager.lock_claim(self)
            except BaseException as error:  # Cancelled (S38), or the database's refusal
                block.__exit__(type(error), error, error.__traceback__)
                raise
            if not current:
                block.__exit__(None, None, None)
                raise LeaseLost(
                    f"Job {self.id} ({self.kind}): claim {self.token} is no longer current; "
                    "its lease lapsed, it was cancelled, or another claim took the job over."
                )

        def close() -> None:
            connections[self.using].close()

        async with ThreadSensitiveContext():
            try:
                await sync_to_async(enter)()
                try:
                    yield self
                except BaseException as error:
                    await sync_to_async(block.__exit__)(type(error), error, error.__traceback__)
                    raise
                await sync_to_async(block.__exit__)(None, None, None)
            finally:
                await sync_to_async(close)()

    async def aack(self, result: Any = None) -> bool:
        """`ack()` from async code, on the thread of the fence it is inside (if any)."""
        from asgiref.sync import sync_to_async

        acked: bool = await sync_to_async(self.ack)(result)
        return acked

    def __repr__(self) -> str:
        return (
            f"<JobHandle id={self.id} kind={self.kind} queue={self.queue} "
            f"attempt={self.attempt}/{self.max_attempts}>"
        )


def run_after_recorded(handles: Iterable[JobHandle]) -> None:
    """Run, once each, the callbacks waiting for these claims' outcomes, just saved.

    Callbacks that share a `prepare_batch` attribute (a function of all of them) get it
    called once before any runs: the task_finished of a batch of tasks reads their
    results in one query, not one each. A callback (or a preparation) that raises is
    logged and the others still run: the outcomes are saved already, and nothing a
    callback does may stop the worker that saved them.
    """
    callbacks: list[Callable[[], None]] = []
    for handle in handles:
        callbacks.extend(handle.after_recorded)
        handle.after_recorded = []
    batches: dict[Callable[[list[Any]], None], list[Any]] = {}
    for callback in callbacks:
        prepare = getattr(callback, "prepare_batch", None)
        if prepare is not None:
            batches.setdefault(prepare, []).append(callback)
    for prepare, batch in batches.items():
        _contained(prepare, batch)
    for callback in callbacks:
        _contained(callback)


def _contained(function: Callable[..., None], *args: Any) -> None:
    try:
        function(*args)
    except BaseException:
        logger.exception("a callback after an outcome was saved raised %r; ignored", function)


class Verdict(Enum):
    """What the worker must still record for a job once its handler has returned."""

    ACK = "ack"  # succeeded: ack with the result
    RETRY = "retry"  # failed: retry after `delay` (or dead-letter if spent)
    FAIL = "fail"  # dead-letter now with the failure as reason
    RECORDED = "recorded"  # the job's completion already committed (fence, transaction mode)
    LOST = "lost"  # the claim is gone: nothing may be recorded
    #: Cancelled while it ran (S32): dead-letter as "cancelled" if the claim is still
    #: current (a transaction held the row when the cancel came), else nothing.
    CANCELLED = "cancelled"


@dataclass(frozen=True, slots=True)
class Outcome:
    """How one run of one job ended."""

    handle: JobHandle
    verdict: Verdict
    duration: float
    result: Any = None
    failure: Failure | None = None
    delay: float | None = None
    #: The attempt was cut at its timeout (S33).
    timed_out: bool = False

    @property
    def ending(self) -> str:
        """How the run ended: SUCCEEDED, RETRIED, DEAD (a failure, a retry of the last
        attempt), CANCELLED or LOST; for a completion the handler recorded itself, what
        it recorded."""
        if self.verdict is Verdict.LOST:
            return LOST
        if self.verdict is Verdict.CANCELLED:
            return CANCELLED
        if self.verdict is Verdict.RECORDED:
            return self.handle.ended or SUCCEEDED
        if self.verdict is Verdict.ACK:
            return SUCCEEDED
        if self.verdict is Verdict.FAIL or self.handle.is_last_attempt:
            return DEAD
        return RETRIED
