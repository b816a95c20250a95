"""A django.tasks task's job payload: the call and the task's own options, as enqueue
stores them and as readers and workers rebuild them.

    {"args": [1], "kwargs": {"b": 2},
     "task": {"priority": 20, "queue_name": "emails",
              "run_after": "2026-12-01T09:00:00+00:00", "backend": "default"}}

The options are those of the variant that was enqueued (`Task.using(...)`), so that its
result reads back, and a worker runs, that very variant, whatever variants a process
made since. A job written before the options were stored holds only args and kwargs;
its task is the decorator's, with the row's own queue and priority.

Nothing here imports a path read from a row: a task this process has not loaded reads
as a stand-in whose function only raises `TaskNotLoaded` (docs/tasks.md).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import MISSING, Field, dataclass, fields
from datetime import datetime
from typing import Any, TypeVar

from django.conf import settings

from django_pgjobs.compat import TASK_MAX_PRIORITY, TASK_MIN_PRIORITY, Task
from django_pgjobs.exceptions import TaskNotLoaded
from django_pgjobs.payloads import safe_str

TaskT = TypeVar("TaskT", bound=Task)  # type: ignore[type-arg]

#: The task's fields a variant may change (`Task.using()`'s), as the payload names them.
TASK_OPTIONS = ("priority", "queue_name", "run_after", "backend")


def task_payload(
    task: Task[Any, Any], args: list[Any], kwargs: dict[str, Any], alias: str
) -> dict[str, Any]:
    """The payload of a job that runs `task(*args, **kwargs)`, enqueued through `alias`."""
    run_after = task.run_after
    return {
        "args": args,
        "kwargs": kwargs,
        "task": {
            "priority": task.priority,
            "queue_name": task.queue_name,
            "run_after": run_after.isoformat() if run_after is not None else None,
            "backend": alias,
        },
    }


def is_task_call(payload: object) -> bool:
    """Whether a payload has the shape enqueue gives a task's (args and kwargs)."""
    return isinstance(payload, dict) and "args" in payload and "kwargs" in payload


@dataclass(frozen=True, slots=True)
class StoredCall:
    """A task's job payload as read: the call, the variant's options, and what in it
    could not be read (the defaults stand in for those parts)."""

    args: list[Any]
    kwargs: dict[str, Any]
    options: dict[str, Any]
    problems: tuple[str, ...] = ()


def read_payload(payload: object, *, queue: str, priority: int, alias: str) -> StoredCall:
    """Read a task's job payload. A part that is not what enqueue writes (a row edited
    by hand) is named in `problems`; the row's queue and priority, no run_after and
    `alias` stand in for the options it lacks."""
    problems: list[str] = []
    if not isinstance(payload, dict):
        problems.append(f"the payload is not a JSON object but {type(payload).__name__}")
        payload = {}
    args = payload.get("args", [])
    if not isinstance(args, list):
        problems.append(f"payload['args'] is not a list but {type(args).__name__}")
        args = []
    kwargs = payload.get("kwargs", {})
    if not isinstance(kwargs, dict):
        problems.append(f"payload['kwargs'] is not an object but {type(kwargs).__name__}")
        kwargs = {}
    options: dict[str, Any] = {
        "priority": priority,
        "queue_name": queue,
        "run_after": None,
        "backend": alias,
    }
    stored = payload.get("task")
    if stored is not None and not isinstance(stored, dict):
        problems.append(f"payload['task'] is not an object but {type(stored).__name__}")
    elif stored is not None:
        for name in TASK_OPTIONS:
            if name not in stored:
                problems.append(f"payload['task'] has no {name!r}")
                continue
            try:
                options[name] = _OPTION_READERS[name](stored[name])
            except ValueError as error:
                problems.append(f"payload['task'][{name!r}] {error}")
    return StoredCall(args=args, kwargs=kwargs, options=options, problems=tuple(problems))


