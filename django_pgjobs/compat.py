"""Django's tasks framework from one place: `django.tasks` (Django 6), or the `django-tasks`
backport on Django 5.2 (`pip install "django-pgjobs[tasks]"`). Same API, one code path."""

from __future__ import annotations

from typing import Any

try:
    from django.tasks import default_task_backend, task, task_backends
    from django.tasks.backends.base import BaseTaskBackend
    from django.tasks.base import (
        TASK_MAX_PRIORITY,
        TASK_MIN_PRIORITY,
        Task,
        TaskContext,
        TaskError,
        TaskResult,
        TaskResultStatus,
    )
    from django.tasks.exceptions import (
        InvalidTask,
        InvalidTaskBackend,
        TaskResultDoesNotExist,
        TaskResultMismatch,
    )
    from django.tasks.signals import task_enqueued, task_finished, task_started
    from django.utils.json import normalize_json

    TASKS_PACKAGE = "django.tasks"
except ImportError:  # Django 5.2: the backport
    from django_tasks import (  # type: ignore[no-redef]
        default_task_backend,
        task,
        task_backends,
    )
    from django_tasks.backends.base import BaseTaskBackend  # type: ignore[no-redef]
    from django_tasks.base import (  # type: ignore[no-redef]
        TASK_MAX_PRIORITY,
        TASK_MIN_PRIORITY,
        Task,
        TaskContext,
        TaskError,
        TaskResult,
        TaskResultStatus,
    )
    from django_tasks.exceptions import (  # type: ignore[no-redef]
        InvalidTaskBackendError as InvalidTaskBackend,
    )
    from django_tasks.exceptions import (  # type: ignore[no-redef]
        InvalidTaskError as InvalidTask,
    )
    from django_tasks.exceptions import (  # type: ignore[no-redef]
        TaskResultDoesNotExist,
        TaskResultMismatch,
    )
    from django_tasks.signals import (  # type: ignore[no-redef]
        task_enqueued,
        task_finished,
        task_started,
    )
    from django_tasks.utils import normalize_json  # type: ignore[no-redef]

    TASKS_PACKAGE = "django_tasks"

__all__ = [
    "TASKS_PACKAGE",
    "TASK_MAX_PRIORITY",
    "TASK_MIN_PRIORITY",
    "BaseTaskBackend",
    "InvalidTask",
    "InvalidTaskBackend",
    "Task",
    "TaskContext",
    "TaskError",
    "TaskResult",
    "TaskResultDoesNotExist",
    "TaskResultMismatch",
    "TaskResultStatus",
    "default_task_backend",
    "normalize_json",
    "set_frozen",
    "task",
    "task_backends",
    "task_enqueued",
    "task_finished",
    "task_started",
]


def set_frozen(instance: Any, **values: Any) -> None:
    """Set attributes of one of the framework's frozen dataclasses, as its backends do."""
    for name, value in values.items():
        object.__setattr__(instance, name, value)
