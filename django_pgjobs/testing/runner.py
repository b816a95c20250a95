"""`run_jobs`: the jobs a test enqueued, run in the test's own thread and transaction."""

from __future__ import annotations

from collections.abc import Sequence

from django_pgjobs.conf import pgjobs_settings
from django_pgjobs.models import Job
from django_pgjobs.worker.completer import Completer
from django_pgjobs.worker.executor import Executor
from django_pgjobs.worker.faults import Faults
from django_pgjobs.worker.options import default_queues
from django_pgjobs.worker.stats import WorkerStats

#: The worker id the jobs run by `run_jobs` are claimed with.
TEST_WORKER_ID = "django_pgjobs.testing"


def run_jobs(
    queues: Sequence[str] | None = None, *, using: str | None = None, max_rounds: int = 100
) -> WorkerStats:
    """Run every job of `queues` (default: every queue this process knows) that is
    runnable now, and those the runs make runnable (a retry without delay, a job a job
    enqueued), in this thread and this transaction; return the counts of what happened.

    Each job runs as a worker would run it: its claim, its handler with `ctx`, its
    outcome recorded (ack, retry with backoff, dead letter), fences and transaction mode
    included. A job retried with a delay waits for it: call again after moving its
    `run_after` (or use the `pgjobs_worker` fixture). Stops after `max_rounds` claims, so
    that a job that re-enqueues itself forever cannot hang the test.
    """
    names = list(queues) if queues is not None else default_queues()
    stats = WorkerStats()
    alias = using or pgjobs_settings.DATABASE
    faults = Faults(alias)
    completer = Completer(Job.objects, stats, faults)
    executor = Executor()
    try:
        for _ in range(max_rounds):
            handles = Job.objects.claim_batch(names, 100, TEST_WORKER_ID, using=alias)
            if not handles:
                break
            stats.claimed += len(handles)
            for handle in handles:
                completer.take(executor.run(handle))
            if not completer.flush():
                raise RuntimeError("the database refused to record the jobs' outcomes")
    finally:
        executor.close()
    return stats
