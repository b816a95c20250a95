"""Signals about jobs, for metrics, tracing and anything else a project wants to hook in.

Every signal's sender is the job's kind (a string). Receivers run in the thread that sends
(the enqueuing request, or the worker's handler thread): keep them quick. A receiver that
raises is logged and ignored; it never fails an enqueue or a job.

- `job_enqueued(kind, job_id, queue, inserted)`: after the enqueue statement, inside the
  caller's transaction (wrap work in `transaction.on_commit` if it must see the commit).
  `inserted` is False when the job was merged into a live one by its key.
- `job_started(kind, handle)`: the worker is about to call the handler.
- `job_finished(kind, handle, outcome, duration, error)`: the run ended; `outcome` is
  "succeeded", "retried", "dead" or "lost" (the claim lapsed or was taken over: nothing
  of the run was recorded). Sent as the worker decides, before the outcome is committed
  with others in a batch.
- `job_dead(kind, handle, reason, error)`: the run ended the job: it goes to the dead
  letters with `reason`.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

from django.dispatch import Signal

if TYPE_CHECKING:
    from django_pgjobs.executor import Outcome

logger = logging.getLogger("django_pgjobs.signals")

job_enqueued = Signal()
job_started = Signal()
job_finished = Signal()
job_dead = Signal()

SUCCEEDED, RETRIED, DEAD, LOST = "succeeded", "retried", "dead", "lost"
MAX_ATTEMPTS_EXCEEDED = "max attempts exceeded"


def send(signal: Signal, kind: str, **kwargs: Any) -> None:
    """Send `signal` from `kind` if anyone listens; log (never raise) a receiver's error."""
    if not signal.has_listeners(kind):
        return
    for receiver, response in signal.send_robust(kind, **kwargs):
        if isinstance(response, Exception):
            logger.error(
                "receiver %r of a django_pgjobs signal raised %r", receiver, response, exc_info=True
            )


def outcome_of(outcome: Outcome) -> tuple[str, str | None]:
    """How a run ended, for the signals: (outcome, the dead letter's reason or None)."""
    from django_pgjobs.executor import Verdict

    handle, verdict = outcome.handle, outcome.verdict
    if verdict is Verdict.LOST:
        return LOST, None
    if verdict is Verdict.RECORDED:  # the handler completed its claim itself
        ended = handle.ended or SUCCEEDED
        return ended, (ended == DEAD and (handle.dead_reason or "failed")) or None
    if verdict is Verdict.ACK:
        return SUCCEEDED, None
    if verdict is Verdict.FAIL:
        return DEAD, outcome.failure.error if outcome.failure else "failed"
    if handle.attempt >= handle.max_attempts:
        return DEAD, MAX_ATTEMPTS_EXCEEDED
    return RETRIED, None


def run_ended(outcome: Outcome) -> None:
    """Send job_finished, and job_dead when the run ended the job."""
    kind = outcome.handle.kind
    if not (job_finished.has_listeners(kind) or job_dead.has_listeners(kind)):
        return
    ended, reason = outcome_of(outcome)
    error = outcome.failure.error if outcome.failure else None
    send(
        job_finished,
        kind,
        handle=outcome.handle,
        outcome=ended,
        duration=outcome.duration,
        error=error,
    )
    if ended == DEAD:
        send(job_dead, kind, handle=outcome.handle, reason=reason, error=error)
