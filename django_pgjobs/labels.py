"""How the surfaces that show the queue to a person (the admin, `jobsctl`) write its
values: "≈ 1,000", "3 min", "3 of 5", "in 4 min"."""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any

from django_pgjobs.records import Count


def count(value: Count | int) -> str:
    """ "1,000", or "≈ 12,000" for the planner's estimate."""
    return f"{value:,}" if isinstance(value, int) else str(value)


def age(seconds: float | None) -> str:
    """An age in the largest unit that keeps it readable: "12 s", "3 min", "1.5 h"."""
    if seconds is None:
        return "-"
    if seconds < 60:
        return f"{seconds:.0f} s"
    if seconds < 3600:
        return f"{seconds / 60:.0f} min"
    return f"{seconds / 3600:.1f} h"


def running_of_limit(running: Count | int, max_running: int | None) -> str:
    """A queue's running jobs, and its limit if it has one: "3 of 5", or "3"."""
    return f"{count(running)} of {max_running}" if max_running else count(running)


def progress(report: Any, now: datetime | None = None) -> str:
    """A progress report as one line: "40% embedding (3 s ago)"; "-" for none. Any JSON
    (a row edited by hand) reads as what can be made of it, never an error."""
    if not isinstance(report, dict):
        return "-"
    parts = []
    fraction = report.get("fraction")
    if isinstance(fraction, int | float) and not isinstance(fraction, bool) and 0 <= fraction <= 1:
        parts.append(f"{fraction:.0%}")
    message = report.get("message")
    if isinstance(message, str) and message:
        parts.append(" ".join(message.split())[:60])
    at = report.get("at")
    if now is not None and isinstance(at, str):
        try:
            made = datetime.fromisoformat(at)
            parts.append(f"({ago(made - now)})")
        except (ValueError, TypeError, OverflowError):  # not a time, one without a zone
            pass
    return " ".join(parts) or "-"


def ago(delta: timedelta | None) -> str:
    """'in 3 min' for a time ahead, '5 s ago' for one behind (delta = that time - now)."""
    if delta is None:
        return "-"
    seconds = delta.total_seconds()
    size = abs(seconds)
    if size < 60:
        text = f"{size:.0f} s"
    elif size < 3600:
        text = f"{size / 60:.0f} min"
    elif size < 86400:
        text = f"{size / 3600:.1f} h"
    else:
        text = f"{size / 86400:.1f} d"
    return f"in {text}" if seconds > 0 else f"{text} ago"


def shortened(text: str, length: int) -> str:
    """`text`, cut to `length` characters with an ellipsis (a list shows 50 rows: plain
    slicing, not Truncator's per-call regular expressions)."""
    return text if len(text) <= length else text[: length - 1] + "…"
