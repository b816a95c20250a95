"""The signals reference: the signals of `django_pgjobs.signals`, what its docstring says
of each, and the arguments the package really sends with each.

The arguments are read from every call that sends a signal (`send(job_started, kind,
handle=...)`) in the package's source; the build fails when the docstring's list and the
sent arguments differ, so the page says what a receiver really gets.
"""

from __future__ import annotations

import ast
import re
from dataclasses import dataclass

from pgjobs_reference.checks import package_root
from pgjobs_reference.markdown import ReferenceDrift, code, table

_BULLET = re.compile(r"^- `(\w+)\(([^)]*)\)`: (.*)$")


@dataclass(frozen=True, slots=True)
class SignalEntry:
    """One signal: its name, the arguments a receiver gets, and when it is sent."""

    name: str
    arguments: tuple[str, ...]
    description: str


def _documented() -> dict[str, tuple[tuple[str, ...], str]]:
    from django_pgjobs import signals

    documented: dict[str, tuple[tuple[str, ...], str]] = {}
    current: str | None = None
    for line in (signals.__doc__ or "").splitlines():
        if bullet := _BULLET.match(line):
            current = bullet.group(1)
            arguments = tuple(part.strip() for part in bullet.group(2).split(",") if part.strip())
            documented[current] = (arguments, bullet.group(3))
        elif current and line.startswith("  ") and line.strip():
            arguments, text = documented[current]
            documented[current] = (arguments, f"{text} {line.strip()}")
        else:
            current = None
    return documented


def sent_arguments() -> dict[str, set[str]]:
    """Return, per signal name, the keyword arguments the package sends it with."""
    sent: dict[str, set[str]] = {}
    for path in sorted(package_root().rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
            if not isinstance(node, ast.Call) or len(node.args) < 2:
                continue
            func = node.func
            sender = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", "")
            if sender != "send":
                continue
            signal = node.args[0]
            name = signal.attr if isinstance(signal, ast.Attribute) else getattr(signal, "id", "")
            if name.startswith("job_"):
                sent.setdefault(name, set()).update(
                    keyword.arg for keyword in node.keywords if keyword.arg
                )
    return sent


def signal_entries() -> list[SignalEntry]:
    """Return every signal with its arguments and description.

    Raises:
        ReferenceDrift: a signal is not described in the module's docstring, or is
            described with other arguments than it is sent with.
    """
    from django.dispatch import Signal

    from django_pgjobs import signals

    names = sorted(name for name, value in vars(signals).items() if isinstance(value, Signal))
    documented = _documented()
    sent = sent_arguments()
    entries = []
    for name in names:
        if name not in documented:
            raise ReferenceDrift(
                f"django_pgjobs.signals.{name} is not described in the module's docstring "
                "(a line '- `name(kind, argument, ...)`: when it is sent')."
            )
        arguments, description = documented[name]
        said = set(arguments) - {"kind"}
        if name in sent and said != sent[name]:
            raise ReferenceDrift(
                f"django_pgjobs.signals' docstring says {name} carries {sorted(said)}, but "
                f"the package sends it with {sorted(sent[name])}."
            )
        entries.append(SignalEntry(name, arguments, description))
    return entries


def signals_markdown() -> str:
    """Return the table of every signal, its arguments and when it is sent."""
    rows = [
        (
            code(f"django_pgjobs.signals.{entry.name}"),
            ", ".join(code(argument) for argument in entry.arguments),
            entry.description,
        )
        for entry in signal_entries()
    ]
    return table(("Signal", "Arguments (sender first)", "When it is sent"), rows)
