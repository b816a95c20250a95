"""Cancels, heartbeats and row locks where they meet (S32, S38, S39): a cancel while a
fence, a transaction-mode job or a heartbeat holds the job's row, with NOTIFY off (the
PgBouncer setup) and on; leases kept for as long as such a row is held."""

from __future__ import annotations

import time
from datetime import datetime
from typing import Any

import pytest
from django.db import transaction

from django_pgjobs.conf import pgjobs_settings
from django_pgjobs.models import DeadJob, Job
from tests import jobs
from tests.concurrency.test_limits import most_at_once
from tests.helpers import (
    count,
    dead_row,
    execute,
    lapse,
    other_connection,
    record_cancel_request,
    run_threads,
    running_worker,
    wait_until,
)

pytestmark = pytest.mark.django_db(transaction=True)

LISTEN = pytest.mark.parametrize("listen", [True, False], ids=["notify", "poll-only"])


def notes(text: str) -> int:
    return count("tests_note", "text = %s", [text])


def reason_of(job_id: int) -> str | None:
    found = dead_row(job_id, "reason")
    return None if found is None else str(found[0])


class TestS38CancelsOfHeldRows:
    @LISTEN
    def test_s38_a_cancel_during_a_fence_is_recorded_and_the_ack_refused(
        self, listen: bool
    ) -> None:
        """The fence holds the row when the cancel comes: the cancel is recorded at
        once, the fence's ack is refused and its writes roll back; the job ends as a
        dead letter with the cancel's reason, not done."""
        job_id = Job.objects.enqueue("tests.fenced_acker", {"seconds": 1.5}).id
        with running_worker(queues=["long"], listen=listen, poll_interval=0.2):
            wait_until(lambda: _fence_holds(job_id), timeout=10)
            assert Job.objects.cancel_many([job_id], reason="stop: wrong customer") == 1
            assert execute(
                "SELECT reason FROM pgjobs_cancel_request WHERE job_id = %s", [job_id]
            ) == [("stop: wrong customer",)]
            wait_until(lambda: reason_of(job_id) is not None, timeout=15)
        assert reason_of(job_id) == "stop: wrong customer"
        assert notes("committed with the ack") == 0
        assert count("pgjobs_job", "id = %s", [job_id]) == 0
        assert count("pgjobs_cancel_request") == 0

    @LISTEN
    def test_s38_a_cancel_of_a_transaction_mode_job_rolls_its_writes_back(
        self, listen: bool
    ) -> None:
        job_id = Job.objects.enqueue("tests.atomic_sleeper", {"seconds": 1.5}).id
        with running_worker(queues=["long"], listen=listen, poll_interval=0.2):
            wait_until(lambda: _fence_holds(job_id), timeout=10)
            assert Job.objects.cancel_many([job_id]) == 1
            wait_until(lambda: reason_of(job_id) is not None, timeout=15)
        assert reason_of(job_id) == "cancelled"
        assert notes("committed with the ack") == 0

    def test_s38_a_cancel_while_an_ack_holds_the_row_is_recorded_not_lost(self) -> None:
        """A worker's ack (or heartbeat) holds the row a moment: the cancel neither
        waits nor pretends. It records a request, which binds the claim if it is still
        the current one."""
        job_id = Job.objects.enqueue("tests.noop").id
        (handle,) = Job.objects.claim_batch("default", 1, "w")
        with other_connection(autocommit=False) as holder:
            holder.execute("SELECT 1 FROM pgjobs_job WHERE id = %s FOR NO KEY UPDATE", [job_id])
            assert Job.objects.cancel_many([job_id]) == 1
            holder.rollback()
        assert handle.ack() is False
        assert handle.cancelled and handle.control.reason == "cancelled"
        assert reason_of(job_id) == "cancelled"

    def test_s38_a_fence_entered_after_a_cancel_raises_cancelled(self) -> None:
        from django_pgjobs.exceptions import Cancelled

        job_id = Job.objects.enqueue("tests.noop").id
        (handle,) = Job.objects.claim_batch("default", 1, "w")
        with other_connection(autocommit=False) as holder:
            holder.execute("SELECT 1 FROM pgjobs_job WHERE id = %s FOR KEY SHARE", [job_id])
            Job.objects.cancel_many([job_id], reason="cancelled by ops")
            holder.rollback()
        with pytest.raises(Cancelled), handle.fenced():
            execute("INSERT INTO tests_note (text, created_at) VALUES ('fenced', now())")
        assert notes("fenced") == 0
        assert handle.cancelled and handle.control.reason == "cancelled by ops"

    def test_s38_a_cancelled_claim_that_lapses_dies_with_the_cancel_reason(self) -> None:
        """Its worker gone, a cancelled claim's lapse ends it as cancelled, not as a
        retry, and a shutdown's hand-back never puts it back in line."""
        job_id = Job.objects.enqueue("tests.noop").id
        (handle,) = Job.objects.claim_batch("default", 1, "w")
        with other_connection(autocommit=False) as holder:
            holder.execute("SELECT 1 FROM pgjobs_job WHERE id = %s FOR KEY SHARE", [job_id])
            Job.objects.cancel_many([job_id])
            holder.rollback()
        assert Job.objects.release_batch([handle]) == 0
        execute(
            "UPDATE pgjobs_job SET claimed_until = now() - interval '1 s' WHERE id = %s", [job_id]
        )
        assert Job.objects.claim_batch("default", 5, "w2") == []
        assert reason_of(job_id) == "cancelled"
        assert count("pgjobs_cancel_request") == 0

    def test_s24_s38_a_request_too_late_for_its_claim_is_swept(self) -> None:
        """A cancel that came while the ack was committing binds nothing once the job
        is done: the sweep removes the request, the job stays done."""
        from django_pgjobs.maintenance import Sweeper

        job_id = Job.objects.enqueue("tests.noop", result_retention=60).id
        (handle,) = Job.objects.claim_batch("default", 1, "w")
        assert handle.ack() is True
        record_cancel_request(job_id, handle.token, "cancelled")
        Sweeper(take_turns=False).run_once()
        assert count("pgjobs_cancel_request") == 0
        assert execute("SELECT state FROM pgjobs_job WHERE id = %s", [job_id]) == [("done",)]


