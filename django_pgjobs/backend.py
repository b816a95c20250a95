"""A backend for Django's tasks framework: `@task` functions run on django_pgjobs workers.

    TASKS = {
        "default": {
            "BACKEND": "django_pgjobs.backend.PgJobsBackend",
            "QUEUES": ["default", "emails"],
            "OPTIONS": {"RESULT_RETENTION": 86400},
        }
    }

A task is a job whose kind is the task's module path. Enqueueing writes one job in the
caller's transaction (S1); the worker runs it like any job (leases, retries with the
queue's backoff, dead letters) and keeps its return value for RESULT_RETENTION.
"""

from __future__ import annotations

import traceback
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from datetime import timedelta
from typing import Any, cast

from django.apps import apps
from django.core import checks

from django_pgjobs import options, registry
from django_pgjobs.claims import JobHandle
from django_pgjobs.compat import (
    BaseTaskBackend,
    InvalidTask,
    Task,
    TaskContext,
    TaskError,
    TaskResult,
    TaskResultDoesNotExist,
    TaskResultStatus,
    normalize_json,
    set_frozen,
    task_enqueued,
    task_finished,
    task_started,
)
from django_pgjobs.exceptions import Fail, InvalidJobOption

#: How long a task's return value is kept, unless OPTIONS["RESULT_RETENTION"] says.
DEFAULT_RESULT_RETENTION_S = 86_400
OPTION_NAMES = ("RESULT_RETENTION",)
LAPSE_EXCEPTION = "django_pgjobs.exceptions.LeaseLost"
ERROR_EXCEPTION = "builtins.Exception"

_STATUS = {
    "pending": TaskResultStatus.READY,
    "running": TaskResultStatus.RUNNING,
    "done": TaskResultStatus.SUCCESSFUL,
    "dead": TaskResultStatus.FAILED,
}


@dataclass(frozen=True, slots=True, kw_only=True)
class PgJobsTask(Task):  # type: ignore[type-arg]
    """A Task with django_pgjobs' options: `@task(max_attempts=5, lease=120, ...)`.

    Attributes:
        max_attempts: claims before the task is dead-lettered (default: the queue's).
        lease: seconds a claim lasts without a heartbeat (default: the queue's).
        key: coalescing key, a string or a function of the task's arguments returning
            one; at most one pending-or-running task per (task, key) (S3).
        on_conflict: what a second enqueue of a live key does: "replace",
            "keep_schedule" or "ignore".
        atomic: transaction mode (S21): database effects commit with the completion.
    """

    max_attempts: int | None = None
    lease: float | None = None
    key: str | Callable[..., str | None] | None = None
    on_conflict: str = "replace"
    atomic: bool = False


