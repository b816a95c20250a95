"""Django's own tests of django.tasks (Django 6.1.3, tests/tasks/), ported to
PgJobsBackend with its real worker: the facts they check, not their code.

Each test names the upstream test it ports in its docstring; docs/tasks.md has the table
of all 85 upstream tests (ported, adapted and why, or left out and why), and
tests/unit/test_tasks_docs.py holds the table to this file. Where Django's test reads
the dummy backend's memory, this reads the row; where the immediate backend runs the
task inside enqueue(), a burst worker runs it. Async tests run their coroutines under
asyncio.run(). They run on Django 6.1 and on 5.2 with the django-tasks backport.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import pickle
import re
from collections.abc import Coroutine, Iterator
from datetime import datetime
from typing import Any
from unittest import mock

import psycopg
import pytest
from django.db import transaction
from django.test import override_settings
from django.utils import timezone
from django.utils.module_loading import import_string

from django_pgjobs.backend import PgJobsBackend, PgJobsTask
from django_pgjobs.compat import (
    TASK_MAX_PRIORITY,
    TASK_MIN_PRIORITY,
    TASKS_PACKAGE,
    InvalidTask,
    InvalidTaskBackend,
    Task,
    TaskResultDoesNotExist,
    TaskResultMismatch,
    TaskResultStatus,
    default_task_backend,
    task,
    task_backends,
)
from django_pgjobs.worker import Worker
from tests import upstream_tasks as test_tasks
from tests.helpers import conninfo, count

pytestmark = pytest.mark.django_db(transaction=True)

BACKEND = "django_pgjobs.backend.PgJobsBackend"
#: Django's TaskTestCase settings, with PgJobsBackend for the dummy and immediate ones.
TASKS = {
    "default": {"BACKEND": BACKEND, "QUEUES": ["default", "queue_1"]},
    "any_queue": {"BACKEND": BACKEND, "QUEUES": []},
    "missing": {"BACKEND": "does.not.exist"},
}
#: The settings of Django's ImmediateBackendTestCase and DummyBackendTestCase.
ANY_QUEUE = {"default": {"BACKEND": BACKEND, "QUEUES": []}}
#: Django 6.1 pickles tasks by module path; the backport (django-tasks 0.12) does not.
PICKLES_TASKS = hasattr(Task, "_reconstruct")
ON_DJANGO_6 = TASKS_PACKAGE == "django.tasks"
#: Where the framework's own signal receivers log ("django.tasks"; the backport's name).
LOGGER = "django.tasks" if ON_DJANGO_6 else "django_tasks"


@pytest.fixture(autouse=True)
def upstream_settings(request: pytest.FixtureRequest) -> Iterator[None]:
    """The TASKS of the upstream test case a class ports (its TASKS attribute)."""
    with override_settings(TASKS=getattr(request.cls, "TASKS", TASKS), USE_TZ=True):
        yield


def work() -> Worker:
    """What the immediate backend does inside enqueue(): here a burst worker runs it."""
    worker = Worker(queues=["default", "queue_1"], burst=True, concurrency=1, sweep_interval=0)
    assert worker.run() == 0
    return worker


def run(coroutine: Coroutine[Any, Any, Any]) -> Any:
    """Run an async test's body, then close the connection its database calls used."""
    from asgiref.sync import sync_to_async
    from django.db import connections

    async def body_then_close() -> Any:
        try:
            return await coroutine
        finally:
            await sync_to_async(connections.close_all, thread_sensitive=True)()

    return asyncio.run(body_then_close())


def framework_records(caplog: pytest.LogCaptureFixture) -> list[logging.LogRecord]:
    return [record for record in caplog.records if record.name == LOGGER]


def formatted(record: logging.LogRecord) -> str:
    """A log record as assertLogs shows it: its message and its traceback."""
    return logging.Formatter("%(levelname)s:%(name)s:%(message)s").format(record)


# tests/tasks/test_tasks.py: TaskTestCase ---------------------------------------------------


