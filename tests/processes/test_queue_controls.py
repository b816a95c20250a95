"""Queue controls obeyed by real `manage.py runjobs` processes: a paused queue keeps its
workers idle and a resume wakes them, a limit holds across processes and a killed
worker's slots come back after its lease. The controls themselves, claims and
`jobsctl`: concurrency/test_queue_controls.py."""

from __future__ import annotations

import signal
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager

import pytest

from django_pgjobs.models import Job, QueueControl
from tests import jobs
from tests.helpers import count, execute, other_connection, wait_until
from tests.spawn import Workers, listening_workers, wait_for

pytestmark = pytest.mark.django_db(transaction=True)

RUNNING = "SELECT count(*) FROM pgjobs_job WHERE queue = %s AND state = 'running'"
# A running job whose lease lapsed holds no slot (its worker is presumed dead).
HOLDING = RUNNING + " AND claimed_until > now()"


@contextmanager
def sampled(statement: str, queue: str) -> Iterator[list[int]]:
    """Sample `statement` for `queue` from a connection of its own every few ms, until the
    block ends; yields the list of samples."""
    samples: list[int] = []
    done = threading.Event()

    def sample() -> None:
        with other_connection() as conn:
            while not done.is_set():
                samples.append(conn.execute(statement, [queue]).fetchone()[0])
                time.sleep(0.005)

    thread = threading.Thread(target=sample, daemon=True)
    thread.start()
    try:
        yield samples
    finally:
        done.set()
        thread.join(10)


class TestPause:
    def test_a_paused_queue_keeps_its_workers_idle_and_resume_wakes_them_at_once(
        self, workers: Workers
    ) -> None:
        QueueControl.objects.pause("mail")
        process = workers.start("--queue", "mail", "--poll-interval", "30")
        wait_until(lambda: listening_workers() > 0, timeout=20)
        for label in ("a", "b", "c"):
            jobs.record.using(queue="mail").enqueue(label=label)
        time.sleep(1.0)  # every enqueue woke it; a paused queue gave it nothing
        assert count("tests_note") == 0, process.output()
        started = time.monotonic()
        QueueControl.objects.resume("mail")
        wait_until(lambda: count("tests_note") == 3, timeout=10)
        assert time.monotonic() - started < 5  # woken, not polled (30 s)

    def test_a_running_worker_notices_a_pause_at_its_next_claim(self, workers: Workers) -> None:
        process = workers.start("--queue", "mail", "--poll-interval", "0.5")
        jobs.record.using(queue="mail").enqueue(label="before")
        wait_until(lambda: count("tests_note") == 1, timeout=20)
        QueueControl.objects.pause("mail")
        jobs.record.using(queue="mail").enqueue(label="while paused")
        time.sleep(1.5)  # three poll intervals
        assert count("tests_note") == 1, process.output()
        assert count(where="queue = 'mail' AND state = 'pending'") == 1


class TestLimit:
    @pytest.mark.slow
    def test_limit_k_holds_under_four_processes_of_concurrency_eight(
        self, workers: Workers
    ) -> None:
        # 12 is more than one process's 8 slots: reaching it takes several replicas at once.
        limit = 12
        QueueControl.objects.set_limit("capped", limit)
        ids = [
            r.id
            for r in Job.objects.enqueue_many(
                [
                    {"kind": "tests.record", "queue": "capped", "payload": {"sleep": 0.1}}
                    for _ in range(240)
                ]
            )
        ]
        with sampled(RUNNING, "capped") as samples:
            started = [
                workers.start("--queue", "capped", "--concurrency", "8", "--poll-interval", "0.2")
                for _ in range(4)
            ]
            wait_until(lambda: count(where="queue = 'capped'") == 0, timeout=120)
        assert all(process.process.poll() is None for process in started)  # none crashed
        assert len(samples) > 100
        assert max(samples) == limit  # reached, never exceeded
        ran = execute("SELECT job_id, count(*) FROM tests_note GROUP BY job_id")
        assert sorted(job_id for job_id, _ in ran) == ids
        assert all(runs == 1 for _, runs in ran)

    @pytest.mark.slow
    def test_a_killed_workers_slots_return_after_its_lease(self, workers: Workers) -> None:
        QueueControl.objects.set_limit("capped", 2)
        held = [
            jobs.slow_first.using(queue="capped", lease=2).enqueue(seconds=60).id for _ in range(2)
        ]
        waiting = jobs.record.using(queue="capped").enqueue(label="waited").id
        doomed = workers.start("--queue", "capped", "--concurrency", "4")
        wait_for(lambda: count("tests_note") == 2, what="both slots to be taken")
        with sampled(HOLDING, "capped") as samples:
            time.sleep(1)
            assert count("tests_note") == 2  # the third job waits for a slot
            doomed.signal(signal.SIGKILL)
            doomed.wait(10)
            killed_at = time.monotonic()
            workers.start("--queue", "capped", "--concurrency", "4", "--poll-interval", "0.5")
            wait_until(lambda: count(where="queue = 'capped'") == 0, timeout=30)
        assert time.monotonic() - killed_at < 15
        assert max(samples) <= 2
        texts = execute("SELECT job_id, attempt FROM tests_note WHERE text = 'start'")
        assert sorted(texts) == sorted([(i, 1) for i in held] + [(i, 2) for i in held])
        assert execute("SELECT count(*) FROM tests_note WHERE job_id = %s", [waiting])[0][0] == 1
