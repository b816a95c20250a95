"""OpenTelemetry traces across an enqueue and the runs it makes (the `otel` extra).

An enqueue inside a trace is a PRODUCER span, `send <queue>`, and its W3C trace context
(`traceparent`, `tracestate`) is kept in the job's row by the enqueue's own statement: no
round trip more. Each run of the job is a CONSUMER span, `process <queue>`, linked to
that context; a run straight after its enqueue (the first attempt of a job that was not
scheduled for later) is also its child, so that one trace reads request → send →
process. What a run ended as is on its span (`pgjobs.job.outcome`), with an event for a
retry, a dead letter, a cancel, a timeout or a lost lease. The run's span is the current
one while its handler runs, so what the handler enqueues (a workflow's next job, a
batch's members) carries the trace on; a batch's callbacks carry the context of the
batch's writing.

Attributes follow OpenTelemetry's semantic conventions for messaging (1.27 and later):
`messaging.system` "django_pgjobs", `messaging.operation.type` and `.name`,
`messaging.destination.name` (the queue), `messaging.message.id` (the job's id),
`messaging.batch.message_count`, `error.type`; and `pgjobs.job.kind`,
`pgjobs.job.attempt`, `pgjobs.job.max_attempts`, `pgjobs.job.outcome`.

Nothing here imports OpenTelemetry until it is asked to trace, and nothing is done
without its API installed, with PGJOBS["TRACING"] False, or with no tracer provider set
by the project (the API's default makes spans nobody records): then every call returns
an object that does nothing.
"""

from __future__ import annotations

import json
import logging
import threading
import time
import types
from collections.abc import Mapping, Sequence
from importlib import metadata
from typing import TYPE_CHECKING, Any

from django_pgjobs.conf import pgjobs_settings

if TYPE_CHECKING:
    from django_pgjobs.claims import JobHandle, Outcome

logger = logging.getLogger("django_pgjobs.worker")

#: `messaging.system`: not one of the conventions' well-known values, as they allow.
SYSTEM = "django_pgjobs"
#: The instrumentation scope's name.
SCOPE = "django_pgjobs"
#: The keys of a stored trace context, and the most characters each may hold: a
#: traceparent is 55, a tracestate at most 512 by the W3C recommendation.
CONTEXT_KEYS = {"traceparent": 55, "tracestate": 512}

#: How long a process that found no tracer provider takes that answer as good: a
#: provider is set once, at a process's start, and a job must not pay to ask again.
NO_PROVIDER_RECHECK_S = 1.0

_api: Any = None  # the OpenTelemetry modules once imported; False: not installed
_tracer_of: tuple[Any, Any] | None = None  # (provider, its tracer)
_no_provider_until = 0.0  # time.monotonic() until which no provider is taken as known


def _otel() -> Any:
    """The OpenTelemetry API's modules, imported once; False when it is not installed."""
    global _api
    if _api is None:
        try:
            from opentelemetry import context, trace
            from opentelemetry.trace.propagation.tracecontext import (
                TraceContextTextMapPropagator,
            )
        except ImportError:
            _api = False
        else:
            _api = types.SimpleNamespace(
                context=context, trace=trace, propagator=TraceContextTextMapPropagator()
            )
    return _api


def tracer() -> Any | None:
    """The tracer spans are made with; None when tracing is off: the API is not
    installed, PGJOBS["TRACING"] is False, or the project set no tracer provider."""
    global _tracer_of, _no_provider_until
    api = _otel()
    if not api or not pgjobs_settings.TRACING:
        return None
    if _tracer_of is not None:  # a provider, once set, is the process's for good
        return _tracer_of[1]
    now = time.monotonic()
    if now < _no_provider_until:
        return None
    try:
        provider = api.trace.get_tracer_provider()
        if not isinstance(provider, (api.trace.ProxyTracerProvider, api.trace.NoOpTracerProvider)):
            _tracer_of = (provider, provider.get_tracer(SCOPE, _scope_version()))
            return _tracer_of[1]
    except Exception as error:
        _failed("finding the tracer provider", error)
    _no_provider_until = now + NO_PROVIDER_RECHECK_S
    return None


def _scope_version() -> str | None:
    """The package's version, for the instrumentation scope (read here, not from the
    package's root, which imports the models: no import cycle through this module)."""
    try:
        return metadata.version("django-pgjobs")
    except metadata.PackageNotFoundError:  # running from a source tree
        return None


def current_ids() -> tuple[str, str] | None:
    """The current span's trace and span ids in W3C hex (the JSON logs' trace_id and
    span_id); None outside a span, or without the API."""
    api = _otel()
    if not api:
        return None
    context = api.trace.get_current_span().get_span_context()
    if not context.is_valid:
        return None
    return f"{context.trace_id:032x}", f"{context.span_id:016x}"


# What tracing must never do is change a job: a tracer, a span processor or an
# exporter of the project that raises is logged (once a process) and the span let go.