class TestTaskApi:
    def test_using_correct_backend(self) -> None:
        """Ports test_tasks, test_immediate_backend, test_dummy_backend and
        test_custom_backend: test_using_correct_backend."""
        assert default_task_backend == task_backends["default"]
        assert isinstance(task_backends["default"], PgJobsBackend)
        assert default_task_backend.alias == "default"
        assert default_task_backend.options == {}

    def test_task_decorator(self) -> None:
        """Ports test_tasks.TaskTestCase.test_task_decorator."""
        assert isinstance(test_tasks.noop_task, Task)
        assert isinstance(test_tasks.noop_task_async, Task)
        assert isinstance(test_tasks.noop_task_from_bare_decorator, Task)

    def test_enqueue_task(self) -> None:
        """Ports test_tasks.TaskTestCase.test_enqueue_task: the result stored is the row."""
        result = test_tasks.noop_task.enqueue()
        assert result.status == TaskResultStatus.READY
        assert result.task == test_tasks.noop_task
        assert (result.args, result.kwargs) == ([], {})
        assert default_task_backend.get_result(result.id) == result

    def test_enqueue_task_async(self) -> None:
        """Ports test_tasks.TaskTestCase.test_enqueue_task_async."""

        async def scenario() -> Any:
            result = await test_tasks.noop_task.aenqueue()
            assert await default_task_backend.aget_result(result.id) == result
            return result

        result = run(scenario())
        assert result.status == TaskResultStatus.READY
        assert result.task == test_tasks.noop_task
        assert (result.args, result.kwargs) == ([], {})

    def test_enqueue_with_invalid_argument(self) -> None:
        """Ports test_tasks.TaskTestCase.test_enqueue_with_invalid_argument; nothing is
        written either."""
        with pytest.raises(TypeError, match=re.escape("Unsupported type")):
            test_tasks.noop_task.enqueue(datetime.now())
        assert count() == 0

    def test_aenqueue_with_invalid_argument(self) -> None:
        """Ports test_tasks.TaskTestCase.test_aenqueue_with_invalid_argument."""
        with pytest.raises(TypeError, match=re.escape("Unsupported type")):
            run(test_tasks.noop_task.aenqueue(datetime.now()))
        assert count() == 0

    def test_using_priority(self) -> None:
        """Ports test_tasks.TaskTestCase.test_using_priority."""
        assert test_tasks.noop_task.priority == 0
        assert test_tasks.noop_task.using(priority=1).priority == 1
        assert test_tasks.noop_task.priority == 0

    def test_using_queue_name(self) -> None:
        """Ports test_tasks.TaskTestCase.test_using_queue_name."""
        assert test_tasks.noop_task.queue_name == "default"
        assert test_tasks.noop_task.using(queue_name="queue_1").queue_name == "queue_1"
        assert test_tasks.noop_task.queue_name == "default"

    def test_using_run_after(self) -> None:
        """Ports test_tasks.TaskTestCase.test_using_run_after."""
        now = timezone.now()
        assert test_tasks.noop_task.run_after is None
        assert test_tasks.noop_task.using(run_after=now).run_after == now
        assert test_tasks.noop_task.run_after is None

    def test_using_unknown_backend(self) -> None:
        """Ports test_tasks.TaskTestCase.test_using_unknown_backend."""
        assert test_tasks.noop_task.backend == "default"
        with pytest.raises(
            InvalidTaskBackend, match=re.escape("The connection 'unknown' doesn't exist.")
        ):
            test_tasks.noop_task.using(backend="unknown")

    def test_using_missing_backend(self) -> None:
        """Ports test_tasks.TaskTestCase.test_using_missing_backend."""
        assert test_tasks.noop_task.backend == "default"
        with pytest.raises(
            InvalidTaskBackend,
            match=re.escape("Could not find backend 'does.not.exist': No module named 'does'"),
        ):
            test_tasks.noop_task.using(backend="missing")

    def test_using_creates_new_instance(self) -> None:
        """Ports test_tasks.TaskTestCase.test_using_creates_new_instance."""
        new_task = test_tasks.noop_task.using()
        assert new_task == test_tasks.noop_task
        assert new_task is not test_tasks.noop_task

    def test_chained_using(self) -> None:
        """Ports test_tasks.TaskTestCase.test_chained_using."""
        now = timezone.now()
        run_after_task = test_tasks.noop_task.using(run_after=now)
        assert run_after_task.run_after == now
        priority_task = run_after_task.using(priority=10)
        assert (priority_task.priority, priority_task.run_after) == (10, now)
        assert run_after_task.priority == 0

    def test_refresh_result(self) -> None:
        """Ports test_tasks.TaskTestCase.test_refresh_result: refreshing a result that
        did not change changes nothing."""

        async def scenario() -> None:
            result = await test_tasks.noop_task.aenqueue()
            original = dataclasses.asdict(result)
            await result.arefresh()
            assert dataclasses.asdict(result) == original

        run(scenario())
        result = test_tasks.noop_task.enqueue()
        original = dataclasses.asdict(result)
        result.refresh()
        assert dataclasses.asdict(result) == original

    def test_naive_datetime(self) -> None:
        """Ports test_tasks.TaskTestCase.test_naive_datetime."""
        with pytest.raises(InvalidTask, match=re.escape("run_after must be an aware datetime.")):
            test_tasks.noop_task.using(run_after=datetime.now())

    def test_invalid_priority(self) -> None:
        """Ports test_tasks.TaskTestCase.test_invalid_priority."""
        message = (
            f"priority must be a whole number between {TASK_MIN_PRIORITY} and {TASK_MAX_PRIORITY}."
        )
        for priority in (-101, 101, 3.1):
            with pytest.raises(InvalidTask, match=re.escape(message)):
                test_tasks.noop_task.using(priority=priority)
        for priority in (100, -100, 0):
            assert test_tasks.noop_task.using(priority=priority).priority == priority

    def test_unknown_queue_name(self) -> None:
        """Ports test_tasks.TaskTestCase.test_unknown_queue_name; a second PgJobsBackend
        alias with QUEUES = [] stands in for the immediate backend."""
        with pytest.raises(
            InvalidTask, match=re.escape("Queue 'queue-2' is not valid for backend.")
        ):
            test_tasks.noop_task.using(queue_name="queue-2")
        # Validation is bypassed when the backend QUEUES is an empty list.
        variant = test_tasks.noop_task.using(queue_name="queue-2", backend="any_queue")
        assert variant.queue_name == "queue-2"

    def test_call_task(self) -> None:
        """Ports test_tasks.TaskTestCase.test_call_task."""
        assert test_tasks.calculate_meaning_of_life.call() == 42

    def test_call_task_async(self) -> None:
        """Ports test_tasks.TaskTestCase.test_call_task_async."""
        assert run(test_tasks.calculate_meaning_of_life.acall()) == 42

    def test_call_async_task(self) -> None:
        """Ports test_tasks.TaskTestCase.test_call_async_task."""
        assert run(test_tasks.noop_task_async.acall()) is None

    def test_call_async_task_sync(self) -> None:
        """Ports test_tasks.TaskTestCase.test_call_async_task_sync."""
        assert test_tasks.noop_task_async.call() is None

    def test_get_result(self) -> None:
        """Ports test_tasks.TaskTestCase.test_get_result and
        test_dummy_backend.DummyBackendTestCase.test_get_result."""
        result = default_task_backend.enqueue(test_tasks.noop_task, (), {})
        assert test_tasks.noop_task.get_result(result.id) == result
        assert default_task_backend.get_result(result.id) == result

    def test_get_result_async(self) -> None:
        """Ports test_tasks.TaskTestCase.test_get_result_async and
        test_dummy_backend.DummyBackendTestCase.test_get_result_async."""

        async def scenario() -> None:
            result = await default_task_backend.aenqueue(test_tasks.noop_task, (), {})
            assert await test_tasks.noop_task.aget_result(result.id) == result
            assert await default_task_backend.aget_result(result.id) == result

        run(scenario())

    def test_get_missing_result(self) -> None:
        """Ports test_tasks.TaskTestCase.test_get_missing_result and
        test_dummy_backend.DummyBackendTestCase.test_get_missing_result."""
        with pytest.raises(TaskResultDoesNotExist):
            test_tasks.noop_task.get_result("123")
        with pytest.raises(TaskResultDoesNotExist):
            default_task_backend.get_result("123")
        with pytest.raises(TaskResultDoesNotExist):
            run(test_tasks.noop_task.aget_result("123"))
        with pytest.raises(TaskResultDoesNotExist):
            run(default_task_backend.aget_result("123"))

    def test_get_incorrect_result(self) -> None:
        """Ports test_tasks.TaskTestCase.test_get_incorrect_result."""
        result = default_task_backend.enqueue(test_tasks.noop_task_async, (), {})
        with pytest.raises(TaskResultMismatch, match=re.escape("Task does not match")):
            test_tasks.noop_task.get_result(result.id)

    def test_get_incorrect_result_async(self) -> None:
        """Ports test_tasks.TaskTestCase.test_get_incorrect_result_async."""

        async def scenario() -> None:
            result = await default_task_backend.aenqueue(test_tasks.noop_task_async, (), {})
            await test_tasks.noop_task.aget_result(result.id)

        with pytest.raises(TaskResultMismatch, match=re.escape("Task does not match")):
            run(scenario())

    def test_invalid_function(self) -> None:
        """Ports test_tasks.TaskTestCase.test_invalid_function."""
        for invalid_function in (any, self.test_invalid_function):
            with pytest.raises(
                InvalidTask, match=re.escape("Task function must be defined at a module")
            ):
                task()(invalid_function)

    def test_get_backend(self) -> None:
        """Ports test_tasks.TaskTestCase.test_get_backend (any_queue for immediate)."""
        assert test_tasks.noop_task.backend == "default"
        assert isinstance(test_tasks.noop_task.get_backend(), PgJobsBackend)
        other = test_tasks.noop_task.using(backend="any_queue")
        assert other.backend == "any_queue"
        assert other.get_backend() is task_backends["any_queue"]

    def test_name(self) -> None:
        """Ports test_tasks.TaskTestCase.test_name."""
        assert test_tasks.noop_task.name == "noop_task"
        assert test_tasks.noop_task_async.name == "noop_task_async"

    def test_module_path(self) -> None:
        """Ports test_tasks.TaskTestCase.test_module_path (this suite's module path)."""
        assert test_tasks.noop_task.module_path == "tests.upstream_tasks.noop_task"
        assert test_tasks.noop_task_async.module_path == "tests.upstream_tasks.noop_task_async"
        assert import_string(test_tasks.noop_task.module_path) is test_tasks.noop_task
        assert import_string(test_tasks.noop_task_async.module_path) is test_tasks.noop_task_async

    @pytest.mark.skipif(not PICKLES_TASKS, reason="the django-tasks backport pickles no tasks")
    def test_pickle_task(self) -> None:
        """Ports test_tasks.TaskTestCase.test_pickle_task."""
        assert pickle.loads(pickle.dumps(test_tasks.noop_task)) == test_tasks.noop_task

    @pytest.mark.skipif(not PICKLES_TASKS, reason="the django-tasks backport pickles no tasks")
    def test_unpickle_arbitrary_string(self) -> None:
        """Ports test_tasks.TaskTestCase.test_unpickle_arbitrary_string."""
        with pytest.raises(
            ValueError, match=re.escape("'does.not.exist.fake_task' to point to a Task")
        ):
            PgJobsTask._reconstruct({"func": "does.not.exist.fake_task"})  # type: ignore[attr-defined]

    @pytest.mark.skipif(not PICKLES_TASKS, reason="the django-tasks backport pickles no tasks")
    def test_unpickle_non_task_object(self) -> None:
        """Ports test_tasks.TaskTestCase.test_unpickle_non_task_object."""
        with pytest.raises(
            ValueError, match=re.escape("'builtins.any' to point to a Task instance.")
        ):
            PgJobsTask._reconstruct({"func": "builtins.any"})  # type: ignore[attr-defined]

    @pytest.mark.skipif(not PICKLES_TASKS, reason="the django-tasks backport pickles no tasks")
    def test_pickle_task_result(self) -> None:
        """Ports test_tasks.TaskTestCase.test_pickle_task_result; a result read back from
        its row pickles as well."""
        result = test_tasks.noop_task.enqueue()
        assert pickle.loads(pickle.dumps(result)) == result
        read = default_task_backend.get_result(result.id)
        assert pickle.loads(pickle.dumps(read)) == read

    def test_no_backends(self) -> None:
        """Ports test_tasks.TaskTestCase.test_no_backends."""
        with override_settings(TASKS={}), pytest.raises(InvalidTaskBackend):
            test_tasks.noop_task.enqueue()

    def test_task_error_invalid_exception(self) -> None:
        """Ports test_tasks.TaskTestCase.test_task_error_invalid_exception: the failed
        result comes from a worker and its row, not from the immediate backend."""
        result = test_tasks.failing_task_value_error.enqueue()
        work()
        (error,) = test_tasks.failing_task_value_error.get_result(result.id).errors
        object.__setattr__(error, "exception_class_path", "subprocess.run")
        with pytest.raises(
            ValueError, match=re.escape("'subprocess.run' does not reference a valid")
        ):
            error.exception_class  # noqa: B018

    def test_task_error_unknown_module(self) -> None:
        """Ports test_tasks.TaskTestCase.test_task_error_unknown_module (a worker's
        failure, read from its row)."""
        result = test_tasks.failing_task_value_error.enqueue()
        work()
        (error,) = test_tasks.failing_task_value_error.get_result(result.id).errors
        object.__setattr__(error, "exception_class_path", "does.not.exist")
        with pytest.raises(ImportError):
            error.exception_class  # noqa: B018

    def test_takes_context_without_taking_context(self) -> None:
        """Ports test_tasks.TaskTestCase.test_takes_context_without_taking_context."""
        with pytest.raises(
            InvalidTask,
            match=re.escape("Task takes context but does not have a first argument of 'context'."),
        ):
            task(takes_context=True)(test_tasks.calculate_meaning_of_life.func)

    def test_run_after_in_decorator(self) -> None:
        """Ports test_tasks.TaskTestCase.test_run_after_in_decorator (the backport also
        refuses it, with Python's own message)."""
        message = (
            "run_after cannot be defined statically with the @task decorator."
            if ON_DJANGO_6
            else "multiple values for keyword argument 'run_after'"
        )
        with pytest.raises(TypeError, match=re.escape(message)):
            task(run_after=timezone.now())(test_tasks.calculate_meaning_of_life.func)


