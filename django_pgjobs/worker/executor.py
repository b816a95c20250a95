"""Run one claimed job: resolve its kind, call its handler, classify the outcome.

Lease mode (S20, the default): the handler runs outside any queue transaction and the
outcome goes back to the worker, which records many outcomes in one statement. The
handler may complete its own job inside `ctx.fenced()` (S16); the worker then has
nothing left to record.

Transaction mode (S21, `@job(atomic=True)`): the handler runs inside one transaction that
holds the job row locked; success deletes the row in that transaction, so the handler's
database effects and the completion commit together, exactly once. A failure rolls the
handler's effects back (a savepoint) and records the failure in the same transaction.

Async handlers in lease mode run on the worker's event loop (`run_async`); a
cancellation (S32) cancels their task, a timeout (S33) too.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from dataclasses import replace
from typing import Any

from django.db import DatabaseError, transaction

from django_pgjobs import registry, signals, tracing
from django_pgjobs.claims import Failure, JobHandle, Outcome, Verdict, reason_text
from django_pgjobs.exceptions import (
    Cancelled,
    Fail,
    InvalidPayload,
    InvalidSchedule,
    LeaseLost,
    ResultNotJson,
    ResultTooLarge,
    Retry,
)
from django_pgjobs.logs import job_fields
from django_pgjobs.options import validate_retry_delay
from django_pgjobs.payloads import encode_result
from django_pgjobs.registry import JobDefinition
from django_pgjobs.states import DeadCategory
from django_pgjobs.worker.faults import describe, is_outage, sqlstate

logger = logging.getLogger("django_pgjobs.jobs")


#: SQLSTATE of a statement cancelled by statement_timeout (a transaction-mode timeout).
QUERY_CANCELED = "57014"


def timed_out_error(seconds: float) -> str:
    """The error of an attempt that ran past its timeout (S33)."""
    return f"timed out after {seconds:g} s"


def runs_on_loop(definition: JobDefinition | None) -> bool:
    """Whether a kind's jobs run on the worker's event loop: async, in lease mode."""
    return definition is not None and definition.is_async and not definition.atomic


def unknown_kind_error(kind: str) -> str:
    """The error of a job whose kind this worker has no handler for (S25): what to do."""
    close = registry.closest_kinds(kind)
    guess = f" (did you mean {' or '.join(map(repr, close))}?)" if close else ""
    how = registry.HOW_WORKERS_FIND_KINDS
    return (
        f"unknown job kind '{kind}': this worker has no handler of that name. "
        f"{how[0].upper()}{how[1:]}: a kind defined elsewhere (shop/tasks.py, say) is "
        "known only where something imports its module. After deploying a new kind, "
        f"restart the workers; otherwise check the spelling{guess}."
    )


class Executor:
    """Runs claimed jobs of registered kinds, one at a time, in the calling thread."""

    def __init__(self) -> None:
        self._local = threading.local()

    def run(self, handle: JobHandle) -> Outcome:
        """Run `handle`'s job and return how it ended. Never raises for the job's sake."""
        with tracing.running(handle) as span:
            outcome = self._run(handle)
            span.ended(outcome)
        return outcome

    def _run(self, handle: JobHandle) -> Outcome:
        started = time.monotonic()
        definition, refused = self._prepare(handle, started)
        if definition is None:
            assert refused is not None
            return refused
        if definition.atomic:
            return self._run_atomic(handle, definition, started)
        return self._run_leased(handle, definition, started)

    async def run_async(self, handle: JobHandle) -> Outcome:
        """Run an async lease-mode job's handler as a task of the running event loop.

        A cancellation (S32) cancels the task; past its timeout (S33) the task is
        cancelled and the attempt recorded as timed out. Never raises for the job's sake.
        """
        with tracing.running(handle) as span:
            outcome = await self._run_async(handle)
            span.ended(outcome)
        return outcome

    async def _run_async(self, handle: JobHandle) -> Outcome:
        started = time.monotonic()
        definition, refused = self._prepare(handle, started)
        if definition is None:
            assert refused is not None
            return refused
        args = (handle,) if definition.takes_context else ()
        deadline = None
        try:
            async with asyncio.timeout(handle.timeout_s) as deadline:
                result = await definition.func(*args, **handle.payload)
        except BaseException as error:  # CancelledError too: a job never stops a worker
            if isinstance(error, asyncio.CancelledError):
                task = asyncio.current_task()
                if task is not None:
                    task.uncancel()  # the cancellation was the job's, not the loop's
            if (
                isinstance(error, TimeoutError)
                and deadline is not None
                and deadline.expired()
                and not handle.finished
                and not handle.cancelled
            ):
                return self._timed_out(handle, error, float(handle.timeout_s or 0), started)
            return self._ended(handle, started, error=error)
        return self._ended(handle, started, result=result)

    def _prepare(
        self, handle: JobHandle, started: float
    ) -> tuple[JobDefinition | None, Outcome | None]:
        """The definition to run `handle` with, or the outcome of not running it."""
        definition = registry.get_definition(handle.kind)
        if definition is None:
            # A rolling deploy: an older worker meets a newer kind. Never import a stored
            # path; back off and let a worker that knows the kind take it.
            failure = Failure(unknown_kind_error(handle.kind), category=DeadCategory.UNKNOWN_KIND)
            return None, self._retry(handle, failure, None, started)
        misfit = definition.misfit(handle.payload)  # a row edited by hand may hold any JSON
        if misfit is not None:
            failure = Failure(misfit, category=DeadCategory.PAYLOAD)
            return None, self._finish(handle, Verdict.FAIL, started, failure=failure)
        if handle.cancelled:  # cancelled while it waited for a thread
            return None, self._finish(handle, Verdict.CANCELLED, started)
        if logger.isEnabledFor(logging.DEBUG):
            logger.debug(
                "job start id=%s kind=%s attempt=%s/%s",
                handle.id,
                handle.kind,
                handle.attempt,
                handle.max_attempts,
                extra=job_fields(handle),
            )
        signals.send(signals.job_started, handle.kind, handle=handle)
        return definition, None

    def _run_leased(self, handle: JobHandle, definition: JobDefinition, started: float) -> Outcome:
        try:
            result = self._call(handle, definition)
        except BaseException as error:  # SystemExit and its kin too: a job never stops a worker
            return self._ended(handle, started, error=error)
        return self._ended(handle, started, result=result)

    def _ended(
        self,
        handle: JobHandle,
        started: float,
        *,
        result: Any = None,
        error: BaseException | None = None,
    ) -> Outcome:
        """The outcome of a lease-mode handler that returned `result` or raised `error`."""
        if handle.finished:  # the handler acked, retried or failed its own claim
            return self._finish(handle, Verdict.RECORDED, started)
        if handle.cancelled:  # whatever it did then: the job is cancelled (S32)
            return self._finish(handle, Verdict.CANCELLED, started)
        if error is None:
            try:
                _check_result(result)
            except ResultNotJson as not_json:
                error = not_json
            else:
                return self._finish(handle, Verdict.ACK, started, result=result)
        return self._classify(handle, error, started)

    def _run_atomic(self, handle: JobHandle, definition: JobDefinition, started: float) -> Outcome:
        """Run a transaction-mode job (S21). Its outcome is reported once (signals, log),
        whatever happens to the transaction after (S27): a failure recorded inside it
        whose commit fails is handed to the worker to record instead. A timeout (S33)
        rolls the whole transaction back and is recorded by the worker, at the time of
        the cut (the loop cancels a statement running at the deadline, S39); so is a
        failure whose cause is the connection itself."""
        timeout_s = handle.timeout_s
        reported: Outcome | None = None
        try:
            with transaction.atomic(using=handle.using):
                if not handle.manager.lock_claim(handle):
                    return self._finish(handle, Verdict.LOST, started)
                if timeout_s is not None:  # S33: no statement outlives the timeout
                    handle.manager.limit_statement_time(handle, timeout_s)
                try:
                    # A savepoint: a failure undoes the handler's writes, not the row lock.
                    with transaction.atomic(using=handle.using):
                        result = self._call(handle, definition)
                        if handle.cancelled:
                            raise _Stopped
                        if timeout_s is not None and time.monotonic() - started > timeout_s:
                            raise TimeoutError(timed_out_error(timeout_s))
                        _check_result(result)
                except BaseException as error:
                    outside = self._recorded_outside(handle, error, started)
                    if outside is not None:
                        raise _RecordOutside(outside) from error
                    reported = self._atomic_failure(handle, error, started)
                    _record(reported)
                    if reported.verdict is Verdict.CANCELLED:
                        return reported
                    return _as_recorded(reported)
                handle.manager.ack_batch([handle], [result])
        except _RecordOutside as outside:
            return outside.outcome
        except Cancelled:
            # A cancel request bound the claim (S38): the lock (on entry) or the ack
            # refused it, and the transaction rolled back; the worker dead-letters it.
            if reported is not None:
                return reported
            return self._finish(handle, Verdict.CANCELLED, started)
        except DatabaseError as error:
            if not handle.control.abandoned:  # else its backend was ended on purpose
                logger.warning(
                    "job id=%s kind=%s attempt=%s: transaction mode could not commit: %s",
                    handle.id,
                    handle.kind,
                    handle.attempt,
                    describe(error),
                )
            if reported is not None:
                # Its failure was reported; recording it failed with the transaction:
                # the worker records it outside (a claim no longer current is refused).
                return reported
            if timeout_s is not None and sqlstate(error) == QUERY_CANCELED:
                # The worker cut the transaction's last statements at the deadline.
                return self._timed_out(handle, error, timeout_s, started)
            if is_outage(error):
                # The connection broke, say: nothing of this run stands, and the claim
                # comes back after its lease.
                return self._finish(handle, Verdict.LOST, started)
            # The database refused the transaction's data (a deferred constraint of the
            # handler's writes at commit, say): nothing of it stands, and the claim is
            # still current, so the attempt is recorded as failed, outside it (S27).
            failure = Failure.from_exception(
                error, text=f"the transaction could not commit: {describe(error)}"
            )
            return self._retry(handle, failure, None, started)
        finally:
            handle.control.backend = None
        return _as_recorded(self._finish(handle, Verdict.ACK, started, result=result))

    def _recorded_outside(
        self, handle: JobHandle, error: BaseException, started: float
    ) -> Outcome | None:
        """The outcome of a transaction-mode attempt that its transaction cannot record:
        a timeout (S33, S39: its statement cut, or its handler past the deadline), or a
        failure of the connection itself, with the real cause (S27). None: recorded
        inside, as any other failure."""
        if handle.cancelled:
            return None
        timeout_s = handle.timeout_s
        if timeout_s is not None and (
            sqlstate(error) == QUERY_CANCELED or time.monotonic() - started > timeout_s
        ):
            return self._timed_out(handle, error, timeout_s, started)
        if is_outage(error):
            return self._retry(handle, Failure.from_exception(error), None, started)
        return None

    def _atomic_failure(self, handle: JobHandle, error: BaseException, started: float) -> Outcome:
        """The outcome of a transaction-mode handler whose savepoint was rolled back."""
        if handle.cancelled:
            return self._finish(handle, Verdict.CANCELLED, started)
        return self._classify(handle, error, started)

    def _classify(self, handle: JobHandle, error: BaseException, started: float) -> Outcome:
        if isinstance(error, LeaseLost):
            return self._finish(handle, Verdict.LOST, started)
        if isinstance(error, Cancelled):  # raised by a handler whose job was not cancelled
            failure = Failure.from_exception(
                error, text="cancelled", category=DeadCategory.CANCELLED
            )
            return self._finish(handle, Verdict.FAIL, started, failure=failure)
        if isinstance(error, Retry):
            return self._retry_raised(handle, error, started)
        if isinstance(error, Fail):
            text = reason_text(error.reason, "failed")
            failure = Failure.from_exception(error, text=text, category=DeadCategory.FAILED)
            return self._finish(handle, Verdict.FAIL, started, failure=failure)
        if isinstance(error, ResultNotJson):
            # The encoding error itself, when there is one, is what the failure names
            # (its class and traceback), as Django's backends name it; the reason stays
            # "result is not JSON: ...".
            cause = error.__cause__
            named = cause if isinstance(cause, Exception) else error
            failure = Failure.from_exception(
                named, text=str(error), category=DeadCategory.UNSTORABLE
            )
            return self._finish(handle, Verdict.FAIL, started, failure=failure)
        return self._retry(handle, Failure.from_exception(error), None, started)

    def _retry_raised(self, handle: JobHandle, error: Retry, started: float) -> Outcome:
        """A handler raised Retry: after its delay, or the backoff when it gives none.

        A delay in the past means now. One that is no duration at all (NaN, a century,
        a string) is the handler's bug: the backoff is used, and the error says so (S27).
        """
        reason = reason_text(error.reason, "retry requested")
        try:
            delay = validate_retry_delay(error.delay)
        except InvalidSchedule as problem:
            delay = None
            reason = f"{reason} ({problem} The queue's backoff was used instead.)"
        failure = Failure.from_exception(error, text=reason)
        return self._retry(handle, failure, delay, started)

    def _call(self, handle: JobHandle, definition: JobDefinition) -> Any:
        args = (handle,) if definition.takes_context else ()
        if definition.is_async:
            return self._event_loop().run_until_complete(definition.func(*args, **handle.payload))
        return definition.func(*args, **handle.payload)

    def _event_loop(self) -> asyncio.AbstractEventLoop:
        loop: asyncio.AbstractEventLoop | None = getattr(self._local, "loop", None)
        if loop is None or loop.is_closed():
            loop = asyncio.new_event_loop()
            self._local.loop = loop
        return loop

    def close(self) -> None:
        """Close this thread's event loop, if it made one."""
        loop = getattr(self._local, "loop", None)
        if loop is not None and not loop.is_closed():
            loop.close()

    def _timed_out(
        self, handle: JobHandle, error: BaseException, timeout_s: float, started: float
    ) -> Outcome:
        """The outcome of an attempt cut at its timeout (S33): retried with backoff."""
        failure = Failure.from_exception(error, text=timed_out_error(timeout_s))
        return self._retry(handle, failure, None, started, timed_out=True)

    def _retry(
        self,
        handle: JobHandle,
        failure: Failure,
        delay: float | None,
        started: float,
        *,
        timed_out: bool = False,
    ) -> Outcome:
        if handle.is_last_attempt or delay is None:
            delay = retry_delay(handle)
        return self._finish(
            handle, Verdict.RETRY, started, failure=failure, delay=delay, timed_out=timed_out
        )

    def _finish(
        self,
        handle: JobHandle,
        verdict: Verdict,
        started: float,
        *,
        result: Any = None,
        failure: Failure | None = None,
        delay: float | None = None,
        timed_out: bool = False,
    ) -> Outcome:
        outcome = Outcome(
            handle=handle,
            verdict=verdict,
            duration=time.monotonic() - started,
            result=result,
            failure=failure,
            delay=delay,
            timed_out=timed_out,
        )
        report(outcome)
        return outcome