class TestS38ACancelThatMeetsTheJobGoingBackInLine:
    """The statement that puts a running job back in line (a retry, a lapse's rescue, a
    shutdown's hand-back) holds its row when the cancel comes: the cancel records a
    request for the claim it saw, which that statement, holding the row since before the
    request existed, cannot see. The request binds the job: its next claim dead-letters
    it unrun, and the sweep cancels it if it waits (a retry's backoff)."""

    @staticmethod
    def _cancelled_while(put_back: Any, job_id: int) -> None:
        """Run `put_back()` in a transaction that holds the job's row while another
        connection cancels it, then commit."""
        with transaction.atomic():
            put_back()
            assert run_threads(
                1, lambda _: Job.objects.cancel_many([job_id], reason="stop: wrong account")
            ) == [1]

    @pytest.mark.parametrize("how", ["retry", "rescue", "release"])
    def test_s32_s38_its_next_claim_ends_it_unrun_as_cancelled(self, how: str) -> None:
        job_id = Job.objects.enqueue("tests.noop").id
        (handle,) = Job.objects.claim_batch("default", 1, "w")
        if how == "rescue":
            lapse(job_id)
        put_back = {
            "retry": lambda: handle.retry("flaky", delay=0),
            "rescue": lambda: Job.objects.rescue_lapsed(["default"], 10),
            "release": lambda: handle.release(),
        }[how]
        self._cancelled_while(put_back, job_id)
        assert execute("SELECT state FROM pgjobs_job WHERE id = %s", [job_id]) == [("pending",)]
        assert Job.objects.claim_batch("default", 5, "w2") == []
        assert reason_of(job_id) == "stop: wrong account"
        assert dead_row(job_id, "category") == ("cancelled",)
        assert count("pgjobs_cancel_request") == 0

    @LISTEN
    def test_s32_s38_a_worker_never_runs_it_again(self, listen: bool) -> None:
        """Where features meet: the job went back in line with its cancel, and a worker
        of several queues claims it: the handler never starts, the job ends cancelled."""
        job_id = Job.objects.enqueue("tests.record", {"label": "ran"}).id
        (handle,) = Job.objects.claim_batch("default", 1, "w")
        self._cancelled_while(lambda: handle.retry("flaky", delay=0), job_id)
        with running_worker(queues=["default", "long"], listen=listen, poll_interval=0.2):
            wait_until(lambda: reason_of(job_id) is not None, timeout=10)
        assert notes("ran") == 0
        assert reason_of(job_id) == "stop: wrong account"
        assert count("pgjobs_cancel_request") == 0

    def test_s24_s38_the_sweep_cancels_it_while_it_waits_its_backoff(self) -> None:
        from django_pgjobs.maintenance import Sweeper

        job_id = Job.objects.enqueue("tests.noop").id
        (handle,) = Job.objects.claim_batch("default", 1, "w")
        self._cancelled_while(lambda: handle.retry("flaky", delay=3600), job_id)
        result = Sweeper(take_turns=False).run_once()
        assert result.cancelled_in_line == 1
        assert reason_of(job_id) == "stop: wrong account"
        assert count("pgjobs_job", "id = %s", [job_id]) == 0
        assert count("pgjobs_cancel_request") == 0

    def test_s32_s38_a_claim_taken_before_the_request_committed_is_told_at_its_heartbeat(
        self,
    ) -> None:
        """The job went back in line and was claimed again before the request committed
        (it names the claim before): the request binds the new claim too, which its
        heartbeat hears, and whose ack is refused."""
        job_id = Job.objects.enqueue("tests.noop").id
        (first,) = Job.objects.claim_batch("default", 1, "w")
        assert first.retry("flaky", delay=0) is True
        (second,) = Job.objects.claim_batch("default", 1, "w2")
        record_cancel_request(job_id, first.token, "stop: late")
        beats = Job.objects.heartbeat_unlocked([second])
        assert [(handle.id, reason) for handle, reason in beats.gone] == [(job_id, "stop: late")]
        assert second.ack() is False
        assert second.cancelled and second.control.reason == "stop: late"
        assert reason_of(job_id) == "stop: late"

    def test_s3_s24_s38_an_expired_runs_trigger_is_free_of_the_runs_request(self) -> None:
        """The sweep ends an expired run by promoting its key's pending trigger: that
        answers the run's request, as a failure's promotion does; the trigger runs."""
        from django_pgjobs.maintenance import Sweeper

        job_id = Job.objects.enqueue("tests.plain", {"value": 1}, key="k").id
        (handle,) = Job.objects.claim_batch("default", 1, "w")
        Job.objects.enqueue("tests.plain", {"value": 2}, key="k")  # a trigger, while it runs
        record_cancel_request(job_id, handle.token, "stop: old run")
        execute("UPDATE pgjobs_job SET expires_at = now() - interval '1 s' WHERE id = %s", [job_id])
        assert Sweeper(take_turns=False).run_once().triggers_promoted == 1
        assert count("pgjobs_cancel_request") == 0
        (trigger,) = Job.objects.claim_batch("default", 1, "w")
        assert trigger.id == job_id and trigger.payload == {"value": 2}

    @LISTEN
    def test_s32_s38_a_notice_naming_an_earlier_claim_stops_the_jobs_claim(
        self, listen: bool
    ) -> None:
        """The job went back in line and was claimed again before its cancel committed:
        the notice names the claim the cancel saw, and reaches the claim that runs; with
        NOTIFY off, the heartbeat does."""
        job_id = jobs.patient.using(lease=3 if not listen else 60).enqueue(seconds=60).id
        with running_worker(queues=["long"], listen=listen, poll_interval=0.2):
            wait_until(lambda: notes("started") == 1, timeout=10)
            record_cancel_request(job_id, reason="stop: late")
            execute(
                "SELECT pg_notify(%s, 'pgjobs.cancel:' || %s || ':' || gen_random_uuid())",
                [pgjobs_settings.CHANNEL, job_id],
            )
            wait_until(lambda: count("tests_note", "text LIKE 'told: %%'") == 1, timeout=5)
            wait_until(lambda: reason_of(job_id) == "stop: late", timeout=10)

    def test_s3_s38_a_requeued_letter_is_free_of_a_request_its_last_run_left(self) -> None:
        job_id = Job.objects.enqueue("tests.noop").id
        (handle,) = Job.objects.claim_batch("default", 1, "w")
        assert handle.fail("broken") is True
        record_cancel_request(job_id, handle.token, "cancelled")
        DeadJob.objects.requeue([job_id])
        assert count("pgjobs_cancel_request") == 0
        (again,) = Job.objects.claim_batch("default", 1, "w")
        assert again.ack() is True

    @LISTEN
    def test_s32_s38_cancel_deletes_and_reaches_the_handler(self, listen: bool) -> None:
        """`cancel()` deletes the row: with NOTIFY off the heartbeat finds it gone and
        tells the handler."""
        job_id = Job.objects.enqueue("tests.patient", {"seconds": 30}).id
        with running_worker(queues=["long"], listen=listen, poll_interval=0.2) as worker:
            wait_until(lambda: notes("started") == 1, timeout=10)
            assert Job.objects.cancel(job_id) is True
            wait_until(lambda: count("tests_note", "text LIKE 'told: %%'") == 1, timeout=10)
            wait_until(lambda: worker.stats.cancelled == 1, timeout=5)
        assert count("pgjobs_job", "id = %s", [job_id]) == 0
        assert not DeadJob.objects.filter(id=job_id).exists()