# tests/tasks/test_immediate_backend.py: what running a task does, here by a worker -------


class TestRunningTasks:
    TASKS = ANY_QUEUE

    @pytest.mark.parametrize("name", ["noop_task", "noop_task_async"])
    def test_enqueue_task(self, name: str) -> None:
        """Ports test_immediate_backend.ImmediateBackendTestCase.test_enqueue_task."""
        chosen = getattr(test_tasks, name)
        enqueued = chosen.enqueue(1, two=3)
        work()
        result = chosen.get_result(enqueued.id)
        assert result.status == TaskResultStatus.SUCCESSFUL
        assert result.is_finished is True
        assert None not in (result.started_at, result.last_attempted_at, result.finished_at)
        assert result.started_at >= result.enqueued_at
        assert result.finished_at >= result.started_at
        assert result.return_value is None
        assert result.task == chosen
        assert (result.args, result.kwargs) == ([1], {"two": 3})
        assert result.attempts == 1

    @pytest.mark.parametrize("name", ["noop_task", "noop_task_async"])
    def test_enqueue_task_async(self, name: str) -> None:
        """Ports test_immediate_backend.ImmediateBackendTestCase.test_enqueue_task_async."""
        chosen = getattr(test_tasks, name)
        enqueued = run(chosen.aenqueue())
        work()

        async def read() -> Any:
            await enqueued.arefresh()
            return enqueued

        result = run(read())
        assert (result.status, result.is_finished) == (TaskResultStatus.SUCCESSFUL, True)
        assert None not in (result.started_at, result.last_attempted_at, result.finished_at)
        assert result.finished_at >= result.started_at >= result.enqueued_at
        assert result.return_value is None
        assert result.task == chosen
        assert (result.args, result.kwargs, result.attempts) == ([], {}, 1)

    @pytest.mark.parametrize(
        ("name", "exception", "message"),
        [
            ("failing_task_value_error", ValueError, "This Task failed due to ValueError"),
            ("failing_task_system_exit", SystemExit, "This Task failed due to SystemExit"),
        ],
    )
    def test_catches_exception(
        self,
        caplog: pytest.LogCaptureFixture,
        name: str,
        exception: type[BaseException],
        message: str,
    ) -> None:
        """Ports test_immediate_backend.ImmediateBackendTestCase.test_catches_exception:
        the worker catches it, and django.tasks logs it once, with its traceback."""
        chosen = getattr(test_tasks, name)
        enqueued = chosen.enqueue()
        with caplog.at_level(logging.ERROR, logger=LOGGER):
            work()
        errors = [r for r in framework_records(caplog) if r.levelno >= logging.ERROR]
        assert len(errors) == 1
        assert message in formatted(errors[0])
        result = chosen.get_result(enqueued.id)
        assert result.status == TaskResultStatus.FAILED
        with pytest.raises(ValueError, match=re.escape("Task failed")):
            result.return_value  # noqa: B018
        assert result.is_finished is True
        assert None not in (result.started_at, result.last_attempted_at, result.finished_at)
        assert result.finished_at >= result.started_at >= result.enqueued_at
        assert result.errors[0].exception_class is exception
        assert result.errors[0].traceback.endswith(f"{exception.__name__}: {message}\n")
        assert result.task == chosen
        assert (result.args, result.kwargs) == ([], {})

    def test_throws_keyboard_interrupt(self) -> None:
        """Adapts test_immediate_backend.ImmediateBackendTestCase.test_throws_keyboard_interrupt:
        enqueue() runs nothing, so nothing is raised to its caller; a worker meeting the
        KeyboardInterrupt of a task (not of its user: it handles SIGINT itself) fails the
        task with it, and goes on with the next."""
        interrupted = test_tasks.failing_task_keyboard_interrupt.enqueue()
        after = test_tasks.calculate_meaning_of_life.enqueue()
        work()
        result = test_tasks.failing_task_keyboard_interrupt.get_result(interrupted.id)
        assert result.status == TaskResultStatus.FAILED
        assert result.errors[0].exception_class is KeyboardInterrupt
        assert test_tasks.calculate_meaning_of_life.get_result(after.id).return_value == 42

    def test_complex_exception(self, caplog: pytest.LogCaptureFixture) -> None:
        """Ports test_immediate_backend.ImmediateBackendTestCase.test_complex_exception."""
        enqueued = test_tasks.complex_exception.enqueue()
        with caplog.at_level(logging.ERROR, logger=LOGGER):
            work()
        assert [r.levelno for r in framework_records(caplog)] == [logging.ERROR]
        result = test_tasks.complex_exception.get_result(enqueued.id)
        assert result.status == TaskResultStatus.FAILED
        with pytest.raises(ValueError, match=re.escape("Task failed")):
            result.return_value  # noqa: B018
        assert None not in (result.started_at, result.last_attempted_at, result.finished_at)
        assert result.finished_at >= result.started_at >= result.enqueued_at
        assert result._return_value is None
        assert result.errors[0].exception_class is ValueError
        assert 'ValueError(ValueError("This task failed"))' in result.errors[0].traceback
        assert result.task == test_tasks.complex_exception
        assert (result.args, result.kwargs) == ([], {})

    def test_complex_return_value(self, caplog: pytest.LogCaptureFixture) -> None:
        """Ports test_immediate_backend.ImmediateBackendTestCase.test_complex_return_value."""
        enqueued = test_tasks.complex_return_value.enqueue()
        with caplog.at_level(logging.ERROR, logger=LOGGER):
            work()
        assert [r.levelno for r in framework_records(caplog)] == [logging.ERROR]
        result = test_tasks.complex_return_value.get_result(enqueued.id)
        assert result.status == TaskResultStatus.FAILED
        assert None not in (result.started_at, result.last_attempted_at, result.finished_at)
        assert result.finished_at >= result.started_at >= result.enqueued_at
        assert result._return_value is None  # type: ignore[attr-defined]
        assert result.errors[0].exception_class is TypeError
        assert "Unsupported type" in result.errors[0].traceback

    def test_result(self) -> None:
        """Ports test_immediate_backend.ImmediateBackendTestCase.test_result."""
        enqueued = default_task_backend.enqueue(test_tasks.calculate_meaning_of_life, [], {})
        work()
        enqueued.refresh()
        assert (enqueued.status, enqueued.return_value) == (TaskResultStatus.SUCCESSFUL, 42)

    def test_result_async(self) -> None:
        """Ports test_immediate_backend.ImmediateBackendTestCase.test_result_async."""
        enqueued = run(default_task_backend.aenqueue(test_tasks.calculate_meaning_of_life, [], {}))
        work()
        result = run(default_task_backend.aget_result(enqueued.id))
        assert (result.status, result.return_value) == (TaskResultStatus.SUCCESSFUL, 42)

    def test_enqueue_logs(self, caplog: pytest.LogCaptureFixture) -> None:
        """Ports test_immediate_backend.ImmediateBackendTestCase.test_enqueue_logs: the
        three lines of a task's life, enqueue to success."""
        with caplog.at_level(logging.DEBUG, logger=LOGGER):
            result = test_tasks.noop_task.enqueue()
            work()
        lines = [record.getMessage() for record in framework_records(caplog)]
        assert len(lines) == 3, lines
        assert "enqueued" in lines[0] and result.id in lines[0]
        assert "state=RUNNING" in lines[1] and result.id in lines[1]
        assert "state=SUCCESSFUL" in lines[2] and result.id in lines[2]

    def test_failed_logs(self, caplog: pytest.LogCaptureFixture) -> None:
        """Ports test_immediate_backend.ImmediateBackendTestCase.test_failed_logs."""
        with caplog.at_level(logging.DEBUG, logger=LOGGER):
            result = test_tasks.failing_task_value_error.enqueue()
            work()
        lines = [record.getMessage() for record in framework_records(caplog)]
        assert len(lines) == 3, lines
        assert "state=RUNNING" in lines[1] and result.id in lines[1]
        assert "state=FAILED" in lines[2] and result.id in lines[2]

    def test_successful_task_no_none_in_logs(self, caplog: pytest.LogCaptureFixture) -> None:
        """Ports test_immediate_backend.ImmediateBackendTestCase
        .test_successful_task_no_none_in_logs."""
        with caplog.at_level(logging.DEBUG, logger=LOGGER):
            result = test_tasks.noop_task.enqueue()
            work()
        assert test_tasks.noop_task.get_result(result.id).status == TaskResultStatus.SUCCESSFUL
        lines = [record.getMessage() for record in framework_records(caplog)]
        assert lines and all("None" not in line for line in lines)

    def test_takes_context(self) -> None:
        """Ports test_immediate_backend.ImmediateBackendTestCase.test_takes_context."""
        result = test_tasks.get_task_id.enqueue()
        work()
        result.refresh()
        assert result.return_value == result.id

    def test_context(self) -> None:
        """Ports test_immediate_backend.ImmediateBackendTestCase.test_context."""
        result = test_tasks.test_context.enqueue(1)
        work()
        result.refresh()
        assert result.status == TaskResultStatus.SUCCESSFUL, result.errors

    def test_validate_on_enqueue(self) -> None:
        """Ports test_immediate_backend and test_dummy_backend: test_validate_on_enqueue."""
        with_custom_queue = test_tasks.noop_task.using(queue_name="unknown_queue")
        with (
            override_settings(TASKS={"default": {"BACKEND": BACKEND, "QUEUES": ["queue-1"]}}),
            pytest.raises(
                InvalidTask, match=re.escape("Queue 'unknown_queue' is not valid for backend")
            ),
        ):
            with_custom_queue.enqueue()
        assert count() == 0

    def test_validate_on_aenqueue(self) -> None:
        """Ports test_immediate_backend and test_dummy_backend: test_validate_on_aenqueue."""
        with_custom_queue = test_tasks.noop_task.using(queue_name="unknown_queue")
        with (
            override_settings(TASKS={"default": {"BACKEND": BACKEND, "QUEUES": ["queue-1"]}}),
            pytest.raises(
                InvalidTask, match=re.escape("Queue 'unknown_queue' is not valid for backend")
            ),
        ):
            run(with_custom_queue.aenqueue())
        assert count() == 0

    def test_waits_for_the_transaction_to_commit(self) -> None:
        """Adapts test_immediate_backend and test_dummy_backend:
        test_doesnt_wait_until_transaction_commit_by_default, to the opposite: the task is
        a row of the caller's transaction (S1), there for other connections only once it
        commits, and gone with it if it rolls back."""
        with psycopg.connect(**conninfo(), autocommit=True) as other:

            def seen() -> int:
                row = other.execute("SELECT count(*) FROM pgjobs_job").fetchone()
                return int(row[0]) if row else 0

            with transaction.atomic():
                result = test_tasks.noop_task.enqueue()
                assert result.enqueued_at is not None
                assert result.status == TaskResultStatus.READY
                assert seen() == 0
            assert seen() == 1
            with pytest.raises(RuntimeError), transaction.atomic():
                test_tasks.noop_task.enqueue()
                raise RuntimeError("the request failed")
            assert seen() == 1


