"""Timeouts where they meet hung handlers and the pool (S33, S39): abandoned threads are
bounded, and the worker says when they hold it back."""

from __future__ import annotations

import logging
import time
from typing import Any

import pytest

from django_pgjobs.models import Job
from tests.helpers import count, execute, running_worker, wait_until

pytestmark = pytest.mark.django_db(transaction=True)


def test_s33_s39_abandoned_handlers_are_bounded_and_the_worker_says_so(
    caplog: pytest.LogCaptureFixture, settings: Any
) -> None:
    """Handlers that ignore their 0.5 s timeout and hang 3 s: with one thread, the
    worker abandons one, then claims nothing more until it ends, rather than stacking a
    thread (and a connection) per hung job."""
    settings.PGJOBS = {**settings.PGJOBS, "WORKER_HEARTBEAT": 1.0}  # the registry's row
    for _ in range(3):
        Job.objects.enqueue("tests.stubborn", {"seconds": 5.0})
    samples: list[int] = []
    with (
        caplog.at_level(logging.WARNING, logger="django_pgjobs.worker"),
        running_worker(queues=["long"], concurrency=1, poll_interval=0.2) as worker,
    ):
        wait_until(lambda: count("tests_note", "text = 'started'") == 1)
        deadline = time.monotonic() + 2.2
        while time.monotonic() < deadline:
            samples.append(worker.pool.abandoned_running)
            time.sleep(0.05)
        assert count("tests_note", "text = 'started'") == 1
        assert worker.stats.abandoned == 1
        # The registry says so too, at the worker's next heartbeat of its row.
        wait_until(
            lambda: (
                execute("SELECT abandoned FROM pgjobs_worker WHERE id = %s", [worker.worker_id])
                == [(1,)]
            ),
            timeout=3,
        )
        # Once the hung handler ends, the worker claims the next one.
        wait_until(lambda: count("tests_note", "text = 'started'") == 2, timeout=8)
    assert max(samples) == 1
    assert any("abandoned at their timeout still run" in r.getMessage() for r in caplog.records)
