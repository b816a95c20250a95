"""The django.tasks backend, through the real worker: the framework's whole public surface."""

from __future__ import annotations

import asyncio
from datetime import timedelta
from typing import Any

import pytest
from django.core.checks import run_checks
from django.db import transaction
from django.test import override_settings
from django.utils import timezone

from django_pgjobs.backend import PgJobsBackend, PgJobsTask
from django_pgjobs.compat import (
    InvalidTask,
    TaskResultDoesNotExist,
    TaskResultStatus,
    task_backends,
    task_enqueued,
    task_finished,
    task_started,
)
from django_pgjobs.maintenance import Sweeper
from django_pgjobs.worker import Worker
from tests import tasks
from tests.helpers import count, execute, row

pytestmark = pytest.mark.django_db(transaction=True)

QUEUES = ["default", "tasks"]


def work() -> Worker:
    worker = Worker(queues=QUEUES, burst=True, concurrency=1, sweep_interval=0)
    assert worker.run() == 0
    return worker


def make_all_due() -> None:
    execute("UPDATE pgjobs_job SET run_after = now() - interval '1 s' WHERE state = 'pending'")


def test_enqueue_then_get_result_round_trip() -> None:
    result = tasks.add.enqueue(2, 3)
    assert result.status == TaskResultStatus.READY
    assert result.enqueued_at is not None and result.backend == "default"
    assert (result.args, result.kwargs) == ([2, 3], {})
    assert isinstance(task_backends["default"], PgJobsBackend)
    assert row(int(result.id), "kind", "queue") == ("tests.tasks.add", "default")

    work()
    fetched = tasks.add.get_result(result.id)
    assert fetched.status == TaskResultStatus.SUCCESSFUL
    assert fetched.return_value == 5
    assert fetched.started_at is not None and fetched.finished_at is not None
    assert fetched.last_attempted_at == fetched.started_at
    assert len(fetched.worker_ids) == 1 and fetched.attempts == 1
    assert fetched.errors == []

    result.refresh()
    assert (result.status, result.return_value) == (TaskResultStatus.SUCCESSFUL, 5)


def test_priority_orders_claims_and_is_stored() -> None:
    low = tasks.note.using(priority=-10).enqueue("low")
    high = tasks.note.using(priority=50).enqueue("high")
    default = tasks.note.enqueue("five")
    assert [row(int(r.id), "priority")[0] for r in (low, high, default)] == [-10, 50, 5]
    work()
    assert [r[0] for r in execute("SELECT text FROM tests_note ORDER BY id")] == [
        "high",
        "five",
        "low",
    ]


def test_run_after_defers_the_task() -> None:
    later = tasks.add.using(run_after=timezone.now() + timedelta(hours=1)).enqueue(1, 1)
    work()
    assert later.task.get_result(later.id).status == TaskResultStatus.READY
    make_all_due()
    work()
    assert tasks.add.get_result(later.id).return_value == 2


def test_queues_are_validated_against_the_backends_list() -> None:
    config = {"default": {"BACKEND": "django_pgjobs.backend.PgJobsBackend", "QUEUES": ["a"]}}
    with override_settings(TASKS=config):
        with pytest.raises(InvalidTask, match="Queue 'b' is not valid"):
            PgJobsTask(func=tasks.add.func, queue_name="b")
        assert PgJobsTask(func=tasks.add.func, queue_name="a").queue_name == "a"


def test_queue_names_follow_django_pgjobs_rules() -> None:
    with pytest.raises(InvalidTask, match="may only contain"):
        tasks.add.using(queue_name="no spaces")


def test_async_task_runs_on_the_worker() -> None:
    result = tasks.async_multiply.enqueue(6, 7)
    work()
    assert tasks.async_multiply.get_result(result.id).return_value == 42


def test_context_attempts_count_across_retries() -> None:
    result = tasks.flaky.enqueue(fail_times=2)
    for attempt in (1, 2):
        work()
        fetched = tasks.flaky.get_result(result.id)
        assert fetched.status == TaskResultStatus.READY
        assert fetched.attempts == attempt
        assert [e.exception_class_path for e in fetched.errors] == ["builtins.ValueError"] * attempt
        assert f"attempt {attempt} failed" in fetched.errors[-1].traceback
        make_all_due()
    work()
    final = tasks.flaky.get_result(result.id)
    assert (final.status, final.return_value, final.attempts) == (
        TaskResultStatus.SUCCESSFUL,
        3,
        3,
    )
    assert [r[0] for r in execute("SELECT attempt FROM tests_note ORDER BY id")] == [1, 2, 3]


def test_an_exception_on_the_last_attempt_fails_the_task_with_its_class_path() -> None:
    result = tasks.explode.enqueue()
    work()
    fetched = tasks.explode.get_result(result.id)
    assert fetched.status == TaskResultStatus.FAILED
    (error,) = fetched.errors
    assert error.exception_class_path == "builtins.KeyError"
    assert error.exception_class is KeyError
    assert "no such thing" in error.traceback
    with pytest.raises(ValueError, match="Task failed"):
        fetched.return_value  # noqa: B018
    assert fetched.is_finished


def test_a_return_value_that_is_not_json_fails_at_once() -> None:
    result = tasks.returns_a_set.enqueue()
    work()
    fetched = tasks.returns_a_set.get_result(result.id)
    assert fetched.status == TaskResultStatus.FAILED
    assert fetched.errors[0].exception_class_path == "builtins.TypeError"  # as Django's own