class _Stopped(BaseException):
    """Rolls a cancelled transaction-mode handler's savepoint back (S32)."""


class _RecordOutside(Exception):
    """Rolls a transaction-mode job's whole transaction back; the worker records
    `outcome` outside it."""

    def __init__(self, outcome: Outcome) -> None:
        super().__init__(outcome.verdict.value)
        self.outcome = outcome


def _check_result(result: Any) -> None:
    try:
        encode_result(result)
    except ResultTooLarge as error:
        raise ResultNotJson(str(error)) from None
    except InvalidPayload as error:
        raise ResultNotJson(f"result is not JSON: {error}") from None
    except Exception as error:  # a hostile value: a dict whose items() raises, say
        raise ResultNotJson(f"result is not JSON: {describe(error)}") from None


def _record(outcome: Outcome) -> None:
    """Record a failed or cancelled run inside transaction mode's own transaction."""
    handle = outcome.handle
    if outcome.verdict is Verdict.CANCELLED:
        handle.manager.fail_batch([(handle, cancellation_of(handle))])
    elif outcome.verdict is Verdict.RETRY and outcome.failure is not None:
        handle.manager.retry_batch([(handle, outcome.failure, outcome.delay)])
    elif outcome.verdict is Verdict.FAIL and outcome.failure is not None:
        handle.manager.fail_batch([(handle, outcome.failure)])


