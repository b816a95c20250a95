"""Dependencies (S29) and batches (S31) with `manage.py runjobs` for real: kill -9 of the
worker running a child's last parent (a batch's last member) loses nothing, and the child
(the callback) runs once, after that parent."""

from __future__ import annotations

import signal

import pytest

from django_pgjobs.batches import Callback, batch
from django_pgjobs.models import Job
from tests import jobs
from tests.helpers import count, execute, row
from tests.spawn import Workers, wait_for

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]


def test_s29_kill_9_of_the_worker_running_the_last_parent_still_frees_the_child_once(
    workers: Workers, notify: bool
) -> None:
    first = jobs.record.enqueue(label="first")
    last = jobs.slow_first.using(lease=2).enqueue(seconds=60)
    child = Job.objects.enqueue("tests.record", {"label": "child"}, after=[first, last])
    doomed = workers.start("--concurrency", "2")
    wait_for(
        lambda: count("tests_note", "text = 'start'") == 1 and row(first.id) is None,
        what="the first parent done and the last one started",
    )
    assert row(child.id, "state", "parents_left") == ("waiting", 1)
    doomed.signal(signal.SIGKILL)
    doomed.wait(10)
    assert row(child.id, "state") == ("waiting",)
    rescuer = workers.start("--concurrency", "2", "--poll-interval", "0.5")
    wait_for(lambda: count() == 0, timeout=30, what="the last parent and the child to run")
    rescuer.signal(signal.SIGTERM)
    assert rescuer.wait(30) == 0
    notes = execute("SELECT job_id, text, attempt FROM tests_note ORDER BY id")
    assert notes[-1] == (child.id, "child", 1)  # once, after every parent's run
    assert sorted(notes[:-1]) == sorted(
        [(first.id, "first", 1), (last.id, "start", 1), (last.id, "start", 2)]
    )
    assert count("pgjobs_dead") == 0 and count("pgjobs_dependency") == 0


def test_s31_kill_9_of_the_worker_ending_the_last_member_still_fires_the_callback_once(
    workers: Workers, notify: bool
) -> None:
    with batch(on_complete=Callback("tests.batch_report", label="complete")) as b:
        b.add("tests.record", label="first")
        b.add(jobs.slow_first.using(lease=2), seconds=60)
    (callback,) = b.callback_jobs
    doomed = workers.start("--concurrency", "2")
    wait_for(
        lambda: count("tests_note", "text = 'start'") == 1 and count("tests_note") == 2,
        what="the first member done and the last one started",
    )
    # The first member's note commits before its ack does: wait for the ack's effect.
    wait_for(
        lambda: row(callback.id, "state", "parents_left") == ("waiting", 1),
        what="the first member's end recorded on the callback",
    )
    doomed.signal(signal.SIGKILL)
    doomed.wait(10)
    rescuer = workers.start("--concurrency", "2", "--poll-interval", "0.5")
    wait_for(lambda: count() == 0, timeout=30, what="the last member and the callback to run")
    rescuer.signal(signal.SIGTERM)
    assert rescuer.wait(30) == 0
    reports = execute("SELECT text, attempt FROM tests_note WHERE text LIKE 'complete%%'")
    assert reports == [
        (f"complete batch={b.id} state=succeeded members=2 done=2 failed=0 results=2", 1)
    ]