# tests/tasks/test_dummy_backend.py: what an enqueued, not yet run, task reads as ---------


class TestEnqueuedTasks:
    TASKS = ANY_QUEUE

    @pytest.mark.parametrize("name", ["noop_task", "noop_task_async"])
    def test_enqueue_task(self, name: str) -> None:
        """Ports test_dummy_backend.DummyBackendTestCase.test_enqueue_task."""
        chosen = getattr(test_tasks, name)
        result = chosen.enqueue(1, two=3)
        assert result.status == TaskResultStatus.READY
        assert result.is_finished is False
        assert (result.started_at, result.last_attempted_at, result.finished_at) == (None,) * 3
        with pytest.raises(ValueError, match=re.escape("Task has not finished yet")):
            result.return_value  # noqa: B018
        assert result.task == chosen
        assert (result.args, result.kwargs, result.attempts) == ([1], {"two": 3}, 0)
        assert default_task_backend.get_result(result.id) == result

    @pytest.mark.parametrize("name", ["noop_task", "noop_task_async"])
    def test_enqueue_task_async(self, name: str) -> None:
        """Ports test_dummy_backend.DummyBackendTestCase.test_enqueue_task_async."""
        chosen = getattr(test_tasks, name)
        result = run(chosen.aenqueue())
        assert (result.status, result.is_finished) == (TaskResultStatus.READY, False)
        assert (result.started_at, result.last_attempted_at, result.finished_at) == (None,) * 3
        with pytest.raises(ValueError, match=re.escape("Task has not finished yet")):
            result.return_value  # noqa: B018
        assert result.task == chosen
        assert (result.args, result.kwargs, result.attempts) == ([], {}, 0)
        assert default_task_backend.get_result(result.id) == result

    def test_refresh_result(self) -> None:
        """Adapts test_dummy_backend.DummyBackendTestCase.test_refresh_result: a worker
        runs the task where Django's test edits the dummy's stored result."""
        result = default_task_backend.enqueue(test_tasks.calculate_meaning_of_life, (), {})
        work()
        assert result.status == TaskResultStatus.READY
        result.refresh()
        assert result.status == TaskResultStatus.SUCCESSFUL

    def test_refresh_result_async(self) -> None:
        """Adapts test_dummy_backend.DummyBackendTestCase.test_refresh_result_async."""
        result = run(default_task_backend.aenqueue(test_tasks.calculate_meaning_of_life, (), {}))
        work()
        assert result.status == TaskResultStatus.READY
        run(result.arefresh())
        assert result.status == TaskResultStatus.SUCCESSFUL

    def test_enqueue_logs(self, caplog: pytest.LogCaptureFixture) -> None:
        """Ports test_dummy_backend.DummyBackendTestCase.test_enqueue_logs: enqueueing
        logs one line."""
        with caplog.at_level(logging.DEBUG, logger=LOGGER):
            result = test_tasks.noop_task.enqueue()
        lines = [record.getMessage() for record in framework_records(caplog)]
        assert len(lines) == 1
        assert "enqueued" in lines[0] and result.id in lines[0]

    def test_errors(self) -> None:
        """Ports test_dummy_backend.DummyBackendTestCase.test_errors."""
        assert test_tasks.noop_task.enqueue().errors == []

    def test_validate_disallowed_async_task(self) -> None:
        """Ports test_dummy_backend.DummyBackendTestCase.test_validate_disallowed_async_task
        and test_custom_backend.CustomBackendTestCase
        .test_enqueue_async_task_on_non_async_backend."""
        with (
            mock.patch.multiple(default_task_backend, supports_async_task=False),
            pytest.raises(
                InvalidTask, match="(?i)" + re.escape("Backend does not support async Tasks.")
            ),
        ):
            default_task_backend.validate_task(test_tasks.noop_task_async)

    def test_check(self) -> None:
        """Ports test_dummy_backend.DummyBackendTestCase.test_check."""
        errors = list(default_task_backend.check())
        assert errors == []

    def test_takes_context(self) -> None:
        """Ports test_dummy_backend.DummyBackendTestCase.test_takes_context."""
        assert test_tasks.get_task_id.enqueue().status == TaskResultStatus.READY


