"""How `jobsctl` writes: tables and lines for a person, one JSON document for a script."""

from __future__ import annotations

import json
from collections.abc import Sequence
from datetime import datetime, timedelta
from typing import Any

from django.core.management.base import BaseCommand
from django.utils import timezone

from django_pgjobs import labels


class Output:
    """A command's stdout, with its styles."""

    def __init__(self, command: BaseCommand) -> None:
        self.stdout = command.stdout
        self.style = command.style

    def line(self, text: str = "") -> None:
        self.stdout.write(text)

    def heading(self, text: str) -> None:
        self.stdout.write(self.style.MIGRATE_HEADING(text))

    def warning(self, text: str) -> None:
        self.stdout.write(self.style.WARNING(text))

    def table(self, header: Sequence[str], rows: Sequence[Sequence[str]]) -> None:
        widths = [max(len(row[i]) for row in [header, *rows]) for i in range(len(header))]
        for index, row in enumerate([header, *rows]):
            self.stdout.write(
                "  ".join(cell.ljust(width) for cell, width in zip(row, widths, strict=True))
            )
            if index == 0:
                self.stdout.write("  ".join("-" * width for width in widths))

    def document(self, document: dict[str, Any]) -> None:
        """Write `document` as one JSON document (ASCII, whatever the terminal's encoding),
        and nothing else: no colour, no line of its own before or after."""
        self.stdout.write(json.dumps(document, indent=2), style_func=lambda text: text)


def iso(moment: datetime | None) -> str | None:
    """ISO 8601 with its offset ("2026-01-01T03:00:00.123456+00:00"); a naive time (a
    project with USE_TZ = False) is read in the project's time zone, as Django reads it."""
    if moment is None:
        return None
    if timezone.is_naive(moment):
        moment = timezone.make_aware(moment, timezone.get_default_timezone())
    return moment.isoformat()


def when(moment: datetime | None) -> str:
    """A stored time to the second, with its zone: "2026-01-01 03:00:00 UTC"."""
    return "-" if moment is None else f"{moment:%Y-%m-%d %H:%M:%S %Z}".rstrip()


def ago_and_when(moment: datetime, seconds_ago: float) -> str:
    """ "5 min ago (2026-01-01 03:00:00 UTC)": the age on the database clock, then the
    exact time."""
    return f"{labels.ago(timedelta(seconds=-seconds_ago))} ({when(moment)})"


def plural(count: int, word: str, words: str | None = None) -> str:
    """ "1 dead letter", "3 dead letters"."""
    return f"{count:,} {word if count == 1 else (words or word + 's')}"
