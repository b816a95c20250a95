"""The tasks of Django's own tests of django.tasks (Django 6.1.3, tests/tasks/tasks.py),
for the port in tests/concurrency/test_upstream_tasks.py. Same names, same bodies.

One adaptation: the tasks that fail have max_attempts=1, because Django's backends never
run a task twice and PgJobsBackend retries a failure with backoff until its attempts are
spent. Django's exit_task, hang and sleep_for are left out: no test of 6.1.3 uses them.
"""

from __future__ import annotations

from typing import Any

from django_pgjobs.compat import TaskContext, task


@task()
def noop_task(*args: Any, **kwargs: Any) -> None:
    return None


@task
def noop_task_from_bare_decorator(*args: Any, **kwargs: Any) -> None:
    return None


@task()
async def noop_task_async(*args: Any, **kwargs: Any) -> None:
    return None


@task()
def calculate_meaning_of_life() -> int:
    return 42


@task(max_attempts=1)
def failing_task_value_error() -> None:
    raise ValueError("This Task failed due to ValueError")


@task(max_attempts=1)
def failing_task_system_exit() -> None:
    raise SystemExit("This Task failed due to SystemExit")


@task(max_attempts=1)
def failing_task_keyboard_interrupt() -> None:
    raise KeyboardInterrupt("This Task failed due to KeyboardInterrupt")


@task(max_attempts=1)
def complex_exception() -> None:
    raise ValueError(ValueError("This task failed"))


@task()
def complex_return_value() -> Any:
    # Return something which isn't JSON serializable nor picklable.
    return lambda: True


@task(takes_context=True)
def get_task_id(context: TaskContext) -> str:
    return str(context.task_result.id)


@task(takes_context=True)
def test_context(context: TaskContext, attempt: int) -> None:
    assert isinstance(context, TaskContext)
    assert context.attempt == attempt