def cancellation_of(handle: JobHandle) -> Failure:
    """The dead letter's reason of a job cancelled while it ran (S32)."""
    return Failure(handle.control.reason or "cancelled", category=DeadCategory.CANCELLED)


def _as_recorded(outcome: Outcome) -> Outcome:
    return replace(outcome, verdict=Verdict.RECORDED)


def retry_delay(handle: JobHandle) -> float:
    """The backoff before `handle`'s job runs again (0: its attempts are spent)."""
    if handle.is_last_attempt:
        return 0.0
    return float(registry.backoff_for(handle.kind, handle.queue).delay(handle.attempt))


def report(outcome: Outcome) -> None:
    """Log how a run ended and send its signals, once a run: a handler that returns
    after the worker abandoned it at its timeout is not told twice (S27, S33)."""
    if outcome.handle.control.tell_end():
        _log(outcome)
        signals.run_ended(outcome)


def _log(outcome: Outcome) -> None:
    """Log how a run ended (with the job's fields, for `runjobs --log-format json`)."""
    handle = outcome.handle
    error = outcome.failure.error if outcome.failure else None
    args: tuple[Any, ...]
    if outcome.verdict in (Verdict.ACK, Verdict.RECORDED):
        level, text, args = logging.INFO, "job done %s", ()
    elif outcome.verdict is Verdict.CANCELLED:
        level, text = logging.WARNING, "job cancelled %s reason=%r"
        args = (handle.control.reason or "cancelled",)
    elif outcome.verdict is Verdict.LOST:
        level, args = logging.WARNING, ()
        text = "job lost %s: the claim lapsed or was taken over; nothing recorded"
    elif outcome.verdict is Verdict.FAIL:
        level, text, args = logging.ERROR, "job dead %s reason=%r", (error or "failed",)
    elif handle.is_last_attempt:
        level, args = logging.ERROR, (error,)
        text = "job dead %s reason='max attempts exceeded' error=%r"
    else:
        level, text = logging.WARNING, "job failed %s retry_in=%ss error=%r"
        args = (f"{outcome.delay:g}", error)
    if not logger.isEnabledFor(level):
        return
    where = (
        f"id={handle.id} kind={handle.kind} attempt={handle.attempt}/{handle.max_attempts} "
        f"duration={outcome.duration:.3f}s"
    )
    logger.log(level, text, where, *args, extra=job_fields(handle, outcome))
