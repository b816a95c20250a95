"""Transaction mode where it meets timeouts and broken connections (S21, S27, S33, S39):
an attempt is cut at its deadline, recorded once, with the time of the cut."""

from __future__ import annotations

import time
from typing import Any

import pytest

from django_pgjobs import signals
from tests.helpers import count, dead_row, running_worker, wait_until

pytestmark = pytest.mark.django_db(transaction=True)


def died(job_id: int) -> bool:
    return dead_row(job_id, "id") is not None


class TestS39TransactionModeTimeouts:
    def test_s33_s39_an_attempt_is_cut_at_its_deadline_not_per_statement(self) -> None:
        """Three 1.5 s statements under a 2 s timeout: the second is cut at 2 s, the
        third never runs, nothing commits, and the error's time is the cut's."""
        from tests import jobs

        job_id = jobs.atomic_three_statements.enqueue().id
        started = time.monotonic()
        with running_worker(queues=["long"], poll_interval=0.2):
            wait_until(lambda: died(job_id), timeout=15)
        took = time.monotonic() - started
        errors, claimed_at, died_at = dead_row(job_id, "errors", "claimed_at", "died_at")
        assert errors[-1]["error"] == "timed out after 2 s"
        assert count("tests_note") == 0
        # The cut came at the deadline, not after three statements (4.5 s).
        assert 2.0 <= (died_at - claimed_at).total_seconds() < 3.5
        assert took < 4.5
        from datetime import datetime

        recorded_at = datetime.fromisoformat(errors[-1]["at"])
        # Recorded at the cut (about 2 s after the claim), not at the transaction's start.
        assert 2.0 <= (recorded_at - claimed_at).total_seconds() < 3.5
        assert abs((died_at - recorded_at).total_seconds()) < 1.0

    def test_s33_s39_a_handler_hung_outside_sql_is_abandoned_and_its_row_freed(self) -> None:
        from tests import jobs

        job_id = jobs.atomic_python_hang.enqueue(seconds=8).id
        started = time.monotonic()
        with running_worker(queues=["long"], poll_interval=0.2):
            wait_until(lambda: died(job_id), timeout=10)
            took = time.monotonic() - started
        errors, claimed_at, died_at = dead_row(job_id, "errors", "claimed_at", "died_at")
        assert errors[-1]["error"] == "timed out after 1 s"
        # Its transaction was ended a grace after the deadline, not when the hang ended.
        assert took < 5
        assert 1 <= (died_at - claimed_at).total_seconds() < 4
        assert count("tests_note") == 0


class TestS27BrokenConnections:
    def test_s27_s39_a_broken_connection_is_reported_once_with_its_real_cause(self) -> None:
        """The job's own connection is ended under it while the server is up: the run
        is reported once (job_finished, job_dead), and the error stored is the
        connection's, not Django's TransactionManagementError."""
        from tests import jobs

        finished: list[Any] = []
        dead: list[Any] = []

        def on_finished(sender: str, **kwargs: Any) -> None:
            finished.append(kwargs["outcome"])

        def on_dead(sender: str, **kwargs: Any) -> None:
            dead.append(kwargs["reason"])

        signals.job_finished.connect(on_finished, dispatch_uid="test-broken-finished")
        signals.job_dead.connect(on_dead, dispatch_uid="test-broken-dead")
        try:
            job_id = jobs.atomic_connection_lost.enqueue().id
            with running_worker(queues=["long"], poll_interval=0.2):
                wait_until(lambda: died(job_id), timeout=15)
        finally:
            signals.job_finished.disconnect(dispatch_uid="test-broken-finished")
            signals.job_dead.disconnect(dispatch_uid="test-broken-dead")
        (errors,) = dead_row(job_id, "errors")
        assert len(finished) == 1 and len(dead) == 1
        assert "TransactionManagementError" not in errors[-1]["error"]
        assert (
            "terminat" in errors[-1]["error"].lower() or "connection" in errors[-1]["error"].lower()
        )
