"""django.tasks tasks the backend tests run (discovered like any app's tasks.py)."""

from __future__ import annotations

import asyncio
from typing import Any

from django_pgjobs.compat import TASKS_PACKAGE
from tests.models import Note

if TASKS_PACKAGE == "django.tasks":
    from django.tasks import task
else:  # pragma: no cover - Django 5.2 and the backport
    from django_tasks import task


@task
def add(a: int, b: int) -> int:
    return a + b


@task(queue_name="tasks", priority=5)
def note(text: str) -> str:
    Note.objects.create(text=text)
    return text


@task(takes_context=True, max_attempts=3)
def flaky(context, fail_times: int) -> int:  # type: ignore[no-untyped-def]
    Note.objects.create(text=f"attempt {context.attempt}", attempt=context.attempt)
    if context.attempt <= fail_times:
        raise ValueError(f"attempt {context.attempt} failed")
    return int(context.attempt)


@task
async def async_multiply(a: int, b: int) -> int:
    await asyncio.sleep(0.001)
    return a * b


@task(max_attempts=1)
def explode() -> None:
    raise KeyError("no such thing")


@task
def returns_a_set() -> object:
    return {1, 2, 3}


@task(key=lambda account, version: f"account:{account}")
def sync_account(account: int, version: int) -> int:
    return version


@task(atomic=True, max_attempts=2)
def atomic_note(text: str, explode: bool = False) -> None:
    Note.objects.create(text=text)
    if explode:
        raise RuntimeError("rolled back")


@task(takes_context=True)
def describe_variant(context) -> dict[str, Any]:  # type: ignore[no-untyped-def]
    """Note the task and the backend the worker ran this attempt with."""
    result = context.task_result
    run_after = result.task.run_after
    described = {
        "priority": result.task.priority,
        "queue_name": result.task.queue_name,
        "run_after": run_after.isoformat() if run_after else None,
        "backend": result.task.backend,
        "result_backend": result.backend,
    }
    Note.objects.create(text="described", job_id=int(result.id), attempt=context.attempt)
    return described


@task(max_attempts=2)
def interrupt(how: str) -> None:
    """Raise what ends a process rather than a function (and still only fails the task)."""
    if how == "keyboard":
        raise KeyboardInterrupt("the task pressed ctrl-c")
    raise SystemExit("the task called sys.exit")


#: Values `return_stored` returns, by token: anything a test makes, JSON or not.
RETURN_VALUES: dict[str, object] = {}


@task(max_attempts=3)
def return_stored(token: str) -> object:
    return RETURN_VALUES[token]


@task(max_attempts=2)
def echo(*args: Any, **kwargs: Any) -> dict[str, Any]:
    """Whatever it is called with, as it was called."""
    return {"args": list(args), "kwargs": kwargs}