# tests/tasks/test_custom_backend.py: a backend's own task class (PgJobsTask) -------------


class TestCustomTaskClass:
    def test_backend_supports_priority(self) -> None:
        """Adapts test_custom_backend.CustomBackendTestCase.test_backend_does_not_support_priority,
        to the opposite: PgJobsBackend supports priority, and the job stores it."""
        assert PgJobsBackend.supports_priority is True
        result = test_tasks.noop_task.using(priority=10).enqueue()
        assert default_task_backend.get_result(result.id).task.priority == 10

    def test_custom_task_default_values(self) -> None:
        """Adapts test_custom_backend.CustomTaskTestCase.test_custom_task_default_values:
        PgJobsBackend's task class is PgJobsTask, with its own defaults."""
        my_task = task()(test_tasks.noop_task.func)
        assert isinstance(my_task, PgJobsTask)
        assert (my_task.max_attempts, my_task.lease, my_task.key) == (None, None, None)
        assert (my_task.on_conflict, my_task.atomic) == ("replace", False)

    def test_custom_task_with_custom_values(self) -> None:
        """Adapts test_custom_backend.CustomTaskTestCase.test_custom_task_with_custom_values."""
        my_task = task(max_attempts=5, lease=60)(test_tasks.noop_task.func)
        assert isinstance(my_task, PgJobsTask)
        assert (my_task.max_attempts, my_task.lease) == (5, 60)

    def test_custom_task_with_standard_and_custom_values(self) -> None:
        """Adapts test_custom_backend.CustomTaskTestCase
        .test_custom_task_with_standard_and_custom_values."""
        my_task = task(priority=10, queue_name="queue_1", max_attempts=10, lease=100)(
            test_tasks.noop_task.func
        )
        assert isinstance(my_task, PgJobsTask)
        assert (my_task.priority, my_task.queue_name) == (10, "queue_1")
        assert (my_task.max_attempts, my_task.lease) == (10, 100)
        assert my_task.takes_context is False
        assert my_task.run_after is None

    def test_custom_task_invalid_kwarg(self) -> None:
        """Ports test_custom_backend.CustomTaskTestCase.test_custom_task_invalid_kwarg."""
        with pytest.raises(TypeError):
            task(unknown_param=123)(test_tasks.noop_task.func)
