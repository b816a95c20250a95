"""Async and sync kinds in one queue (S20, S26): each kind is claimed into capacity of
its own, the event loop's places or the threads."""

from __future__ import annotations

import pytest

from django_pgjobs.models import Job
from tests.helpers import count, execute, running_worker, wait_until
from tests.jobs import GATES

pytestmark = pytest.mark.django_db(transaction=True)


def running_of(kind: str) -> list[tuple[str, int]]:
    return [
        (str(worker), int(n))
        for worker, n in execute(
            "SELECT worker_id, count(*) FROM pgjobs_job WHERE state = 'running' AND kind = %s "
            "GROUP BY worker_id",
            [kind],
        )
    ]


def test_s20_a_worker_whose_threads_are_busy_still_runs_async_jobs() -> None:
    """Its one thread held by a sync job, a worker runs the async jobs of the same queue
    on its event loop meanwhile."""
    GATES["mixed-busy"].clear()
    Job.objects.enqueue("tests.gate", {"name": "mixed-busy"}, queue="mixed")
    Job.objects.enqueue_many(
        [{"kind": "tests.async_sleep", "payload": {"seconds": 0.2}, "queue": "mixed"}] * 4
    )
    with running_worker(queues=["mixed"], concurrency=1, async_concurrency=4, poll_interval=0.2):
        try:
            wait_until(lambda: count("pgjobs_job", "kind = 'tests.async_sleep'") == 0, timeout=10)
            assert count("pgjobs_job", "kind = 'tests.gate' AND state = 'running'") == 1
        finally:
            GATES["mixed-busy"].set()
        wait_until(lambda: count("pgjobs_job") == 0, timeout=10)


@pytest.mark.parametrize("listen", [True, False], ids=["notify", "poll-only"])
def test_s20_s26_sync_jobs_are_never_claimed_into_the_event_loops_places(listen: bool) -> None:
    """Two workers of one thread and four loop places each, after async jobs: the sync
    jobs of the queue go one per thread, shared by both workers, never held in a loop
    place waiting for a thread while the other worker idles."""
    Job.objects.enqueue_many(
        [{"kind": "tests.async_sleep", "payload": {"seconds": 0.05}, "queue": "mixed"}] * 8
    )
    options = {
        "queues": ["mixed"],
        "concurrency": 1,
        "async_concurrency": 4,
        "listen": listen,
        "poll_interval": 0.2,
    }
    samples: list[list[tuple[str, int]]] = []
    with running_worker(**options), running_worker(**options):
        wait_until(lambda: count("pgjobs_job") == 0, timeout=10)
        Job.objects.enqueue_many(
            [{"kind": "tests.record", "payload": {"sleep": 0.4}, "queue": "mixed"}] * 6
        )

        def drained() -> bool:
            samples.append(running_of("tests.record"))
            return count("pgjobs_job") == 0

        wait_until(drained, timeout=20, interval=0.01)
    assert max((n for sample in samples for _, n in sample), default=0) <= 1
    assert len({worker for (worker,) in execute("SELECT DISTINCT worker FROM tests_note")}) == 2


def test_s20_s34_async_keyed_jobs_run_while_the_threads_are_free() -> None:
    """Keyed async jobs on a worker whose threads have room: the threads' claim must not
    take (and back off on) the keys whose jobs only the event loop may run."""
    Job.objects.enqueue_many(
        [{"kind": "tests.async_tenant", "payload": {"tenant": f"t{n % 4}"}} for n in range(12)]
    )
    with running_worker(queues=["mixed"], concurrency=2, async_concurrency=4, poll_interval=2.0):
        wait_until(lambda: count("pgjobs_job") == 0, timeout=8)
    assert count("tests_note") == 12


@pytest.mark.parametrize("listen", [True, False], ids=["notify", "poll-only"])
def test_s20_s37_a_limited_queue_of_both_kinds_beside_a_free_one(listen: bool) -> None:
    """Where the worker's claim meets itself: one worker serves a queue limited to 2
    running jobs and a free one, each holding async and sync jobs. The event loop's
    claim of the limited queue goes first and the rest of both kinds is one statement:
    the limit holds over both kinds, and every job of both queues runs."""
    from django_pgjobs.models import QueueControl

    QueueControl.objects.set_limit("mixed", 2)
    jobs = []
    for queue in ("mixed", "free"):
        jobs += [{"kind": "tests.async_sleep", "payload": {"seconds": 0.1}, "queue": queue}] * 6
        jobs += [{"kind": "tests.record", "payload": {"sleep": 0.1}, "queue": queue}] * 6
    Job.objects.enqueue_many(jobs)
    most = 0

    def drained() -> bool:
        nonlocal most
        running = count("pgjobs_job", "queue = 'mixed' AND state = 'running'")
        most = max(most, running)
        return count("pgjobs_job") == 0

    with running_worker(
        queues=["mixed", "free"],
        concurrency=4,
        async_concurrency=8,
        listen=listen,
        poll_interval=0.2,
    ):
        wait_until(drained, timeout=30, interval=0.01)
    assert 1 <= most <= 2
    assert count("tests_note") == 12