def test_rolled_back_enqueue_leaves_no_task() -> None:
    with pytest.raises(RuntimeError), transaction.atomic():
        tasks.add.enqueue(1, 2)
        raise RuntimeError("the request failed")
    assert count() == 0


def test_missing_result_raises_does_not_exist() -> None:
    backend = task_backends["default"]
    for missing in ("987654321", "not-a-number"):
        with pytest.raises(TaskResultDoesNotExist):
            backend.get_result(missing)


async def close_connections() -> None:
    """Close the connection of the thread sync_to_async ran the database calls in."""
    from asgiref.sync import sync_to_async
    from django.db import connections

    await sync_to_async(connections.close_all, thread_sensitive=True)()


def test_aenqueue_and_aget_result_under_an_event_loop() -> None:
    async def scenario() -> Any:
        result = await tasks.add.aenqueue(20, 22)
        assert result.status == TaskResultStatus.READY
        await close_connections()
        return result

    result = asyncio.run(scenario())
    work()

    async def read() -> Any:
        fetched = await tasks.add.aget_result(result.id)
        await result.arefresh()
        await close_connections()
        return fetched

    fetched = asyncio.run(read())
    assert fetched.return_value == 42 and result.return_value == 42


def test_signals_are_sent_in_order_with_their_statuses() -> None:
    seen: list[tuple[str, str]] = []

    def receiver(name: str) -> Any:
        def record(sender: type, task_result: Any, **kwargs: Any) -> None:
            assert sender is PgJobsBackend
            seen.append((name, str(task_result.status)))

        return record

    handlers = {
        "enqueued": receiver("enqueued"),
        "started": receiver("started"),
        "finished": receiver("finished"),
    }
    task_enqueued.connect(handlers["enqueued"])
    task_started.connect(handlers["started"])
    task_finished.connect(handlers["finished"])
    try:
        tasks.flaky.enqueue(fail_times=1)
        work()
        make_all_due()
        work()
    finally:
        task_enqueued.disconnect(handlers["enqueued"])
        task_started.disconnect(handlers["started"])
        task_finished.disconnect(handlers["finished"])
    assert seen == [
        ("enqueued", "READY"),
        ("started", "RUNNING"),
        ("finished", "READY"),  # failed, will be retried
        ("started", "RUNNING"),
        ("finished", "SUCCESSFUL"),
    ]


def test_results_are_kept_for_the_retention_then_pruned() -> None:
    result = tasks.add.enqueue(1, 2)
    work()
    job_id = int(result.id)
    state, retention = row(job_id, "state", "result_ttl_s")
    assert (state, retention) == ("done", 3600)
    execute("UPDATE pgjobs_job SET purge_at = now() - interval '1 s' WHERE id = %s", [job_id])
    assert Sweeper().run_once().done_pruned == 1
    with pytest.raises(TaskResultDoesNotExist):
        tasks.add.get_result(result.id)


def test_plain_jobs_still_delete_on_ack() -> None:
    from tests import jobs

    job_id = jobs.noop.enqueue().id
    work()
    assert row(job_id, "id") is None


def test_task_options_reach_the_job() -> None:
    result = tasks.flaky.enqueue(fail_times=0)
    assert row(int(result.id), "max_attempts") == (3,)
    first = tasks.sync_account.enqueue(account=7, version=1)
    second = tasks.sync_account.enqueue(account=7, version=2)
    assert second.id == first.id  # merged into the live job of key account:7
    key, payload = row(int(first.id), "key", "payload")
    assert (key, payload["args"], payload["kwargs"]) == (
        "account:7",
        [],
        {"account": 7, "version": 2},
    )
    work()
    assert tasks.sync_account.get_result(first.id).return_value == 2


def test_atomic_task_commits_its_writes_with_its_completion() -> None:
    ok = tasks.atomic_note.enqueue("kept")
    failing = tasks.atomic_note.enqueue("undone", explode=True)
    work()
    assert [r[0] for r in execute("SELECT text FROM tests_note")] == ["kept"]
    assert tasks.atomic_note.get_result(ok.id).status == TaskResultStatus.SUCCESSFUL
    fetched = tasks.atomic_note.get_result(failing.id)
    assert fetched.status == TaskResultStatus.READY
    assert fetched.errors[0].exception_class_path == "builtins.RuntimeError"


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"max_attempts": 0}, "max_attempts"),
        ({"lease": -1}, "lease"),
        ({"on_conflict": "merge"}, "on_conflict"),
        ({"key": ""}, "key"),
        ({"atomic": "yes"}, "atomic"),
    ],
)
def test_bad_task_options_are_refused_in_djangos_style(
    options: dict[str, Any], message: str
) -> None:
    with pytest.raises(InvalidTask, match=message):
        PgJobsTask(func=tasks.add.func, **options)


def test_an_async_task_cannot_be_atomic() -> None:
    with pytest.raises(InvalidTask, match="transaction mode"):
        PgJobsTask(func=tasks.async_multiply.func, atomic=True)


def test_check_reports_an_unusable_configuration() -> None:
    config = {
        "default": {
            "BACKEND": "django_pgjobs.backend.PgJobsBackend",
            "QUEUES": ["fine", "not fine"],
            "OPTIONS": {"RESULT_RETENTION": -5, "SPEED": "fast"},
        }
    }
    with override_settings(TASKS=config):
        ids = sorted(message.id for message in task_backends["default"].check())
    assert ids == ["pgjobs.E011", "pgjobs.E012", "pgjobs.E012"]
    assert [m for m in run_checks() if m.id.startswith("pgjobs.E01")] == []
