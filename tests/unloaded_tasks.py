"""Tasks of a module the test process never imports: its workers may (runjobs --import),
its readers do not (a reader without a task's module, docs/tasks.md)."""

from __future__ import annotations

from typing import Any

from django_pgjobs.compat import TASKS_PACKAGE
from tests.models import Note

if TASKS_PACKAGE == "django.tasks":
    from django.tasks import task
else:  # pragma: no cover - Django 5.2 and the backport
    from django_tasks import task


@task(takes_context=True)
def greet(context, name: str) -> dict[str, Any]:  # type: ignore[no-untyped-def]
    """Greet, and note which variant of the task the worker ran."""
    result = context.task_result
    run_after = result.task.run_after
    Note.objects.create(
        text=f"priority={result.task.priority} queue={result.task.queue_name} "
        f"run_after={run_after.isoformat() if run_after else None} backend={result.backend}",
        job_id=int(result.id),
    )
    return {"greeting": f"hello {name}"}
