"""Poison: what a hostile handler raises or returns (S27), by name.

`chaosjobs --faults poison` mixes jobs that act out these into its load, and the poison
benchmark mixes them into a drain. Each must end its job dead with a readable reason,
and none may stop, wedge or slow the workers of its queue.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, NoReturn

from django_pgjobs.exceptions import Fail, Retry


class Unprintable(Exception):
    """An exception whose text cannot be read."""

    def __str__(self) -> str:
        raise ValueError("no text for you")


def _raise(error: BaseException) -> NoReturn:
    raise error


#: Each behaviour by name: called in the handler, it raises or returns the poison.
BEHAVIOURS: dict[str, Callable[[], Any]] = {
    "nul": lambda: _raise(RuntimeError("binary reply: \x00\x01")),
    "fail-nul": lambda: _raise(Fail("declined: \x00")),
    "surrogate": lambda: _raise(RuntimeError("bad \ud800")),
    "fail-surrogate": lambda: _raise(Fail("\udfff declined")),
    "unprintable": lambda: _raise(Unprintable()),
    "huge": lambda: _raise(RuntimeError("x" * 2_000_000)),
    "retry-past": lambda: _raise(Retry("rate limited", delay=-1)),
    "retry-nan": lambda: _raise(Retry("rate limited", delay=float("nan"))),
    "retry-huge": lambda: _raise(Retry("rate limited", delay=1e15)),
    "result-object": lambda: {"when": object()},
    "result-surrogate": lambda: {"text": "half \ud800"},
    "exit": lambda: _raise(SystemExit(3)),
}


def act(how: str) -> Any:
    """Raise or return the poison named `how`."""
    return BEHAVIOURS[how]()
