"""Exceptions raised by django_pgjobs, the two a handler raises to steer its job, and the
one it raises when its job is cancelled."""

from __future__ import annotations

from django.db import ProgrammingError


class PgJobsError(Exception):
    """A django_pgjobs error. Do not raise directly: raise a subclass."""

    def __init__(self, message: str | None = None) -> None:
        super().__init__(message or (self.__doc__ or "").strip())


class InvalidJobOption(PgJobsError, ValueError):
    """An argument given to django_pgjobs is not valid. Nothing was written."""


class InvalidDependency(InvalidJobOption):
    """An `after=` names no job, a job that left no trace of how it ended (S40), a dead
    letter it cannot wait for, or is no list of jobs."""


class InvalidBatch(InvalidJobOption):
    """A batch (S31) without a callback, a member it cannot take, or an unknown batch."""


class BatchEnded(PgJobsError):
    """Members cannot join a batch that has ended: its callbacks were released (S31)."""


class InvalidQueueName(InvalidJobOption):
    """The queue name is not valid."""


class InvalidKind(InvalidJobOption):
    """The job kind is not valid."""


class InvalidKey(InvalidJobOption):
    """The job key is not valid."""


class InvalidPayload(InvalidJobOption):
    """The payload is not a JSON object that PostgreSQL can store."""


class ResultTooLarge(InvalidPayload):
    """A handler's result is longer than MAX_PAYLOAD_BYTES of JSON."""


class InvalidPriority(InvalidJobOption):
    """The priority is not a whole number between -100 and 100."""


class InvalidSchedule(InvalidJobOption):
    """The run_after or delay is not valid."""


class InvalidCron(InvalidJobOption):
    """A periodic schedule (its cron expression, timezone, on_missed, backfill limit or
    job options) is not valid."""


class InvalidExpiry(InvalidJobOption):
    """The expiry is not a positive duration."""


class InvalidMaxAttempts(InvalidJobOption):
    """max_attempts is not a whole number of at least 1."""


class InvalidLease(InvalidJobOption):
    """The lease is not a duration of at least one second."""


class InvalidConflictMode(InvalidJobOption):
    """on_conflict is not one of 'replace', 'keep_schedule' or 'ignore'."""


class InvalidWorkerId(InvalidJobOption):
    """The worker id is empty or not a string."""


class InvalidClaimSize(InvalidJobOption):
    """The number of jobs to claim is not a whole number."""


class InvalidResultRetention(InvalidJobOption):
    """The result retention is not a non-negative duration."""


class InvalidTimeout(InvalidJobOption):
    """The timeout is not a positive duration."""


class InvalidLimit(InvalidJobOption):
    """A concurrency key, concurrency or rate limit is not valid (S34, S35)."""


class OutsideTransactionWarning(RuntimeWarning):
    """A job went to its queue's own database (PGJOBS["QUEUE_DATABASES"]) while the caller
    was inside a transaction of another database: it does not commit or roll back with
    that transaction. Wrap the enqueue in `transaction.atomic(using=<that database>)`, or
    keep the queue in the database of the writes it belongs with."""


class JobTablesMissing(PgJobsError, ProgrammingError):
    """The database has no job tables, or older ones than this version of django_pgjobs:
    the app's migrations are not applied. Run `python manage.py migrate django_pgjobs`.

    A `django.db.ProgrammingError` too, as the database's own error was."""


class LeaseLost(PgJobsError):
    """This claim is no longer the job's current claim: it lapsed, was cancelled, or was
    superseded by a newer claim. Its writes are refused."""


class JobNotRegistered(PgJobsError):
    """No job is registered under this kind."""


class TaskNotLoaded(PgJobsError):
    """A django.tasks task read from a row whose module this process has not imported:
    its result reads, but it cannot be called or enqueued here."""


class ResultNotJson(PgJobsError):
    """A handler returned a value that cannot be stored as JSON; its job fails at once.

    Raised `from` the encoding error when there is one: a task's error then names that
    error's class, as Django's own backends do.
    """


class Retry(Exception):
    """Raised by a handler to be retried: after `delay` seconds, or after the queue's backoff.

    The attempt still counts: a job whose attempts are spent is dead-lettered with
    "max attempts exceeded", exactly as if the handler had failed.
    """

    def __init__(self, reason: str = "retry requested", *, delay: float | None = None) -> None:
        super().__init__(reason)
        self.reason = reason
        self.delay = delay


class Fail(Exception):
    """Raised by a handler to dead-letter its job at once, with `reason` kept verbatim."""

    def __init__(self, reason: str = "failed") -> None:
        super().__init__(reason)
        self.reason = reason


class Cancelled(PgJobsError):
    """The job was cancelled while it ran (S32): `ctx.raise_if_cancelled()` raises it.

    A handler may let it propagate (the worker then records nothing: the job is already
    a dead letter, "cancelled") or catch it to clean up first. Raised by a handler whose
    job was not cancelled, it dead-letters the job as "cancelled".
    """
