"""The claim's handle in one rolled-back transaction: the validity predicate (S10),
heartbeat (S11), ack (S12), retry (S13), fail (S15), batch ack (S17), cancel (S18),
get_job (S19), requeue. Fencing (S16): concurrency/test_handle.py."""

from __future__ import annotations

import itertools
from collections.abc import Callable
from datetime import timedelta

import pytest
from django.test import override_settings

from django_pgjobs.claims import JobHandle
from django_pgjobs.exceptions import InvalidLease, LeaseLost
from django_pgjobs.models import DeadJob, Job
from tests.helpers import (
    count,
    dead_row,
    execute,
    lapse,
    row,
    seconds_from_now,
)

pytestmark = pytest.mark.django_db

ALL_COLUMNS = (
    "state, attempts, claimed_by, claimed_until, run_after, payload, result, last_error,"
    " errors, finished_at, worker_id"
)


def claim(**enqueue_options: object) -> JobHandle:
    """Enqueue one job on a queue of its own (unless told one) and claim it."""
    enqueue_options.setdefault("queue", f"solo-{next(_solo_queues)}")
    job_id = Job.objects.enqueue("demo.t", {"n": 1}, **enqueue_options).id
    handle = Job.objects.claim_one(str(enqueue_options["queue"]), "w1")
    assert handle is not None and handle.id == job_id
    return handle


_solo_queues = itertools.count()


def snapshot(job_id: int) -> list[tuple[object, ...]]:
    return execute(f"SELECT {ALL_COLUMNS} FROM pgjobs_job WHERE id = %s", [job_id]) + execute(
        "SELECT id FROM pgjobs_dead WHERE id = %s", [job_id]
    )


OPERATIONS: dict[str, Callable[[JobHandle], bool]] = {
    "ack": lambda h: h.ack({"r": 1}),
    "retry": lambda h: h.retry("boom"),
    "retry_with_delay": lambda h: h.retry("boom", delay=5),
    "fail": lambda h: h.fail("bad"),
    "heartbeat": lambda h: h.heartbeat(),
    "release": lambda h: h.release(),
    "ack_batch": lambda h: Job.objects.ack_batch([h]) == 1,
}


class TestS10ValidityPredicate:
    @pytest.mark.parametrize("operation", OPERATIONS)
    def test_s10_every_write_refused_after_lapse(self, operation: str) -> None:
        handle = claim()
        lapse(handle.id)
        before = snapshot(handle.id)
        assert OPERATIONS[operation](handle) is False
        assert snapshot(handle.id) == before

    @pytest.mark.parametrize("operation", OPERATIONS)
    def test_s10_every_write_refused_after_reclaim_by_another(self, operation: str) -> None:
        stale = claim()
        lapse(stale.id)
        fresh = Job.objects.claim_one(stale.queue, "w2")
        assert fresh is not None and fresh.id == stale.id
        before = snapshot(stale.id)
        assert OPERATIONS[operation](stale) is False
        assert snapshot(stale.id) == before
        assert fresh.ack()

    @pytest.mark.parametrize("operation", OPERATIONS)
    def test_s10_every_write_refused_after_cancel(self, operation: str) -> None:
        handle = claim()
        assert Job.objects.cancel(handle.id)
        assert OPERATIONS[operation](handle) is False
        assert count() == 0 and count("pgjobs_dead") == 0

    @pytest.mark.parametrize("operation", OPERATIONS)
    def test_s10_every_write_refused_after_the_job_finished(self, operation: str) -> None:
        handle = claim()
        assert handle.ack()
        assert OPERATIONS[operation](handle) is False
        assert count() == 0 and count("pgjobs_dead") == 0

    def test_s10_a_refused_fence_raises_lease_lost_and_writes_nothing(self) -> None:
        handle = claim()
        lapse(handle.id)
        with pytest.raises(LeaseLost, match=str(handle.id)), handle.fenced():
            execute("INSERT INTO tests_note (text) VALUES ('never')")
        assert count("tests_note") == 0


class TestS11Heartbeat:
    def test_s11_heartbeat_is_an_absolute_reset(self) -> None:
        handle = claim(lease=600)
        assert handle.heartbeat(30)
        assert 29 < seconds_from_now("claimed_until", handle.id) <= 30
        assert handle.heartbeat(timedelta(seconds=90))
        assert 89 < seconds_from_now("claimed_until", handle.id) <= 90
        assert handle.claimed_until == row(handle.id, "claimed_until")[0]

    def test_s11_heartbeat_defaults_to_the_jobs_lease(self) -> None:
        handle = claim(lease=42)
        execute("UPDATE pgjobs_job SET claimed_until = now() + interval '1 second'")
        assert handle.heartbeat()
        assert 41 < seconds_from_now("claimed_until", handle.id) <= 42

    def test_s11_late_heartbeat_is_refused(self) -> None:
        handle = claim()
        lapse(handle.id)
        assert handle.heartbeat(60) is False
        assert seconds_from_now("claimed_until", handle.id) < 0

    @pytest.mark.parametrize("extend", [0, -5, float("nan"), "10"])
    def test_s11_heartbeat_needs_a_positive_extension(self, extend: object) -> None:
        handle = claim()
        with pytest.raises(InvalidLease):
            handle.heartbeat(extend)  # type: ignore[arg-type]


