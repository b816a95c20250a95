"""Signals about jobs, for metrics, tracing and anything else a project wants to hook in.

Every signal's sender is the job's kind (a string). Receivers run in the thread that sends
(the enqueuing request, or the worker's handler thread): keep them quick. A receiver that
raises is logged and ignored; it never fails an enqueue or a job.

- `job_enqueued(kind, job_id, queue, inserted)`: after the enqueue statement, inside the
  caller's transaction (wrap work in `transaction.on_commit` if it must see the commit).
  `inserted` is False when the job was merged into a live one by its key.
- `job_started(kind, handle)`: the worker is about to call the handler.
- `job_finished(kind, handle, outcome, duration, error)`: the run ended; `outcome` is
  "succeeded", "retried", "dead", "cancelled" (the job was cancelled while it ran, S32)
  or "lost" (the claim lapsed or was taken over: nothing of the run was recorded). Sent
  as the worker decides, before the outcome is committed with others in a batch.
- `job_dead(kind, handle, reason, error)`: the run ended the job: it goes to the dead
  letters with `reason`.
"""

from __future__ import annotations

import logging
from typing import Any

from django.dispatch import Signal

from django_pgjobs.claims import (
    CANCELLED,
    DEAD,
    LOST,
    MAX_ATTEMPTS_EXCEEDED,
    RETRIED,
    SUCCEEDED,
    Outcome,
    Verdict,
)

logger = logging.getLogger("django_pgjobs.signals")

#: One string object per kind a receiver was connected for (see KindSignal).
_KINDS: dict[str, str] = {}


class KindSignal(Signal):
    """A signal whose sender is a job's kind, matched by its value.

    Django matches a sender by identity (`id()`), and two equal strings are often two
    objects: a kind read from a row is never the literal a receiver was connected with.
    Every string sender is replaced by one object per kind, on both sides.
    """

    def connect(
        self, receiver: Any, sender: Any = None, weak: bool = True, dispatch_uid: Any = None
    ) -> None:
        if isinstance(sender, str):
            sender = _KINDS.setdefault(sender, sender)
        super().connect(receiver, sender, weak, dispatch_uid)

    def disconnect(
        self, receiver: Any = None, sender: Any = None, dispatch_uid: Any = None
    ) -> bool:
        return super().disconnect(receiver, _kind(sender), dispatch_uid)

    def has_listeners(self, sender: Any = None) -> bool:
        return super().has_listeners(_kind(sender))

    def send(self, sender: Any, **named: Any) -> list[tuple[Any, Any]]:
        return super().send(_kind(sender), **named)

    def send_robust(self, sender: Any, **named: Any) -> list[tuple[Any, Any]]:
        return super().send_robust(_kind(sender), **named)

    async def asend(self, sender: Any, **named: Any) -> list[tuple[Any, Any]]:
        return await super().asend(_kind(sender), **named)

    async def asend_robust(self, sender: Any, **named: Any) -> list[tuple[Any, Any]]:
        return await super().asend_robust(_kind(sender), **named)


def _kind(sender: Any) -> Any:
    return _KINDS.get(sender, sender) if isinstance(sender, str) else sender


job_enqueued = KindSignal()
job_started = KindSignal()
job_finished = KindSignal()
job_dead = KindSignal()

__all__ = [
    "CANCELLED",
    "DEAD",
    "LOST",
    "MAX_ATTEMPTS_EXCEEDED",
    "RETRIED",
    "SUCCEEDED",
    "job_dead",
    "job_enqueued",
    "job_finished",
    "job_started",
    "outcome_of",
    "run_ended",
    "send",
]


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
    ended = outcome.ending
    if ended != DEAD:
        return ended, None
    if outcome.verdict is Verdict.RECORDED:  # the handler completed its claim itself
        return DEAD, outcome.handle.dead_reason or "failed"
    if outcome.verdict is Verdict.FAIL:
        return DEAD, outcome.failure.error if outcome.failure else "failed"
    return DEAD, MAX_ATTEMPTS_EXCEEDED


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
