"""pytest fixtures for testing your own jobs (needs pytest-django).

# conftest.py
pytest_plugins = ["django_pgjobs.testing.pytest"]

@pytest.mark.django_db(transaction=True)
def test_welcome_mail(pgjobs_worker, mailoutbox):
    with transaction.atomic():
        user = User.objects.create(...)
        send_welcome.enqueue(user_id=user.id)
    pgjobs_worker.wait_until_idle()
    assert len(mailoutbox) == 1
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest

from django_pgjobs.models import Job
from django_pgjobs.worker import Worker


class RunningWorker:
    """A real worker in a thread beside the test, stopped when the test ends."""

    def __init__(self, **options: Any) -> None:
        options.setdefault("poll_interval", 0.1)
        options.setdefault("sweep_interval", 0)
        options.setdefault("schedules", False)
        self.worker = Worker(**options)
        self.error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, name="pgjobs-test-worker", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        try:
            self.worker.run()
        except BaseException as error:  # shown by wait_until_idle and stop
            self.error = error

    def wait_until_idle(self, timeout: float = 10.0) -> None:
        """Wait until no job of the worker's queues is runnable now or running.

        Raises:
            AssertionError: still busy after `timeout` seconds, or the worker failed.
        """
        queues = self.worker.options.queues
        deadline = time.monotonic() + timeout
        while True:
            self._raise_if_failed()
            busy = Job.objects.busy_in(queues)
            if not busy and not len(self.worker.leases):
                return
            if time.monotonic() > deadline:
                raise AssertionError(f"{busy} jobs still runnable or running after {timeout} s")
            time.sleep(0.02)

    def stop(self) -> None:
        self.worker.stop()
        self._thread.join(30)
        self._raise_if_failed()

    def _raise_if_failed(self) -> None:
        if self.error is not None:
            raise AssertionError(f"the test worker failed: {self.error!r}") from self.error


@pytest.fixture
def pgjobs_worker(transactional_db: None) -> Iterator[RunningWorker]:
    """A worker of every queue this process knows, running beside a transaction=True test."""
    running = RunningWorker()
    try:
        yield running
    finally:
        running.stop()
