"""The `pgjobs_worker` fixture users put in their own suites: a real worker in a thread
beside a `transaction=True` test, waited for, and stopped at the end."""

from __future__ import annotations

import pytest
from django.db import transaction

from django_pgjobs.testing.pytest import RunningWorker, pgjobs_worker  # noqa: F401
from tests import jobs
from tests.helpers import count, execute

pytestmark = pytest.mark.django_db(transaction=True)


def test_the_fixture_runs_committed_jobs_and_waits_until_idle(
    pgjobs_worker: RunningWorker,  # noqa: F811
) -> None:
    with transaction.atomic():
        jobs.chain.enqueue(left=2)
        jobs.record.enqueue(label="beside")
    pgjobs_worker.wait_until_idle()
    texts = sorted(text for (text,) in execute("SELECT text FROM tests_note"))
    assert texts == ["beside", "chain 0", "chain 1", "chain 2"]
    assert count() == 0


def test_wait_until_idle_says_how_many_are_left_when_it_gives_up() -> None:
    running = RunningWorker(queues=["default"])
    running.stop()  # stopped: nothing drains the queue any more
    jobs.record.enqueue(label="never")
    with pytest.raises(AssertionError, match="1 jobs still runnable or running"):
        running.wait_until_idle(timeout=0.3)
