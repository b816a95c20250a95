"""An OpenTelemetry SDK for the suite: spans kept in memory while a test asks for them
(the `spans` fixture), or written to a file by a `runjobs` subprocess
(PGJOBS_TEST_SPANS_FILE), read back as plain dicts.

A process has one tracer provider for good, so it is set once; its processor keeps
spans only while a test captures them.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from opentelemetry import trace
from opentelemetry.sdk.trace import ReadableSpan, SpanProcessor, TracerProvider

from django_pgjobs import tracing


class Capture(SpanProcessor):
    """Keeps the spans that end while `capturing`; drops the others."""

    def __init__(self) -> None:
        self.capturing = False
        #: Raise from on_start and on_end, as a broken processor or exporter would.
        self.broken = False
        self._lock = threading.Lock()
        self._spans: list[ReadableSpan] = []

    def on_start(self, span: Any, parent_context: Any = None) -> None:
        if self.broken:
            raise RuntimeError("the exporter is down")

    def on_end(self, span: ReadableSpan) -> None:
        if self.broken:
            raise RuntimeError("the exporter is down")
        with self._lock:
            if self.capturing:
                self._spans.append(span)

    def start(self) -> None:
        with self._lock:
            self._spans = []
            self.capturing = True

    def stop(self) -> None:
        with self._lock:
            self.capturing = False
            self.broken = False
            self._spans = []

    def spans(self) -> list[dict[str, Any]]:
        with self._lock:
            return [as_dict(span) for span in self._spans]


class ToFile(SpanProcessor):
    """Appends each span that ends to a file, one JSON object a line."""

    def __init__(self, path: str) -> None:
        self.path = Path(path)
        self._lock = threading.Lock()

    def on_end(self, span: ReadableSpan) -> None:
        line = json.dumps(as_dict(span))
        with self._lock, self.path.open("a") as file:
            file.write(line + "\n")


def as_dict(span: ReadableSpan) -> dict[str, Any]:
    """What a test asserts on: ids in W3C hex, attributes and events as plain data."""
    context = span.get_span_context()
    assert context is not None
    return {
        "name": span.name,
        "kind": span.kind.name,
        "trace_id": f"{context.trace_id:032x}",
        "span_id": f"{context.span_id:016x}",
        "parent_id": None if span.parent is None else f"{span.parent.span_id:016x}",
        "links": [
            {"trace_id": f"{link.context.trace_id:032x}", "span_id": f"{link.context.span_id:016x}"}
            for link in span.links
        ],
        "attributes": dict(span.attributes or {}),
        "events": [
            {"name": event.name, "attributes": dict(event.attributes or {})}
            for event in span.events
        ],
        "status": span.status.status_code.name,
        "description": span.status.description,
        "scope": span.instrumentation_scope.name if span.instrumentation_scope else None,
    }


_capture: Capture | None = None


def capture() -> Capture:
    """The process's capture, its tracer provider set the first time."""
    global _capture
    if _capture is None:
        _capture = Capture()
        provider = TracerProvider()
        provider.add_span_processor(_capture)
        trace.set_tracer_provider(provider)
        # A process sets its provider at its start; this one sets it in mid-run, so the
        # answer "no provider" that tracing keeps for a second is dropped.
        tracing._no_provider_until = 0.0
    return _capture


def write_to(path: str) -> None:
    """Set this process's tracer provider to write every span to `path`."""
    provider = TracerProvider()
    provider.add_span_processor(ToFile(path))
    trace.set_tracer_provider(provider)


def read(path: str | Path) -> list[dict[str, Any]]:
    file = Path(path)
    if not file.exists():
        return []
    return [json.loads(line) for line in file.read_text().splitlines() if line.strip()]


def named(spans: Sequence[dict[str, Any]], name: str) -> list[dict[str, Any]]:
    return [span for span in spans if span["name"] == name]