def _priority(value: object) -> int:
    if (
        not isinstance(value, int)
        or isinstance(value, bool)
        or not TASK_MIN_PRIORITY <= value <= TASK_MAX_PRIORITY
    ):
        raise ValueError(
            f"is not a whole number between {TASK_MIN_PRIORITY} and {TASK_MAX_PRIORITY}: "
            f"{_shown(value)}"
        )
    return value


def _name(value: object) -> str:
    if not isinstance(value, str) or not value:
        raise ValueError(f"is not a name: {_shown(value)}")
    return value


def _run_after(value: object) -> datetime | None:
    if value is None:
        return None
    try:
        moment = datetime.fromisoformat(value) if isinstance(value, str) else None
    except ValueError:
        moment = None
    if moment is None:
        raise ValueError(f"is not an ISO 8601 date and time: {_shown(value)}")
    if settings.USE_TZ and moment.utcoffset() is None:
        raise ValueError(f"has no time zone: {_shown(value)}")
    return moment


_OPTION_READERS: dict[str, Callable[[object], Any]] = {
    "priority": _priority,
    "queue_name": _name,
    "run_after": _run_after,
    "backend": _name,
}


def _shown(value: object) -> str:
    """A value as an error message shows it: its repr, cut short."""
    text = safe_str(repr(value)) if not isinstance(value, str) else repr(value)
    return text if len(text) <= 80 else f"{text[:77]}..."


def rebuilt(base: TaskT, **changes: Any) -> TaskT:
    """`base` with `changes`, as `Task.using()` makes it, but not validated again.

    The task was validated when it was enqueued; validating it again would make a stored
    result unreadable once the settings changed (a queue no longer listed, a backend
    alias renamed), and would register it as a handler (PgJobsBackend.validate_task).
    """
    values = {field.name: getattr(base, field.name) for field in _fields(type(base))}
    return made(type(base), **{**values, **changes})


def made(task_class: type[TaskT], **values: Any) -> TaskT:
    """A `task_class` with `values` (its defaults for the others), not validated."""
    task = object.__new__(task_class)
    for field in _fields(task_class):
        if field.name in values:
            value = values[field.name]
        elif field.default_factory is not MISSING:
            value = field.default_factory()
        else:
            value = field.default
        object.__setattr__(task, field.name, value)
    return task


_FIELDS: dict[type[Any], tuple[Field[Any], ...]] = {}


def _fields(task_class: type[Any]) -> tuple[Field[Any], ...]:
    """A task class's fields, worked out once: every task a worker runs is rebuilt."""
    found = _FIELDS.get(task_class)
    if found is None:
        found = _FIELDS[task_class] = fields(task_class)
    return found


class NotLoadedTaskFunction:
    """The function of a task this process has not loaded: named after the stored path
    (so that `module_path` and `name` read right), it only raises TaskNotLoaded."""

    def __init__(self, module_path: str) -> None:
        self.module_path = module_path
        module, _, name = module_path.rpartition(".")
        self.__module__ = module
        self.__qualname__ = self.__name__ = name

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        module = self.__module__ or self.module_path
        raise TaskNotLoaded(
            f"Task {self.module_path} is not loaded in this process: its result can be "
            f"read here, but to run it import {module} (every app's tasks.py is loaded "
            f"at start-up; a worker also takes `runjobs --import {module}`)."
        )

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, NotLoadedTaskFunction):
            return NotImplemented
        return self.module_path == other.module_path

    def __hash__(self) -> int:
        return hash(self.module_path)

    def __repr__(self) -> str:
        return f"<task {self.module_path}, not loaded in this process>"


def stand_in(task_class: type[TaskT], module_path: str, options: dict[str, Any]) -> TaskT:
    """The task a result of an unloaded task reads with: `options` and a function that
    only raises. Never validated, so never registered as a handler."""
    return made(task_class, func=NotLoadedTaskFunction(module_path), **options)


def is_stand_in(task: Task[Any, Any]) -> bool:
    return isinstance(task.func, NotLoadedTaskFunction)
