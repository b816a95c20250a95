"""Markdown pieces the reference generators share: tables, code spans, drift errors."""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence


class ReferenceDrift(Exception):
    """The code and the text the reference is generated from disagree: fix the code's
    docstring or comment that the message names, so the documentation stays true."""


def code(text: str) -> str:
    """Return `text` as a Markdown code span, whatever backticks it holds.

    The fence is one backtick longer than the longest run of backticks in the text, and
    padded with a space when the text starts or ends with one (CommonMark's rule). An
    empty text, which no code span can hold, is shown as a single space.
    """
    if not text:
        return "` `"
    longest = max((len(run) for run in re.findall(r"`+", text)), default=0)
    fence = "`" * (longest + 1)
    padding = " " if text.startswith("`") or text.endswith("`") else ""
    return f"{fence}{padding}{text}{padding}{fence}"


def cell(text: str) -> str:
    """Return `text` fit for one cell of a Markdown table (one line, pipes escaped)."""
    return " ".join(text.split()).replace("|", "\\|")


def table(header: Sequence[str], rows: Iterable[Sequence[str]]) -> str:
    """Return a Markdown table of `rows` under `header`."""
    lines = [
        "| " + " | ".join(header) + " |",
        "|" + "|".join("---" for _ in header) + "|",
    ]
    lines.extend("| " + " | ".join(cell(value) for value in row) + " |" for row in rows)
    return "\n".join(lines) + "\n"
