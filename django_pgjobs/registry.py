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

from django.apps import apps

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
#: The kinds registered after Django's apps were all loaded, by their module: imported
#: by something a process did later (a view, a shell), which a worker may never do.
#: Every kind registered while the apps loaded (every app's jobs.py, the modules of
#: PGJOBS["JOB_MODULES"], anything an app's ready() imports) is known to every process.
_late: dict[str, str] = {}

#: How workers find kinds, for the messages that name a kind they may not know.
HOW_WORKERS_FIND_KINDS = (
    "workers know the @job functions of every installed app's jobs.py, of the modules in "
    "PGJOBS['JOB_MODULES'] and of runjobs --import"
)


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
        if apps.ready:  # registered after the apps were loaded: see _late
            _late[definition.kind] = definition.func.__module__
        return definition


@functools.lru_cache(maxsize=4096)
def _misfit_of_names(
    func: Callable[..., Any], takes_context: bool, kind: str, names: frozenset[str]
) -> str | None:
    """The misfit of a payload with these keys: binding depends on the names alone, so a
    batch of payloads of one shape is bound once. Every mistake is named at once: each
    unexpected argument (with the parameter it most looks like), then each missing one."""
    context = (None,) if takes_context else ()
    signature = inspect.signature(func)
    try:
        signature.bind(*context, **dict.fromkeys(names))
    except TypeError as error:
        problems = _problems(signature, takes_context, names) or [str(error)]
        return f"payload does not fit the handler of {kind}: {'; '.join(problems)}"
    return None


def _problems(
    signature: inspect.Signature, takes_context: bool, names: frozenset[str]
) -> list[str]:
    """What keeps keyword arguments `names` from binding to a handler's `signature`."""
    parameters = list(signature.parameters.values())[1 if takes_context else 0 :]
    by_keyword = {
        parameter.name: parameter
        for parameter in parameters
        if parameter.kind in (parameter.POSITIONAL_OR_KEYWORD, parameter.KEYWORD_ONLY)
    }
    takes_any = any(parameter.kind is parameter.VAR_KEYWORD for parameter in parameters)
    unexpected = [] if takes_any else sorted(names - set(by_keyword))
    unused = [name for name in by_keyword if name not in names]
    problems = []
    for name in unexpected:
        close = difflib.get_close_matches(name, unused, n=1, cutoff=0.6)
        guess = f" (did you mean {close[0]!r}?)" if close else ""
        problems.append(f"unexpected keyword argument {name!r}{guess}")
    problems += [
        f"missing a required argument: {name!r}"
        for name, parameter in by_keyword.items()
        if parameter.default is parameter.empty and name not in names
    ]
    problems += [
        f"its parameter {parameter.name!r} is positional-only, which a payload (keyword "
        "arguments) cannot give"
        for parameter in parameters
        if parameter.kind is parameter.POSITIONAL_ONLY and parameter.default is parameter.empty
    ]
    return problems


def undiscovered_module(kind: str) -> str | None:
    """The module of a kind registered in this process only because something imported
    it after the apps were loaded (a view importing shop/tasks.py, say): a worker knows
    it only if it happens to import that module too. None for any other kind."""
    return _late.get(kind)


def kinds_by_module() -> dict[str, list[str]]:
    """Every registered kind by the module its function lives in, both sorted."""
    found: dict[str, list[str]] = {}
    for kind, definition in sorted(_definitions.items()):
        found.setdefault(definition.func.__module__, []).append(kind)
    return dict(sorted(found.items()))


def closest_kinds(kind: str) -> list[str]:
    """The registered kinds that look most like `kind` (a typo's likely meaning)."""
    return difflib.get_close_matches(kind, list(_definitions), n=2, cutoff=0.8)


def unregister(kind: str) -> None:
    with _lock:
        _definitions.pop(kind, None)
        _late.pop(kind, None)


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
