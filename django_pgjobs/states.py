"""The states a live job moves through. Dead is a table (`pgjobs_dead`), not a state."""

from __future__ import annotations

from django.db import models


class JobState(models.TextChoices):
    """Where a row of `pgjobs_job` stands, and who moves it."""

    WAITING = "waiting", "Waiting"
    """Waiting for its parents (S29): not claimable, in no claim index. In: enqueue with
    `after=` while a parent has not ended; a requeued parent bringing back the dependents
    its death took (S30). Out: the statement that records its last parent's end (to
    pending); a parent's death (to the dead table, "dependency failed: <id>"); cancel."""

    PENDING = "pending", "Pending"
    """Waiting to run. In: enqueue; the end of its last parent (S29); a retry; a key's
    trigger promoted after a run; a claim handed back at shutdown; a dead letter requeued.
    Out: a claim (to running) once `run_after` has passed; the sweeper (to the dead table)
    once `expires_at` has passed; cancel (deleted)."""

    RUNNING = "running", "Running"
    """Claimed: `claimed_by` holds the claim's token and `claimed_until` its lease. In: a claim.
    Out: ack (deleted, or to done); retry (to pending); fail or spent attempts (to the dead
    table); a lapsed lease (claimable again, or dead-lettered when no attempts are left);
    cancel (deleted)."""

    DONE = "done", "Done"
    """Finished, kept only while result retention is on for the job. In: ack. Out: the
    sweeper deletes it when its retention ends (`purge_at`)."""


LIVE_STATES = (JobState.PENDING, JobState.RUNNING)
#: The states of a job that has not ended: what a child waits for (S29).
UNFINISHED_STATES = (JobState.WAITING, JobState.PENDING, JobState.RUNNING)


class DeadCategory(models.TextChoices):
    """Why a dead letter died, stored with it (`pgjobs_dead.category`): a bounded list
    for the admin's filter, whatever text its reason holds (S15 keeps that verbatim).

    Written by the statement that moves the job to the dead table. The one writer that
    names no category is the workflows' `pgjobs_end_parents` function, whose letters'
    reasons read "dependency failed: <id>": see `DeadJob.category`."""

    FAILED = "failed", "failed"
    """The handler gave up: it raised `Fail` (any message) or called `ctx.fail()`."""

    MAX_ATTEMPTS = "max_attempts", "max attempts exceeded"
    """The last attempt failed, or its lease lapsed, with no attempt left (S9, S13, S33)."""

    EXPIRED = "expired", "expired"
    """Swept past its `expires_at` (S24)."""

    CANCELLED = "cancelled", "cancelled"
    """Cancelled by an operator (`cancel_many`, the admin), whatever reason was given;
    a cancel request that bound a running claim (S38); or a handler raised `Cancelled`."""

    DEPENDENCY = "dependency", "dependency failed"
    """A parent died or was cancelled, and took its dependents with it (S30)."""

    PAYLOAD = "payload", "payload does not fit"
    """Its payload cannot be the handler's arguments (a row edited by hand, S28)."""

    UNKNOWN_KIND = "unknown_kind", "unknown kind"
    """Its attempts ran out on workers that have no handler of its kind (S25): the last
    attempt's error is "unknown job kind '<kind>'", the reason "max attempts exceeded"."""

    UNSTORABLE = "unstorable", "outcome not storable"
    """What the handler returned or raised could not be stored: a result that is not
    JSON, or data the database refused (S27)."""


class WorkerAsk(models.TextChoices):
    """What an operator asked of a worker (`pgjobs_worker.asked`, from the console),
    obeyed at the worker's next heartbeat."""

    QUIET = "quiet", "quiet: claim no more jobs, finish the running ones"
    STOP = "stop", "stop: claim no more, finish the running jobs, exit"