class PgJobsBackend(BaseTaskBackend):
    """Tasks as django_pgjobs jobs: durable, transactional, retried, dead-lettered."""

    task_class = PgJobsTask
    supports_defer = True
    supports_async_task = True
    supports_get_result = True
    supports_priority = True

    @property
    def result_retention(self) -> float | timedelta | None:
        return self.options.get("RESULT_RETENTION", DEFAULT_RESULT_RETENTION_S)  # type: ignore[no-any-return]

    def validate_task(self, task: Task[Any, Any]) -> None:
        """Validate as Django does, then django_pgjobs' own rules; register the task so
        that workers of this process can run it."""
        super().validate_task(task)
        try:
            options.validate_queue_name(task.queue_name)
            options.validate_kind(task.module_path)
        except InvalidJobOption as error:
            raise InvalidTask(str(error)) from None
        if isinstance(task, PgJobsTask):
            _validate_options(task)
        registry.register(
            registry.JobDefinition(
                kind=task.module_path,
                func=TaskRunner(task),
                atomic=getattr(task, "atomic", False),
                takes_context=True,
            )
        )

    def enqueue(
        self, task: Task[Any, Any], args: Iterable[Any], kwargs: dict[str, Any]
    ) -> TaskResult[Any, Any]:
        """Write the task as a job in the caller's transaction and return its result."""
        from django_pgjobs.models import Job

        self.validate_task(task)
        # normalize_json keeps a list a list and a dict a dict (tuples become lists).
        args_list = cast(list[Any], normalize_json(list(args)))
        kwargs_dict = cast(dict[str, Any], normalize_json(dict(kwargs)))
        enqueue_options: dict[str, Any] = {
            "queue": task.queue_name,
            "priority": task.priority,
            "run_after": task.run_after,
            "result_retention": self.result_retention,
        }
        if isinstance(task, PgJobsTask):
            if task.max_attempts is not None:
                enqueue_options["max_attempts"] = task.max_attempts
            if task.lease is not None:
                enqueue_options["lease"] = task.lease
            key = task.key(*args_list, **kwargs_dict) if callable(task.key) else task.key
            enqueue_options.update(key=key, on_conflict=task.on_conflict)
        try:
            written = Job.objects.enqueue(
                task.module_path, {"args": args_list, "kwargs": kwargs_dict}, **enqueue_options
            )
        except InvalidJobOption as error:
            raise InvalidTask(str(error)) from None
        result: TaskResult[Any, Any] = TaskResult(
            task=task,
            id=str(written.id),
            status=TaskResultStatus.READY,
            enqueued_at=written.created_at,
            started_at=None,
            finished_at=None,
            last_attempted_at=None,
            args=args_list,
            kwargs=kwargs_dict,
            backend=self.alias,
            errors=[],
            worker_ids=[],
        )
        task_enqueued.send(type(self), task_result=result)
        return result

    def get_result(self, result_id: str) -> TaskResult[Any, Any]:
        """Read a task's result from the live or the dead table.

        Raises:
            TaskResultDoesNotExist: no job has this id.
        """
        from django_pgjobs.models import Job

        try:
            job_id = int(result_id)
        except (TypeError, ValueError):
            raise TaskResultDoesNotExist(result_id) from None
        record = Job.objects.get_job(job_id)
        if record is None:
            raise TaskResultDoesNotExist(result_id)
        task = self._task_of(record.kind)
        payload = record.payload if isinstance(record.payload, dict) else {}
        errors = record.errors or []
        last_run_failed = record.state not in ("running", "done")
        worker_ids = [str(entry.get("worker_id") or "") for entry in errors]
        if not last_run_failed and record.worker_id:
            worker_ids.append(record.worker_id)
        result: TaskResult[Any, Any] = TaskResult(
            task=task,
            id=str(record.id),
            status=_STATUS[record.state],
            enqueued_at=record.created_at,
            started_at=record.started_at,
            finished_at=record.finished_at or record.died_at,
            last_attempted_at=record.claimed_at,
            args=payload.get("args", []),
            kwargs=payload.get("kwargs", {}),
            backend=self.alias,
            errors=[_task_error(entry) for entry in errors],
            worker_ids=_one_per_attempt(worker_ids, record.attempts),
        )
        if record.state == "done":
            set_frozen(result, _return_value=record.result)
        return result

    def check(self, **kwargs: Any) -> list[checks.CheckMessage]:
        from django_pgjobs.checks import check_database

        messages: list[checks.CheckMessage] = list(super().check(**kwargs))
        if not apps.is_installed("django_pgjobs"):
            messages.append(
                checks.Error(
                    f"TASKS[{self.alias!r}] uses PgJobsBackend, but django_pgjobs is not in "
                    "INSTALLED_APPS.",
                    hint="Add 'django_pgjobs' to INSTALLED_APPS and run migrate.",
                    id="pgjobs.E010",
                )
            )
        messages.extend(check_database())
        for queue in sorted(self.queues):
            try:
                options.validate_queue_name(queue)
            except InvalidJobOption as error:
                messages.append(
                    checks.Error(f"TASKS[{self.alias!r}]['QUEUES']: {error}", id="pgjobs.E011")
                )
        unknown = sorted(set(self.options) - set(OPTION_NAMES))
        if unknown:
            messages.append(
                checks.Error(
                    f"TASKS[{self.alias!r}]['OPTIONS'] has unknown keys {unknown}.",
                    hint=f"PgJobsBackend takes {list(OPTION_NAMES)}.",
                    id="pgjobs.E012",
                )
            )
        try:
            options.validate_result_retention(self.result_retention)
        except InvalidJobOption as error:
            messages.append(
                checks.Error(
                    f"TASKS[{self.alias!r}]['OPTIONS']['RESULT_RETENTION']: {error}",
                    id="pgjobs.E012",
                )
            )
        return messages

    def _task_of(self, kind: str) -> Task[Any, Any]:
        definition = registry.get_definition(kind)
        if definition is None or not isinstance(definition.func, TaskRunner):
            raise TaskResultDoesNotExist(
                f"Job kind {kind!r} is not a task this process knows; import the module "
                "that defines it (tasks.py modules are loaded at start-up)."
            )
        return definition.func.task


