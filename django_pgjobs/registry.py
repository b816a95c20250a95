"""The job registry: which kinds this process can run, and their decorator defaults.

A worker runs only registered kinds; it never imports a path read from a row.
"""

from __future__ import annotations

import difflib
import functools
import inspect
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from django_pgjobs.conf import pgjobs_settings
from django_pgjobs.limits import Limits
from django_pgjobs.retry import Backoff

#: Names of the enqueue options a decorator may give defaults for.
DEFAULTABLE_OPTIONS = (
    "queue",
    "priority",
    "max_attempts",
    "lease",
    "expires",
    "result_retention",
    "timeout",
)


@dataclass(frozen=True, slots=True)
class JobDefinition:
    """A registered kind: its handler and the defaults it brings to every enqueue (S2)."""

    kind: str
    func: Callable[..., Any]
    defaults: dict[str, Any] = field(default_factory=dict)
    backoff: Backoff | None = None
    key: Callable[..., str | None] | None = None
    on_conflict: str | None = None
    atomic: bool = False
    takes_context: bool = False
    #: Run by itself on this schedule (a schedules.Cron), under the kind's name.
    schedule: Any = None
    #: The concurrency key and limits its jobs carry (S34, S35), if any.
    limits: Limits | None = None
    #: Whether the handler is a coroutine function: worked out once, not per job (the
    #: worker asks it of every job it holds and runs).
    is_async: bool = field(init=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "is_async", inspect.iscoroutinefunction(self.func))

    def misfit(self, payload: object) -> str | None:
        """Why `payload` cannot be this handler's keyword arguments, if it cannot (S28):
        "payload does not fit the handler of <kind>: missing a required argument: 'x'"."""
        if not isinstance(payload, dict):
            return f"payload is not a JSON object: {type(payload).__name__}"
        return _misfit_of_names(self.func, self.takes_context, self.kind, frozenset(payload))


_definitions: dict[str, JobDefinition] = {}
_lock = threading.Lock()


def register(definition: JobDefinition) -> JobDefinition:
    """Register a kind; registering the same function again is a no-op.

    Raises:
        ValueError: another function already holds this kind.
    """
    with _lock:
        existing = _definitions.get(definition.kind)
        if existing is not None and _same_function(existing.func, definition.func):
            _definitions[definition.kind] = definition
            return definition
        if existing is not None:
            raise ValueError(
                f"Job kind {definition.kind!r} is already registered to "
                f"{existing.func.__module__}.{existing.func.__qualname__}; "
                "give one of them another name with @job(name=...)."
            )
        _definitions[definition.kind] = definition
        return definition


@functools.lru_cache(maxsize=4096)
def _misfit_of_names(
    func: Callable[..., Any], takes_context: bool, kind: str, names: frozenset[str]
) -> str | None:
    """The misfit of a payload with these keys: binding depends on the names alone, so a
    batch of payloads of one shape is bound once."""
    context = (None,) if takes_context else ()
    try:
        inspect.signature(func).bind(*context, **dict.fromkeys(names))
    except TypeError as error:
        return f"payload does not fit the handler of {kind}: {error}"
    return None


def closest_kinds(kind: str) -> list[str]:
    """The registered kinds that look most like `kind` (a typo's likely meaning)."""
    return difflib.get_close_matches(kind, list(_definitions), n=2, cutoff=0.8)


def unregister(kind: str) -> None:
    with _lock:
        _definitions.pop(kind, None)


def get_definition(kind: str) -> JobDefinition | None:
    return _definitions.get(kind)


def registered_kinds() -> list[str]:
    return sorted(_definitions)


def decorator_defaults(kind: str) -> dict[str, Any]:
    """Return the enqueue defaults a registered kind brings (empty when unregistered)."""
    definition = _definitions.get(kind)
    return definition.defaults if definition is not None else {}


def backoff_for(kind: str, queue: str) -> Backoff:
    """Return the backoff of a kind: its decorator's, else its queue's settings (S14)."""
    definition = _definitions.get(kind)
    if definition is not None and definition.backoff is not None:
        return definition.backoff
    options = pgjobs_settings.queue_options(queue)
    return Backoff(base_s=options.backoff_base_s, cap_s=options.backoff_cap_s)


def _same_function(a: Callable[..., Any], b: Callable[..., Any]) -> bool:
    return (a.__module__, a.__qualname__) == (b.__module__, b.__qualname__)
