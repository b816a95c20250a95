"""django.tasks tasks the backend tests run (discovered like any app's tasks.py)."""

from __future__ import annotations

import asyncio

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
