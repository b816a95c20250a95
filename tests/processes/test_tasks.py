"""django.tasks across processes: one process enqueues a variant of a task, a worker
process runs that variant, and a third (this one) reads the result without ever loading
the task's module (issue 16; docs/tasks.md)."""

from __future__ import annotations

import sys

import pytest

from django_pgjobs.compat import TaskResultStatus, task_backends
from tests.helpers import execute
from tests.spawn import Workers, database_url_for_workers, manage_py, suite_env

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]

MODULE = "tests.unloaded_tasks"
ENQUEUE_A_VARIANT = f"""
from datetime import timedelta
from django.utils import timezone
from {MODULE} import greet

just_now = timezone.now() - timedelta(seconds=1)
variant = greet.using(priority=20, queue_name="tasks", run_after=just_now)
variant.using(priority=-2)  # made later in this process: not what the job stores
result = variant.enqueue(name="ada")
print(result.id, variant.run_after.isoformat())
"""


def test_a_variant_enqueued_in_one_process_runs_and_reads_as_itself_in_others(
    workers: Workers,
) -> None:
    env = suite_env(DATABASE_URL=database_url_for_workers())
    printed = manage_py(env, "shell", "-c", ENQUEUE_A_VARIANT)
    result_id, run_after = printed.splitlines()[-1].split()  # after the shell's own lines
    assert MODULE not in sys.modules  # this process reads without the module

    backend = task_backends["default"]
    waiting = backend.get_result(result_id)
    assert waiting.status == TaskResultStatus.READY
    assert (waiting.task.module_path, waiting.task.priority, waiting.task.queue_name) == (
        f"{MODULE}.greet",
        20,
        "tasks",
    )
    assert waiting.task.run_after.isoformat() == run_after

    process = workers.start("--burst", "--queue", "tasks", "--import", MODULE)
    assert process.wait(60) == 0, process.output()
    assert execute("SELECT text FROM tests_note WHERE job_id = %s", [int(result_id)]) == [
        (f"priority=20 queue=tasks run_after={run_after} backend=default",)
    ]
    done = backend.get_result(result_id)
    assert (done.status, done.return_value) == (
        TaskResultStatus.SUCCESSFUL,
        {"greeting": "hello ada"},
    )
    assert done.task.priority == 20 and done.finished_at is not None
    assert MODULE not in sys.modules
