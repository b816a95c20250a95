"""The settings reference, read from `django_pgjobs.conf.Settings`.

Each setting is a class attribute of `Settings` whose value is its default and whose
`#:` comment above it is its description; a plain `# Heading` comment between them
starts a group. Nothing here is written by hand, so the page cannot drift from the code.
"""

from __future__ import annotations

import inspect
import json
import re
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

from pgjobs_reference.markdown import ReferenceDrift, code, table

FIRST_GROUP = "General"
DAY_S = 86_400

_SETTING_LINE = re.compile(r"^    ([A-Z][A-Z0-9_]*)\s*:")
_DOC_COMMENT = re.compile(r"^    #: ?(.*)$")
_GROUP_COMMENT = re.compile(r"^    # (?!:)(.+)$")


@dataclass(frozen=True, slots=True)
class SettingEntry:
    """One key of `PGJOBS`: its name, default, description and group."""

    name: str
    default: Any
    description: str
    group: str


def setting_entries() -> list[SettingEntry]:
    """Return every setting of `Settings`, in the order the class declares them.

    Raises:
        ReferenceDrift: a setting has no `#:` comment, or the class has a setting its
            source does not declare in the usual shape.
    """
    from django_pgjobs.conf import Settings

    entries: list[SettingEntry] = []
    group = FIRST_GROUP
    comment: list[str] = []
    for line in inspect.getsource(Settings).splitlines():
        if doc := _DOC_COMMENT.match(line):
            comment.append(doc.group(1))
        elif heading := _GROUP_COMMENT.match(line):
            group = heading.group(1).strip()
            comment = []
        elif setting := _SETTING_LINE.match(line):
            name = setting.group(1)
            if not comment:
                raise ReferenceDrift(f"conf.Settings.{name} has no #: comment saying what it does.")
            entries.append(SettingEntry(name, getattr(Settings, name), " ".join(comment), group))
            comment = []
        elif line.strip() and not line.lstrip().startswith("#"):
            comment = []
    declared = {name for name in vars(Settings) if name.isupper()}
    missing = declared - {entry.name for entry in entries}
    if missing:
        raise ReferenceDrift(
            f"conf.Settings declares {sorted(missing)} in a shape the settings reference does "
            "not read: write each as `NAME: type = default` under a #: comment."
        )
    return entries


def default_literal(value: Any) -> str:
    """Return a default as Python source would write it (strings as JSON writes them)."""
    if isinstance(value, str):
        return json.dumps(value)
    if isinstance(value, timedelta):
        return repr(value.total_seconds())
    return repr(value)


def default_text(value: Any) -> str:
    """Return a default as the reference shows it: the literal, and days spelled out."""
    literal = code(default_literal(value))
    if isinstance(value, int) and not isinstance(value, bool) and value and value % DAY_S == 0:
        days = value // DAY_S
        return f"{literal} ({days} day{'s' if days > 1 else ''})"
    return literal


def settings_markdown() -> str:
    """Return the settings reference: one table per group of `Settings`."""
    from django_pgjobs.conf import QUEUE_OPTION_KEYS

    parts: list[str] = []
    entries = setting_entries()
    groups = list(dict.fromkeys(entry.group for entry in entries))
    for group in groups:
        parts.append(f"## {group}\n")
        if group.startswith("Queue options"):
            queue_keys = ", ".join(code(key) for key in QUEUE_OPTION_KEYS)
            parts.append(
                "These are the defaults of every queue. A queue overrides any of them "
                f'({queue_keys}) under `PGJOBS["QUEUES"][name]`, and may add '
                "`MAX_RUNNING`, the most of its jobs running at once over all workers "
                "(`None`: no limit).\n"
            )
        rows = [
            (code(entry.name), default_text(entry.default), entry.description)
            for entry in entries
            if entry.group == group
        ]
        parts.append(table(("Setting", "Default", "What it does"), rows))
    return "\n".join(parts)


def task_options_markdown() -> str:
    """Return the table of the tasks backend's `OPTIONS` keys, with their defaults."""
    from django_pgjobs import backend

    described = {
        "RESULT_RETENTION": (
            backend.DEFAULT_RESULT_RETENTION_S,
            "Seconds a task's return value (and its job, as done) is kept after it ran.",
        )
    }
    unknown = set(backend.OPTION_NAMES) - set(described)
    if unknown:
        raise ReferenceDrift(
            f"The tasks backend takes OPTIONS {sorted(unknown)} that the settings reference "
            "does not describe: add them to task_options_markdown()."
        )
    rows = [
        (code(name), default_text(described[name][0]), described[name][1])
        for name in backend.OPTION_NAMES
    ]
    return table(("Key", "Default", "What it does"), rows)