class TestS39LocksKeepTheirLease:
    @LISTEN
    @pytest.mark.parametrize("how", ["fence", "atomic"])
    def test_s34_s39_a_held_row_keeps_its_key_slot_past_its_lease(
        self, listen: bool, how: str
    ) -> None:
        """A fence, or a transaction-mode job, runs 3 s on a 2 s lease: it is heartbeaten
        all along, so the second job of its concurrency=1 key waits for it, and each
        runs once."""
        kind = "tests.locked_tenant" if how == "fence" else "tests.atomic_tenant"
        payload = {"tenant": "t", "seconds": 3.0} | ({"how": "fence"} if how == "fence" else {})
        first = Job.objects.enqueue(kind, payload).id
        second = Job.objects.enqueue(kind, payload).id
        with running_worker(queues=["long"], concurrency=3, listen=listen, poll_interval=0.2):
            wait_until(lambda: count("pgjobs_job") == 0, timeout=30)
        assert count("pgjobs_dead") == 0
        spans = _spans(how)
        assert sorted(spans) == sorted([first, second])
        assert all(len(runs) == 1 for runs in spans.values())
        assert most_at_once([run for runs in spans.values() for run in runs]) == 1


def _fence_holds(job_id: int) -> bool:
    """Whether a transaction other than this one holds a lock on the job's row."""
    rows = execute(
        "SELECT count(*) FROM pgjobs_job AS j WHERE j.id = %s AND j.state = 'running' "
        "AND NOT EXISTS (SELECT 1 FROM pgjobs_job AS x WHERE x.id = j.id "
        "FOR UPDATE SKIP LOCKED)",
        [job_id],
    )
    return rows == [(1,)]