class TestS12Ack:
    def test_s12_ack_deletes_the_row(self, django_capture_on_commit_callbacks) -> None:
        handle = claim()
        with django_capture_on_commit_callbacks(execute=True):
            assert handle.ack({"ignored": True})
        assert count() == 0 and count("pgjobs_dead") == 0
        assert handle.finished

    def test_s12_ack_keeps_the_result_while_retention_is_on(self) -> None:
        handle = claim(result_retention=3600)
        assert handle.ack({"answer": 42})
        state, result, finished_at = row(handle.id, "state", "result", "finished_at")
        assert (state, result) == ("done", {"answer": 42})
        assert finished_at is not None
        assert 3599 < seconds_from_now("purge_at", handle.id) <= 3600

    @override_settings(PGJOBS={"QUEUES": {"kept": {"RESULT_RETENTION": 60}}})
    def test_s12_result_retention_from_the_queue_settings(self) -> None:
        handle = claim(queue="kept")
        assert handle.ack([1, 2])
        assert row(handle.id, "state", "result") == ("done", [1, 2])


class TestS13Retry:
    def test_s13_retry_goes_back_to_pending_after_the_backoff(self) -> None:
        handle = claim(max_attempts=3)
        assert handle.retry("remote said no")
        state, last_error, errors, claimed_by = row(
            handle.id, "state", "last_error", "errors", "claimed_by"
        )
        assert (state, last_error, claimed_by) == ("pending", "remote said no", None)
        assert [(e["attempt"], e["error"], e["worker_id"]) for e in errors] == [
            (1, "remote said no", "w1")
        ]
        # The default backoff base is 10 s: the first delay lies in [5, 10].
        assert 4 < seconds_from_now("run_after", handle.id) <= 10

    def test_s13_retry_with_explicit_delay(self) -> None:
        handle = claim()
        assert handle.retry("later", delay=timedelta(minutes=2))
        assert 119 < seconds_from_now("run_after", handle.id) <= 120

    def test_s13_retry_records_an_exceptions_class_and_traceback(self) -> None:
        handle = claim()
        try:
            raise ValueError("bad value")
        except ValueError as error:
            assert handle.retry(error, delay=0)
        (entry,) = row(handle.id, "errors")[0]
        assert entry["error"] == "ValueError: bad value"
        assert entry["exception"] == "builtins.ValueError"
        assert "raise ValueError" in entry["traceback"]

    def test_s13_retry_with_attempts_spent_dead_letters(self) -> None:
        handle = claim(max_attempts=1)
        assert handle.retry("last straw")
        assert count() == 0
        reason, last_error, attempts = dead_row(handle.id, "reason", "last_error", "attempts")
        assert (reason, last_error, attempts) == ("max attempts exceeded", "last straw", 1)

    def test_s13_errors_history_is_bounded(self) -> None:
        with override_settings(PGJOBS={"ERRORS_KEPT": 3}):
            Job.objects.enqueue("demo.t", max_attempts=10)
            for attempt in range(1, 7):
                handle = Job.objects.claim_one("default", "w1")
                assert handle is not None and handle.attempt == attempt
                assert handle.retry(f"failure {attempt}", delay=0)
        errors = row(handle.id, "errors")[0]
        assert [e["attempt"] for e in errors] == [4, 5, 6]


class TestS15Fail:
    def test_s15_fail_dead_letters_at_once_with_the_reason_verbatim(self) -> None:
        handle = claim(max_attempts=10)
        assert handle.fail("customer deleted: no point retrying")
        assert count() == 0
        assert dead_row(handle.id, "reason", "attempts", "payload") == (
            "customer deleted: no point retrying",
            1,
            {"n": 1},
        )

    def test_s15_fail_defaults_to_failed(self) -> None:
        handle = claim()
        assert handle.fail()
        assert dead_row(handle.id, "reason", "last_error") == ("failed", "failed")


