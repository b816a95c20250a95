"""Log lines as JSON, one object a line, for log shippers (`runjobs --log-format json`).

    {"time": "2026-12-06T09:14:03.512Z", "level": "INFO", "logger": "django_pgjobs.jobs",
     "message": "job done id=41 kind=shop.send_receipt attempt=1/5 duration=0.012s",
     "worker": "web-1:4242:9f3a", "job_id": 41, "kind": "shop.send_receipt",
     "queue": "emails", "attempt": 1, "outcome": "succeeded", "duration_s": 0.012,
     "trace_id": "0af7651916cd43dd8448eb211c80319c", "span_id": "b7ad6b7169203331"}

`time` (UTC, milliseconds), `level`, `logger` and `message` are on every line; the
worker's id on every line its worker writes; a job's fields on the lines about one job
(`job_id`, `kind`, `queue`, `attempt`, and when its run ended `outcome`, `duration_s`,
`error` or `reason`); the trace and span ids while a span is current (django_pgjobs.tracing);
`exception`, the traceback, when the line carries one. A project can use the formatter
in its own LOGGING: {"formatters": {"json": {"()": "django_pgjobs.logs.JsonFormatter"}}}.
"""

from __future__ import annotations

import json
import logging
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from django_pgjobs import tracing

if TYPE_CHECKING:
    from django_pgjobs.claims import JobHandle, Outcome

#: The attribute of a log record that carries a job's fields (logging's `extra=`).
JOB_FIELDS = "pgjobs"


def job_fields(handle: JobHandle, outcome: Outcome | None = None) -> dict[str, Any]:
    """The `extra=` of a log line about one job, and, once its run ended, how."""
    fields: dict[str, Any] = {
        "job_id": handle.id,
        "kind": handle.kind,
        "queue": handle.queue,
        "attempt": handle.attempt,
    }
    if outcome is not None:
        fields["outcome"] = "timed_out" if outcome.timed_out else outcome.ending
        fields["duration_s"] = round(outcome.duration, 6)
        if outcome.failure is not None:
            fields["error"] = outcome.failure.error
        elif handle.control.reason is not None:
            fields["reason"] = handle.control.reason
    return {JOB_FIELDS: fields}


class JsonFormatter(logging.Formatter):
    """Format each record as one JSON object on one line (see the module's docstring)."""

    def __init__(self, *args: Any, worker_id: str | None = None, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        #: Written on every line (runjobs sets it to its worker's id).
        self.worker_id = worker_id

    def format(self, record: logging.LogRecord) -> str:
        moment = datetime.fromtimestamp(record.created, UTC)
        line: dict[str, Any] = {
            "time": moment.isoformat(timespec="milliseconds").replace("+00:00", "Z"),
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
        }
        if self.worker_id is not None:
            line["worker"] = self.worker_id
        fields = getattr(record, JOB_FIELDS, None)
        if isinstance(fields, dict):
            line.update(fields)
        ids = tracing.current_ids()
        if ids is not None:
            line["trace_id"], line["span_id"] = ids
        if record.exc_info:
            line["exception"] = self.formatException(record.exc_info)
        # ASCII: a lone surrogate a handler put in an error stays writable (S27).
        return json.dumps(line, default=str)