_warned = False


def _failed(what: str, error: BaseException) -> None:
    global _warned
    if not _warned:
        _warned = True
        logger.warning(
            "tracing: %s failed (%s: %s); the job goes on without its span (said once a process)",
            what,
            type(error).__name__,
            error,
        )


# Enqueues ------------------------------------------------------------------------


def stored_context() -> str | None:
    """The trace context an enqueue's statement stores with its jobs (%(trace)s): the
    current span's, as the JSON text of {"traceparent", "tracestate"}; None with
    tracing off or outside a trace."""
    if tracer() is None:
        return None
    api = _api
    try:
        if not api.trace.get_current_span().get_span_context().is_valid:
            return None
        carrier: dict[str, str] = {}
        api.propagator.inject(carrier)
    except Exception as error:
        _failed("reading the trace context of an enqueue", error)
        return None
    return json.dumps(carrier) if carrier else None


class NotSending:
    """An enqueue outside a trace, or with tracing off: no span."""

    def __enter__(self) -> NotSending:
        return self

    def __exit__(self, *exc: object) -> None:
        return None

    def sent(self, queues: Sequence[str], ids: Sequence[int]) -> None:
        return None


NOT_SENDING = NotSending()


class Sending(NotSending):
    """An enqueue's PRODUCER span, current while it writes: its jobs keep its context."""

    def __init__(self, api: Any, tracer: Any, count: int) -> None:
        self._api = api
        self._tracer = tracer
        self._count = count
        self._span: Any = None
        self._using: Any = None

    def __enter__(self) -> Sending:
        attributes: dict[str, Any] = {
            "messaging.system": SYSTEM,
            "messaging.operation.type": "send",
            "messaging.operation.name": "send",
        }
        if self._count != 1:
            attributes["messaging.batch.message_count"] = self._count
        try:
            self._span = self._tracer.start_span(
                "send", kind=self._api.trace.SpanKind.PRODUCER, attributes=attributes
            )
            self._using = self._api.trace.use_span(self._span, end_on_exit=True)
            self._using.__enter__()
        except Exception as error:
            _failed("starting an enqueue's span", error)
            self._span = self._using = None
        return self

    def __exit__(self, *exc: Any) -> None:
        if self._using is None:
            return
        try:
            self._using.__exit__(*exc)
        except Exception as error:
            _failed("ending an enqueue's span", error)

    def sent(self, queues: Sequence[str], ids: Sequence[int]) -> None:
        """Name the span after the queue its jobs went to (when they went to one), and
        the job when there is one."""
        if self._span is None:
            return
        try:
            names = set(queues)
            if len(names) == 1:
                (queue,) = names
                self._span.update_name(f"send {queue}")
                self._span.set_attribute("messaging.destination.name", queue)
            if len(ids) == 1:
                self._span.set_attribute("messaging.message.id", str(ids[0]))
        except Exception as error:
            _failed("naming an enqueue's span", error)


def sending(count: int = 1) -> NotSending:
    """The span of an enqueue of `count` jobs, to enter around its write: a Sending
    inside a trace with tracing on, otherwise NOT_SENDING (no span, no context kept:
    an enqueue outside any trace starts none)."""
    traced = tracer()
    if traced is None:
        return NOT_SENDING
    api = _api
    if not api.trace.get_current_span().get_span_context().is_valid:
        return NOT_SENDING
    return Sending(api, traced, count)


# Runs ----------------------------------------------------------------------------


class NotRunning:
    """A run with tracing off: no span."""

    def __enter__(self) -> NotRunning:
        return self

    def __exit__(self, *exc: object) -> None:
        return None

    def ended(self, outcome: Outcome) -> None:
        return None


NOT_RUNNING = NotRunning()