class TestS17AckBatch:
    def test_s17_ack_batch_acks_only_current_claims_and_counts_them(self) -> None:
        Job.objects.enqueue_many([{"kind": "demo.t"} for _ in range(4)])
        handles = Job.objects.claim_batch("default", 4, "w1")
        lapse(handles[0].id)
        assert Job.objects.cancel(handles[1].id)
        assert Job.objects.ack_batch(handles) == 2
        assert [r[0] for r in execute("SELECT id FROM pgjobs_job")] == [handles[0].id]

    def test_s17_ack_batch_stores_each_result(self) -> None:
        Job.objects.enqueue_many([{"kind": "demo.t", "result_retention": 60} for _ in range(3)])
        handles = Job.objects.claim_batch("default", 3, "w1")
        assert Job.objects.ack_batch(handles, [{"i": 0}, None, "two"]) == 3
        assert [row(h.id, "result")[0] for h in handles] == [{"i": 0}, None, "two"]

    def test_s17_ack_batch_of_nothing(self, django_assert_num_queries) -> None:
        with django_assert_num_queries(0):
            assert Job.objects.ack_batch([]) == 0


class TestS18Cancel:
    def test_s18_cancel_deletes_pending_and_running_jobs(self) -> None:
        running = claim()
        pending = Job.objects.enqueue("demo.t").id
        assert Job.objects.cancel(pending)
        assert Job.objects.cancel(running.id)
        assert count() == 0
        assert running.ack() is False

    def test_s18_cancel_of_nothing_returns_false(self) -> None:
        assert Job.objects.cancel(123456789) is False
        handle = claim(result_retention=60)
        handle.ack()
        assert Job.objects.cancel(handle.id) is False  # done jobs are not cancelled
        dead = claim()
        dead.fail()
        assert Job.objects.cancel(dead.id) is False


class TestS19GetJob:
    def test_s19_get_job_reads_live_done_and_dead_jobs(self) -> None:
        pending = Job.objects.enqueue("demo.t", {"p": 1}, key="k1").id
        assert Job.objects.get_job(pending).state == "pending"
        running = claim()
        record = Job.objects.get_job(running.id)
        assert (record.state, record.attempts, record.worker_id) == ("running", 1, "w1")
        assert record.claimed_by == running.token
        done = claim(result_retention=60)
        done.ack({"ok": True})
        record = Job.objects.get_job(done.id)
        assert (record.state, record.result) == ("done", {"ok": True})
        dead = claim()
        dead.fail("nope")
        record = Job.objects.get_job(dead.id)
        assert (record.state, record.reason, record.is_dead) == ("dead", "nope", True)
        assert record.died_at is not None and record.payload == {"n": 1}

    def test_s19_get_job_of_nothing_is_none(self) -> None:
        assert Job.objects.get_job(987654321) is None

    def test_s19_get_jobs_reads_many_from_both_tables_as_get_job_reads_each(self) -> None:
        pending = Job.objects.enqueue("demo.t", {"p": 1}).id
        running = claim()
        done = claim(result_retention=60)
        done.ack({"ok": [1, 2]})
        dead = claim(max_attempts=1)
        dead.retry("boom")
        ids = [pending, running.id, done.id, dead.id]
        found = Job.objects.get_jobs([*ids, 987654321])
        assert sorted(found) == sorted(ids)
        assert all(found[job_id] == Job.objects.get_job(job_id) for job_id in ids)
        assert [found[job_id].state for job_id in ids] == ["pending", "running", "done", "dead"]
        assert found[dead.id].reason == "max attempts exceeded"
        assert found[dead.id].errors[0]["error"] == "boom"
        assert Job.objects.get_jobs([]) == {}


class TestRequeue:
    def test_requeue_moves_a_dead_letter_back_with_a_fresh_budget(self) -> None:
        handle = claim(max_attempts=1, expires=60)
        handle.retry("boom")
        result = DeadJob.objects.requeue([handle.id])
        assert result == (1, 0)
        state, attempts, expires_at, last_error, errors = row(
            handle.id, "state", "attempts", "expires_at", "last_error", "errors"
        )
        assert (state, attempts, expires_at, last_error) == ("pending", 0, None, "boom")
        assert len(errors) == 1
        assert count("pgjobs_dead") == 0
        assert Job.objects.claim_one(handle.queue, "w1").id == handle.id

    def test_requeue_merges_into_the_live_job_of_its_key(self) -> None:
        dead = claim(key="acct:1")
        dead.fail()
        live = Job.objects.enqueue("demo.t", {"fresh": True}, key="acct:1", delay=300).id
        assert DeadJob.objects.requeue([dead.id, 999999]) == (0, 1)
        assert count("pgjobs_dead") == 0
        assert row(live, "payload")[0] == {"n": 1}
        assert seconds_from_now("run_after", live) <= 0

    def test_requeue_of_two_letters_with_one_key_makes_one_job(self) -> None:
        first = claim(key="k")
        first.fail()
        second = claim(key="k")
        second.fail()
        assert DeadJob.objects.requeue([first.id, second.id]) == (1, 1)
        assert count() == 1 and count("pgjobs_dead") == 0
