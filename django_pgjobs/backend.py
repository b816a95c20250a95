"""A backend for Django's tasks framework: `@task` functions run on django_pgjobs workers.

    TASKS = {
        "default": {
            "BACKEND": "django_pgjobs.backend.PgJobsBackend",
            "QUEUES": ["default", "emails"],
            "OPTIONS": {"RESULT_RETENTION": 86400},
        }
    }

A task is a job whose kind is the task's module path. Enqueueing writes one job in the
caller's transaction (S1), its payload holding the call and the options of the variant
enqueued (task_payloads); the worker runs it like any job (leases, retries with the
queue's backoff, dead letters) and keeps its return value for RESULT_RETENTION. A result
is rebuilt from its row, from any process; docs/tasks.md has the whole contract.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from datetime import datetime, timedelta
from enum import Enum
from typing import Any, cast

from django.apps import apps
from django.core import checks

from django_pgjobs import options, registry
from django_pgjobs.claims import Failure, JobHandle
from django_pgjobs.compat import (
    BaseTaskBackend,
    InvalidTask,
    InvalidTaskBackend,
    Task,
    TaskContext,
    TaskError,
    TaskResult,
    TaskResultDoesNotExist,
    TaskResultStatus,
    normalize_json,
    set_frozen,
    task_backends,
    task_enqueued,
    task_finished,
    task_started,
)
from django_pgjobs.exceptions import Fail, InvalidJobOption, ResultNotJson
from django_pgjobs.payloads import safe_str
from django_pgjobs.records import JobRecord
from django_pgjobs.task_payloads import (
    StoredCall,
    is_stand_in,
    is_task_call,
    read_payload,
    rebuilt,
    stand_in,
    task_payload,
)

#: How long a task's return value is kept, unless OPTIONS["RESULT_RETENTION"] says.
DEFAULT_RESULT_RETENTION_S = 86_400
OPTION_NAMES = ("RESULT_RETENTION",)
LAPSE_EXCEPTION = "django_pgjobs.exceptions.LeaseLost"
ERROR_EXCEPTION = "builtins.Exception"

_STATUS = {
    "waiting": TaskResultStatus.READY,  # for its parents (S29)
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
        that workers of this process can run it.

        A module path is registered once, by its first task: the decorator's. Variants
        (`using()`, validated here too) are never registered: each job stores its own
        variant's options, and its run and its result rebuild that variant from them.
        """
        if is_stand_in(task):
            raise InvalidTask(
                f"Task {task.module_path} is not loaded in this process: import its "
                "module to enqueue it or make variants of it."
            )
        super().validate_task(task)
        try:
            options.validate_queue_name(task.queue_name)
            options.validate_kind(task.module_path)
        except InvalidJobOption as error:
            raise InvalidTask(str(error)) from None
        if isinstance(task, PgJobsTask):
            _validate_options(task)
        definition = registry.get_definition(task.module_path)
        if definition is None or not isinstance(definition.func, TaskRunner):
            registry.register(
                registry.JobDefinition(
                    kind=task.module_path,
                    func=TaskRunner(task, type(self)),
                    # The task's queue is one its workers serve by default.
                    defaults={"queue": task.queue_name},
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
        payload = task_payload(task, args_list, kwargs_dict, self.alias)
        try:
            written = Job.objects.enqueue(task.module_path, payload, **enqueue_options)
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
        """Read a task's result from the live or the dead table, with the task it was
        enqueued as (a stand-in when this process has not loaded its module).

        Raises:
            TaskResultDoesNotExist: no job has this id, or it is a plain job's.
        """
        from django_pgjobs.models import Job

        try:
            job_id = int(result_id)
        except (TypeError, ValueError):
            raise TaskResultDoesNotExist(result_id) from None
        record = Job.objects.get_job(job_id)
        if record is None:
            raise TaskResultDoesNotExist(result_id)
        return _result_of(record, self.alias)

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


def _result_of(record: JobRecord, alias: str) -> TaskResult[Any, Any]:
    """A job's result as its row says now (`alias`: the reading backend's, which a job
    stored before tasks kept their options reads with when its task is not loaded)."""
    task, call = _task_and_call(record, alias)
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
        args=call.args,
        kwargs=call.kwargs,
        backend=call.options["backend"],
        errors=[_task_error(entry) for entry in errors],
        worker_ids=_one_per_attempt(worker_ids, record.attempts),
    )
    if record.state == "done":
        set_frozen(result, _return_value=record.result)
    return result


def _task_and_call(record: JobRecord, alias: str) -> tuple[Task[Any, Any], StoredCall]:
    """The variant a job's task was enqueued as, and its call; a stand-in task when this
    process has not loaded the task's module (never an import of the stored path)."""
    definition = registry.get_definition(record.kind)
    if definition is not None and isinstance(definition.func, TaskRunner):
        return definition.func.variant(record.payload, queue=record.queue, priority=record.priority)
    if definition is None and is_task_call(record.payload):
        call = read_payload(
            record.payload, queue=record.queue, priority=record.priority, alias=alias
        )
        return stand_in(PgJobsTask, record.kind, call.options), call
    raise TaskResultDoesNotExist(
        f"Job {record.id} ({record.kind!r}) is not a task's: its kind is a plain job's, "
        "or its payload has no task arguments. Read it with Job.objects.get_job()."
    )


class TaskRunner:
    """The handler of a task's jobs: run the variant a job was enqueued as, as Django's
    backends run a task, with task_started before it and task_finished once its outcome
    is saved.

    `task` is the task the module path was registered with (the decorator's); each job
    brings its own variant's options (task_payloads).
    """

    def __init__(self, task: Task[Any, Any], backend_class: type[BaseTaskBackend]) -> None:
        self.task = task
        self.backend_class = backend_class
        # The registry tells one function from another by these (registry._same_function).
        self.__module__ = task.func.__module__
        self.__qualname__ = task.func.__qualname__

    def variant(
        self, payload: object, *, queue: str, priority: int
    ) -> tuple[Task[Any, Any], StoredCall]:
        """The variant a job of this task was enqueued as, and its call, from its payload
        (and, for a job stored before tasks kept their options, its queue and priority)."""
        call = read_payload(payload, queue=queue, priority=priority, alias=self.task.backend)
        return rebuilt(self.task, **call.options), call

    def __call__(
        self, ctx: JobHandle, args: object = None, kwargs: object = None, task: object = None
    ) -> Any:
        """Run one attempt. `args`, `kwargs` and `task` are the payload's keys, named so
        that a payload with others is refused (S27); they are read from `ctx.payload`."""
        variant, call = self.variant(ctx.payload, queue=ctx.queue, priority=ctx.priority)
        if call.problems:
            raise Fail(f"the task's payload cannot be read: {'; '.join(call.problems)}")
        backend = call.options["backend"]
        sender = self._sender(backend)
        running: TaskResult[Any, Any] = TaskResult(
            task=variant,
            id=str(ctx.id),
            status=TaskResultStatus.RUNNING,
            enqueued_at=ctx.created_at,
            started_at=ctx.claimed_at,
            finished_at=None,
            last_attempted_at=ctx.claimed_at,
            args=call.args,
            kwargs=call.kwargs,
            backend=backend,
            errors=[],
            # One id per attempt; earlier attempts' workers are read by get_result().
            worker_ids=[*[""] * (ctx.attempt - 1), ctx.worker_id],
        )
        finished = TaskFinished(ctx, running, sender)
        ctx.after_recorded.append(finished)
        try:
            task_started.send(sender=sender, task_result=running)
            if variant.takes_context:
                value = variant.call(TaskContext(task_result=running), *call.args, **call.kwargs)
            else:
                value = variant.call(*call.args, **call.kwargs)
            try:
                value = normalize_json(value)
            except Exception as error:  # whatever a hostile value raises, not only TypeError
                raise ResultNotJson(f"result is not JSON: {safe_str(error)}") from error
        except ResultNotJson as error:
            finished.error = error.__cause__ or error
            raise
        except BaseException as error:  # KeyboardInterrupt and SystemExit too (the executor's)
            finished.error = error
            raise
        finished.value = value
        return value

    def _sender(self, alias: str) -> type[BaseTaskBackend]:
        """The class of the backend `alias`, as Django's backends send their signals;
        this task's own backend's when this process's settings have no such alias."""
        try:
            return type(task_backends[alias])
        except InvalidTaskBackend:
            return self.backend_class


class _Unread(Enum):
    """A job not read yet (None is a job that is gone)."""

    UNREAD = "unread"


class TaskFinished:
    """task_finished for one attempt of a task, sent once the attempt's outcome is saved
    (a JobHandle.after_recorded callback: the worker runs it), with what get_result()
    reads then: SUCCESSFUL or FAILED with finished_at set, or READY for a retry."""

    def __init__(
        self, handle: JobHandle, running: TaskResult[Any, Any], sender: type[BaseTaskBackend]
    ) -> None:
        self.handle = handle
        self.running = running
        self.sender = sender
        self.value: Any = None
        self.error: BaseException | None = None
        #: The job as stored once the outcome was saved, read with a batch of others,
        #: and the database's time then, for a job that is gone (no result retention).
        self.saved: JobRecord | _Unread | None = _Unread.UNREAD
        self.gone_at: datetime | None = None

    @classmethod
    def prepare_batch(cls, batch: list[TaskFinished]) -> None:
        """Read the jobs of a batch of attempts saved together, in one query per
        database, rather than one each (claims.run_after_recorded)."""
        from django_pgjobs.models import Job

        by_database: dict[str, list[TaskFinished]] = {}
        for finished in batch:
            by_database.setdefault(finished.handle.using, []).append(finished)
        for using, attempts in by_database.items():
            found = Job.objects.get_jobs([f.handle.id for f in attempts], using=using)
            gone_at = None if len(found) == len(attempts) else Job.objects.clock(using=using)
            for finished in attempts:
                finished.saved = found.get(finished.handle.id)
                finished.gone_at = gone_at

    def __call__(self) -> None:
        result = self._saved_result()
        if result is None:
            return
        if self.error is None:
            task_finished.send(sender=self.sender, task_result=result)
            return
        try:
            raise self.error
        except BaseException:
            # Django's receivers read the error from sys.exc_info() (log_task_finished):
            # its backends send task_finished inside the except block, and so does this.
            task_finished.send(sender=self.sender, task_result=result)

    def _saved_result(self) -> TaskResult[Any, Any] | None:
        """What get_result() reads now; None when another claim holds the job (this
        attempt's claim lapsed before its outcome was saved: the job runs again)."""
        from django_pgjobs.models import Job

        saved = self.saved
        if saved is _Unread.UNREAD:
            saved = Job.objects.get_job(self.handle.id, using=self.handle.using)
        if saved is None:
            return self._unkept_result()
        try:
            result = _result_of(saved, self.running.backend)
        except TaskResultDoesNotExist:  # the row was edited into a plain job's meanwhile
            return None
        return None if result.status == TaskResultStatus.RUNNING else result

    def _unkept_result(self) -> TaskResult[Any, Any]:
        """The attempt's own result, for a job whose row is gone once its outcome was
        saved (no result retention, or cancelled meanwhile)."""
        from django_pgjobs.models import Job

        result = self.running
        finished_at = self.gone_at or Job.objects.clock(using=self.handle.using)
        if self.error is None:
            set_frozen(
                result,
                status=TaskResultStatus.SUCCESSFUL,
                finished_at=finished_at,
                _return_value=self.value,
            )
        else:
            failure = Failure.from_exception(self.error)
            result.errors.append(
                TaskError(
                    exception_class_path=failure.exception or ERROR_EXCEPTION,
                    traceback=failure.traceback or failure.error,
                )
            )
            set_frozen(result, status=TaskResultStatus.FAILED, finished_at=finished_at)
        return result


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