class TaskRunner:
    """The handler of a task's jobs: call the task as Django's backends do, and send
    task_started / task_finished around each attempt.

    The signals go out as the attempt ends in the worker, a moment before its outcome is
    recorded; `finished_at` is left to the database (get_result() reads it).
    """

    def __init__(self, task: Task[Any, Any]) -> None:
        self.task = task
        # Registering a task again (Task.using() copies) must find the same "function".
        self.__module__ = task.func.__module__
        self.__qualname__ = task.func.__qualname__

    def __call__(
        self, ctx: JobHandle, args: list[Any] | None = None, kwargs: dict[str, Any] | None = None
    ) -> Any:
        task, args, kwargs = self.task, list(args or []), dict(kwargs or {})
        sender = type(task.get_backend())
        result: TaskResult[Any, Any] = TaskResult(
            task=task,
            id=str(ctx.id),
            status=TaskResultStatus.RUNNING,
            enqueued_at=ctx.created_at,
            started_at=ctx.claimed_at,
            finished_at=None,
            last_attempted_at=ctx.claimed_at,
            args=args,
            kwargs=kwargs,
            backend=task.backend,
            errors=[],
            # One id per attempt; earlier attempts' workers are read by get_result().
            worker_ids=[*[""] * (ctx.attempt - 1), ctx.worker_id],
        )
        task_started.send(sender=sender, task_result=result)
        try:
            if task.takes_context:
                value = task.call(TaskContext(task_result=result), *args, **kwargs)
            else:
                value = task.call(*args, **kwargs)
            try:
                value = normalize_json(value)
            except (TypeError, ValueError) as error:
                raise Fail(f"result is not JSON: {error}") from error
        except KeyboardInterrupt:
            raise
        except BaseException as error:
            spent = ctx.attempt >= ctx.max_attempts or isinstance(error, Fail)
            kind = type(error)
            result.errors.append(
                TaskError(
                    exception_class_path=f"{kind.__module__}.{kind.__qualname__}",
                    traceback="".join(traceback.format_exception(error)),
                )
            )
            status = TaskResultStatus.FAILED if spent else TaskResultStatus.READY
            set_frozen(result, status=status)
            task_finished.send(sender=sender, task_result=result)
            raise
        set_frozen(result, status=TaskResultStatus.SUCCESSFUL, _return_value=value)
        task_finished.send(sender=sender, task_result=result)
        return value


def _validate_options(task: PgJobsTask) -> None:
    try:
        if task.max_attempts is not None:
            options.validate_max_attempts(task.max_attempts)
        if task.lease is not None:
            options.validate_lease(task.lease)
        options.validate_conflict_mode(task.on_conflict)
        if task.key is not None and not callable(task.key):
            options.validate_key(task.key)
    except InvalidJobOption as error:
        raise InvalidTask(str(error)) from None
    if not isinstance(task.atomic, bool):
        raise InvalidTask(f"atomic must be True or False, not {task.atomic!r}.")
    if task.atomic and _is_async(task):
        raise InvalidTask("An async task cannot run in transaction mode (atomic=True).")


def _is_async(task: Task[Any, Any]) -> bool:
    import inspect

    return inspect.iscoroutinefunction(task.func)


def _task_error(entry: dict[str, Any]) -> TaskError:
    """A TaskError for one failed attempt recorded in a job's `errors`."""
    exception = entry.get("exception")
    if not exception:
        exception = LAPSE_EXCEPTION if entry.get("error") == "lease lapsed" else ERROR_EXCEPTION
    return TaskError(
        exception_class_path=exception,
        traceback=entry.get("traceback") or str(entry.get("error") or ""),
    )


def _one_per_attempt(worker_ids: list[str], attempts: int) -> list[str]:
    """Worker ids, one per attempt: attempts whose record was dropped (ERRORS_KEPT) show
    as empty strings, and a claim handed back (its attempt refunded) is not counted."""
    if len(worker_ids) >= attempts:
        return worker_ids[len(worker_ids) - attempts :]
    return [*[""] * (attempts - len(worker_ids)), *worker_ids]
