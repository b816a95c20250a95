"""Timeouts where they meet hung handlers and the pool (S33, S39): abandoned threads are
bounded, and the worker says when they hold it back."""

from __future__ import annotations

import logging
import threading
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


@pytest.mark.parametrize(
    ("kind", "payload", "expected"),
    [
        # Lease mode: two attempts, each abandoned at 0.5 s; each handler returns 2 s in.
        ("tests.stubborn", {"seconds": 2.0}, [("retried", 1), ("dead", 2)]),
        # Transaction mode: one attempt, its transaction ended 1 s past its 1 s timeout.
        ("tests.atomic_python_hang", {"seconds": 3.0}, [("dead", 1)]),
    ],
)
def test_s27_s33_a_run_abandoned_at_its_timeout_is_told_once_when_it_is_abandoned(
    kind: str,
    payload: dict[str, Any],
    expected: list[tuple[str, int]],
    caplog: pytest.LogCaptureFixture,
) -> None:
    """job_finished (and job_dead) is sent once a run, when the worker abandons the
    handler, with the timeout as its error; the handler that returns later, into a run
    already recorded, is not told again, and says nothing of the transaction the
    worker ended under it."""
    from django_pgjobs import signals

    told: list[tuple[str, int, str | None, float]] = []

    def on_finished(sender: str, **kwargs: Any) -> None:
        handle = kwargs["handle"]
        told.append((kwargs["outcome"], handle.attempt, kwargs["error"], kwargs["duration"]))

    # The kind as a string of its own: a receiver of one kind hears it (KindSignal).
    signals.job_finished.connect(on_finished, sender="".join(kind), dispatch_uid="test-told-once")
    try:
        job_id = Job.objects.enqueue(kind, payload).id
        with (
            caplog.at_level(logging.INFO, logger="django_pgjobs"),
            running_worker(queues=["long"], concurrency=2, poll_interval=0.2) as worker,
        ):
            wait_until(lambda: count("pgjobs_dead", f"id = {job_id}") == 1, timeout=15)
            assert [(outcome, attempt) for outcome, attempt, _, _ in told] == expected
            # Every abandoned handler returns, into a run already told.
            wait_until(lambda: worker.pool.abandoned_running == 0, timeout=8)
            time.sleep(0.3)
    finally:
        signals.job_finished.disconnect(sender=kind, dispatch_uid="test-told-once")
    assert [(outcome, attempt) for outcome, attempt, _, _ in told] == expected
    said = [record.getMessage() for record in caplog.records]
    assert sum(f"job dead id={job_id} " in line for line in said) == 1
    assert not [line for line in said if "could not commit" in line or "job cancelled" in line]
    # Counted as they were told: retries, then a dead letter; none cancelled, none lost.
    stats = worker.stats
    assert (stats.retried, stats.dead, stats.cancelled, stats.lost) == (
        len(expected) - 1,
        1,
        0,
        0,
    )
    for _, _, error, duration in told:
        assert error is not None and error.startswith("timed out after")
        assert 0.4 < duration < 2.5  # the time to the cut, not to the handler's return


def test_s39_a_timeout_reaches_its_jobs_transaction_and_no_later_one_on_its_connection() -> None:
    """The statement cut and the backend's end at a transaction-mode job's timeout name
    the job's transaction, not only its backend's process id: once the job's transaction
    ended, the same connection runs the thread's next job, and a cut or an end meant for
    the first reaches nothing (a process id alone would have cut the next job's
    statement, or ended the connection of whoever took the id)."""
    from django.db import connections, transaction

    from django_pgjobs.claims import Backend
    from django_pgjobs.worker.faults import sqlstate

    Job.objects.enqueue("tests.noop")
    (handle,) = Job.objects.claim_batch("default", 1, "w")
    seen: dict[str, Any] = {}

    def thread_of_jobs() -> None:
        try:
            with handle.fenced():
                seen["first"] = handle.control.backend
            # The thread's next job: a transaction of its own on the same connection.
            with transaction.atomic():
                seen["second"] = Backend(
                    *execute("SELECT pg_backend_pid(), pg_current_xact_id()::xid::text")[0]
                )
                try:
                    execute("SELECT pg_sleep(4)")
                    seen["slept"] = True
                except Exception as error:
                    seen["error"] = sqlstate(error)
                    raise
        except Exception:
            pass
        finally:
            connections.close_all()

    worker = threading.Thread(target=thread_of_jobs)
    worker.start()
    wait_until(lambda: "second" in seen)
    first, second = seen["first"], seen["second"]
    assert first.pid == second.pid and first.xact != second.xact
    wait_until(
        lambda: (
            execute("SELECT wait_event FROM pg_stat_activity WHERE pid = %s", [second.pid])
            == [("PgSleep",)]
        )
    )
    assert not Job.objects.cut_statement(first)
    assert not Job.objects.end_backend(first)
    time.sleep(0.3)
    assert execute("SELECT wait_event FROM pg_stat_activity WHERE pid = %s", [second.pid]) == [
        ("PgSleep",)
    ]
    # Its own transaction is reached.
    assert Job.objects.cut_statement(second)
    worker.join(timeout=5)
    assert not worker.is_alive()
    assert seen.get("error") == "57014" and "slept" not in seen