def _spans(how: str) -> dict[int, list[tuple[datetime, datetime]]]:
    """Each job's runs, [start, end] by the database's clock."""
    spans: dict[int, list[tuple[datetime, datetime]]] = {}
    if how == "fence":
        rows = execute(
            "SELECT s.job_id, s.created_at, e.created_at FROM tests_note AS s "
            "JOIN tests_note AS e ON e.token = s.token AND e.text = 't end' "
            "WHERE s.text = 't start'"
        )
        for job_id, started, ended in rows:
            spans.setdefault(job_id, []).append((started, ended))
        return spans
    for job_id, text in execute("SELECT job_id, text FROM tests_note"):
        _, started, ended = text.split(" ")
        spans.setdefault(job_id, []).append(
            (datetime.fromisoformat(started), datetime.fromisoformat(ended))
        )
    return spans


class TestS16S38ALapsedRunIsLostNotCancelled:
    def test_s16_s38_a_heartbeat_late_past_its_lease_finds_the_row_gone_and_tells_no_one(
        self,
    ) -> None:
        """A worker stopped past its lease (SIGSTOP, a long GC pause) wakes with the time
        its loop read before the stop. Its heartbeat then finds the job's row gone: a
        newer claim ran and acked it. That run is lost, not cancelled, however stale the
        loop's time: only a heartbeat answered while the lease surely held tells the
        handler (the row was deleted by a cancel)."""
        from django_pgjobs.worker.faults import Faults
        from django_pgjobs.worker.leases import Leases

        Job.objects.enqueue("tests.noop", {}, lease=1)
        asked_at = time.monotonic()
        (late,) = Job.objects.claim_batch("default", 1, "stalled")
        leases = Leases(Job.objects, Faults("default"), lambda: None)
        leases.hold([late], asked_at)
        before_the_stop = time.monotonic()
        # Stopped: no heartbeat, the lease lapses, and a newer claim takes the job.
        taken: list[Any] = []

        def newer_claim() -> bool:
            taken.extend(Job.objects.claim_batch("default", 1, "fresh"))
            return bool(taken)

        wait_until(newer_claim)
        assert taken[0].ack() is True
        leases.heartbeat_due(before_the_stop + 0.5)  # the time the loop read before the stop
        assert not late.control.cancelled
        assert count() == 0 and count("pgjobs_dead") == 0

    def test_s32_s38_a_row_deleted_while_its_lease_holds_is_told_as_cancelled(self) -> None:
        """The control of the test above: the same heartbeat, answered while the lease
        surely holds, tells the handler of a job deleted by cancel() (no NOTIFY)."""
        from django_pgjobs.worker.faults import Faults
        from django_pgjobs.worker.leases import Leases

        job_id = Job.objects.enqueue("tests.noop", {}, lease=30).id
        asked_at = time.monotonic()
        (claim,) = Job.objects.claim_batch("default", 1, "worker")
        leases = Leases(Job.objects, Faults("default"), lambda: None)
        leases.hold([claim], asked_at)
        with self.settings_without_notify():
            assert Job.objects.cancel(job_id) is True
        leases.heartbeat_due(time.monotonic() + 11)  # the heartbeat is due (a third of 30 s)
        assert claim.control.cancelled and claim.control.reason == "cancelled"

    @staticmethod
    def settings_without_notify() -> Any:
        from django.test import override_settings

        return override_settings(PGJOBS={"NOTIFY": False})