class Run(NotRunning):
    """A run's CONSUMER span, current while its handler runs. Its handler's thread ends
    it, or the worker's loop when it abandons the handler at its timeout: whichever
    comes first, under a lock."""

    def __init__(self, api: Any, tracer: Any, handle: JobHandle) -> None:
        self._api = api
        self._tracer = tracer
        self._handle = handle
        self._span: Any = None
        self._using: Any = None
        self._lock = threading.Lock()
        self._closed = False

    def __enter__(self) -> Run:
        try:
            self._start()
        except Exception as error:
            _failed("starting a run's span", error)
            self._closed = True
        return self

    def _start(self) -> None:
        api, handle = self._api, self._handle
        origin = origin_of(handle.trace_context)
        links = []
        parent = None
        if origin is not None:
            links.append(api.trace.Link(origin))
            if handle.attempt == 1 and handle.run_after <= handle.created_at:
                # Run straight after its enqueue: a child of it, in its trace.
                parent = api.trace.set_span_in_context(api.trace.NonRecordingSpan(origin))
        self._span = self._tracer.start_span(
            f"process {handle.queue}",
            context=parent if parent is not None else api.context.Context(),
            kind=api.trace.SpanKind.CONSUMER,
            links=links,
            attributes={
                "messaging.system": SYSTEM,
                "messaging.operation.type": "process",
                "messaging.operation.name": "process",
                "messaging.destination.name": handle.queue,
                "messaging.message.id": str(handle.id),
                "pgjobs.job.kind": handle.kind,
                "pgjobs.job.attempt": handle.attempt,
                "pgjobs.job.max_attempts": handle.max_attempts,
            },
        )
        self._using = api.trace.use_span(
            self._span, end_on_exit=False, record_exception=False, set_status_on_exception=False
        )
        self._using.__enter__()
        handle.control.trace = self

    def __exit__(self, *exc: Any) -> None:
        try:
            if self._using is not None:
                self._using.__exit__(*exc)
        except Exception as error:
            _failed("leaving a run's span", error)
        with self._lock:
            self._close()

    def ended(self, outcome: Outcome) -> None:
        """Record how the run ended: its outcome, and an event for anything but a success."""
        with self._lock:
            if self._closed:
                return
            try:
                self._record(outcome)
            except Exception as error:
                _failed("recording a run's outcome on its span", error)

    def _record(self, outcome: Outcome) -> None:
        from django_pgjobs.claims import CANCELLED, DEAD, LOST, RETRIED

        span = self._span
        ending = outcome.ending
        span.set_attribute("pgjobs.job.outcome", ending)
        failure = outcome.failure
        if failure is not None:
            attributes = {"exception.message": failure.error}
            if failure.exception:
                attributes["exception.type"] = failure.exception
            if failure.traceback:
                attributes["exception.stacktrace"] = failure.traceback
            span.add_event("exception", attributes)
        if outcome.timed_out:
            span.add_event("pgjobs.timeout", {"pgjobs.timeout_s": self._handle.timeout_s or 0.0})
        if ending == RETRIED:
            span.add_event("pgjobs.retry", {"pgjobs.retry.delay_s": float(outcome.delay or 0)})
        elif ending == DEAD:
            reason = failure.error if failure is not None else self._handle.dead_reason
            span.add_event("pgjobs.dead_letter", {"pgjobs.dead_letter.reason": reason or "dead"})
        elif ending == CANCELLED:
            reason = self._handle.control.reason or "cancelled"
            span.add_event("pgjobs.cancelled", {"pgjobs.cancel.reason": reason})
        elif ending == LOST:
            span.add_event("pgjobs.lease_lost")
        if ending in (RETRIED, DEAD, LOST):
            error_type = (failure.exception if failure is not None else None) or ending
            span.set_attribute("error.type", error_type)
            description = failure.error if failure is not None else ending
            span.set_status(self._api.trace.Status(self._api.trace.StatusCode.ERROR, description))

    def timed_out(self, seconds: float) -> None:
        """The worker abandoned the handler at its timeout (S33): the span ends now,
        whatever the handler's thread does later."""
        with self._lock:
            if self._closed:
                return
            try:
                span = self._span
                span.add_event("pgjobs.timeout", {"pgjobs.timeout_s": seconds})
                span.set_attribute("pgjobs.job.outcome", "timed_out")
                span.set_attribute("error.type", "timeout")
                span.set_status(
                    self._api.trace.Status(
                        self._api.trace.StatusCode.ERROR, f"timed out after {seconds:g} s"
                    )
                )
            except Exception as error:
                _failed("recording a timeout on a run's span", error)
            self._close()

    def _close(self) -> None:
        """End the span once (the caller holds the lock)."""
        if self._closed:
            return
        self._closed = True
        try:
            self._span.end()
        except Exception as error:
            _failed("ending a run's span", error)


def running(handle: JobHandle) -> NotRunning:
    """The span of one run of `handle`'s job, to enter around its handler: a Run with
    tracing on, otherwise NOT_RUNNING."""
    traced = tracer()
    if traced is None:
        return NOT_RUNNING
    return Run(_api, traced, handle)


def timed_out(handle: JobHandle, seconds: float) -> None:
    """End the span of a run its worker abandoned at its timeout, if it has one."""
    run = handle.control.trace
    if isinstance(run, Run):
        run.timed_out(seconds)


def origin_of(stored: object) -> Any | None:
    """The span context a stored trace context names; None for anything else (a row
    edited by hand may hold any JSON: it is read as no context, never an error)."""
    if not isinstance(stored, Mapping):
        return None
    carrier: dict[str, str] = {}
    for key, most in CONTEXT_KEYS.items():
        value = stored.get(key)
        if isinstance(value, str) and len(value) <= most and value.isascii():
            carrier[key] = value
    if "traceparent" not in carrier:
        return None
    api = _api
    try:
        context = api.propagator.extract(carrier)
        origin = api.trace.get_current_span(context).get_span_context()
    except Exception:  # the propagator's own parsing, on hostile text
        return None
    return origin if origin.is_valid else None
