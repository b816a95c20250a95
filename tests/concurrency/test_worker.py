"""The worker in-process: registration, outcomes, modes (S20, S21), wake-up (S23),
heartbeats (S11), unknown kinds (S25)."""

from __future__ import annotations

import logging
import time
from typing import Any

import pytest
from django.test import override_settings

from django_pgjobs import registry
from django_pgjobs.models import Job
from django_pgjobs.worker import Worker, default_queues, pacing
from tests import jobs
from tests.helpers import (
    count,
    dead_row,
    drain,
    execute,
    row,
    running_worker,
    seconds_from_now,
    wait_until,
)

pytestmark = pytest.mark.django_db(transaction=True)


def notes() -> list[tuple[Any, ...]]:
    return execute("SELECT job_id, text, attempt FROM tests_note ORDER BY id")


class TestRegistration:
    def test_job_keeps_working_as_a_plain_function(self) -> None:
        assert jobs.plain(value=4) == 8
        assert jobs.plain.kind == "tests.plain"
        assert registry.get_definition("tests.plain").takes_context is False
        assert registry.get_definition("tests.record").takes_context is True

    def test_enqueue_through_the_decorator_stores_the_payload_and_defaults(self) -> None:
        job_id = jobs.misbehave.enqueue(how="fine").id
        assert row(job_id, "kind", "payload", "max_attempts") == (
            "tests.misbehave",
            {"how": "fine"},
            3,
        )
        other = jobs.misbehave.using(max_attempts=9, delay=60).enqueue(how="x").id
        assert row(other, "max_attempts")[0] == 9
        assert 59 < seconds_from_now("run_after", other) <= 60

    def test_key_function_coalesces_triggers(self) -> None:
        first = jobs.keyed.enqueue(account=7, version=1)
        second = jobs.keyed.enqueue(account=7, version=2)
        assert second == (first.id, False)
        assert row(first.id, "key", "payload") == ("account:7", {"account": 7, "version": 2})

    def test_jobs_modules_are_discovered(self) -> None:
        assert "tests.record" in registry.registered_kinds()

    def test_registering_a_kind_twice_is_refused(self) -> None:
        from django_pgjobs import job

        with pytest.raises(ValueError, match="already registered"):
            job(name="tests.record")(lambda ctx: None)

    def test_bad_decorator_defaults_fail_at_decoration(self) -> None:
        from django_pgjobs import job
        from django_pgjobs.exceptions import InvalidPriority

        with pytest.raises(InvalidPriority):
            job(name="tests.never", priority=1000)(jobs.noop.func)
        assert registry.get_definition("tests.never") is None

    def test_default_queues_include_configured_and_declared_ones(self) -> None:
        assert default_queues()[:2] == ["default", "slow"]


class TestOutcomes:
    def test_burst_drains_and_returns(self) -> None:
        ids = [jobs.record.enqueue(label=str(i)).id for i in range(30)]
        worker = drain()
        assert count() == 0
        assert sorted(int(r[0]) for r in notes()) == sorted(ids)
        assert (worker.stats.claimed, worker.stats.succeeded) == (30, 30)

    def test_a_burst_runs_the_next_run_a_transaction_mode_job_left_under_its_key(self) -> None:
        # No notification and no poll to find it: the recorded outcome itself says look.
        jobs.self_renewing.enqueue(left=3)
        worker = Worker(burst=True, sweep_interval=0, poll_interval=3600, listen=False)
        assert worker.run() == 0
        assert sorted(text for _, text, _ in notes()) == ["0", "1", "2", "3"]
        assert count() == 0

    def test_plain_async_and_retained_results(self) -> None:
        plain = jobs.plain.using(result_retention=60).enqueue(value=21).id
        asynchronous = jobs.async_double.using(result_retention=60).enqueue(value=5).id
        drain()
        assert row(plain, "state", "result") == ("done", 42)
        assert row(asynchronous, "state", "result") == ("done", 10)

    def test_retry_raised_with_a_delay(self) -> None:
        job_id = jobs.misbehave.enqueue(how="retry").id
        drain()
        assert row(job_id, "state", "last_error", "attempts") == ("pending", "not yet", 1)
        assert 29 < seconds_from_now("run_after", job_id) <= 30

    def test_fail_raised_dead_letters_with_the_reason(self) -> None:
        job_id = jobs.misbehave.enqueue(how="fail").id
        drain()
        assert dead_row(job_id, "reason", "attempts") == ("hopeless", 1)

    def test_an_exception_is_retried_with_backoff_and_recorded(self) -> None:
        job_id = jobs.misbehave.using(queue="slow").enqueue(how="error").id
        drain()
        state, last_error, errors = row(job_id, "state", "last_error", "errors")
        assert (state, last_error) == ("pending", "ValueError: bad value")
        assert errors[0]["exception"] == "builtins.ValueError"
        assert "bad value" in errors[0]["traceback"]
        assert 0 < seconds_from_now("run_after", job_id) <= 2  # slow queue: base 2 s

    def test_an_exception_on_the_last_attempt_dead_letters(self) -> None:
        job_id = jobs.misbehave.using(max_attempts=1).enqueue(how="error").id
        worker = drain()
        assert dead_row(job_id, "reason", "last_error") == (
            "max attempts exceeded",
            "ValueError: bad value",
        )
        assert worker.stats.dead == 1

    def test_a_non_json_result_dead_letters_at_once(self) -> None:
        job_id = jobs.misbehave.enqueue(how="non_json").id
        drain()
        (reason,) = dead_row(job_id, "reason")
        assert reason.startswith("result is not JSON")

    def test_system_exit_in_a_handler_is_a_failure_not_an_exit(self) -> None:
        job_id = jobs.misbehave.enqueue(how="exit").id
        drain()
        assert row(job_id, "state", "last_error") == ("pending", "SystemExit: 3")

    def test_s25_unknown_kind_is_retried_with_backoff_never_imported(self) -> None:
        job_id = Job.objects.enqueue("os.system", {"command": "touch /tmp/pwned"}).id
        drain()
        state, last_error, attempts = row(job_id, "state", "last_error", "attempts")
        assert (state, attempts) == ("pending", 1)
        assert last_error == (
            "unknown job kind 'os.system': this worker has no handler of that name. Workers "
            "know the @job functions of every installed app's jobs.py, of the modules in "
            "PGJOBS['JOB_MODULES'] and of runjobs --import: a kind defined elsewhere "
            "(shop/tasks.py, say) is known only where something imports its module. After "
            "deploying a new kind, restart the workers; otherwise check the spelling."
        )
        assert seconds_from_now("run_after", job_id) > 4

    def test_a_payload_that_is_not_an_object_dead_letters(self) -> None:
        job_id = jobs.record.enqueue(label="x").id
        execute("UPDATE pgjobs_job SET payload = '[1, 2]' WHERE id = %s", [job_id])
        drain()
        assert dead_row(job_id, "reason") == ("payload is not a JSON object: list",)

    def test_max_jobs_stops_after_that_many(self) -> None:
        for i in range(10):
            jobs.record.enqueue(label=str(i))
        worker = Worker(max_jobs=3, concurrency=2, sweep_interval=0, poll_interval=0.2)
        assert worker.run() == 0
        assert worker.stats.claimed == 3 and count() == 7


class TestModes:
    def test_s20_lease_mode_fenced_result_commits_with_its_ack(self) -> None:
        job_id = jobs.fenced_record.enqueue(label="result").id
        worker = drain()
        assert notes() == [(job_id, "result", 1)]
        assert count() == 0 and worker.stats.succeeded == 1

    def test_s21_transaction_mode_commits_writes_and_deletion_together(self) -> None:
        job_id = jobs.atomic_write.enqueue(text="once").id
        drain()
        assert notes() == [(job_id, "once", 1)]
        assert count() == 0 and count("pgjobs_dead") == 0

    def test_s21_transaction_mode_error_rolls_back_writes_and_records_the_failure(self) -> None:
        job_id = jobs.atomic_write.using(queue="slow").enqueue(text="never", error=True).id
        drain()
        assert notes() == []
        assert row(job_id, "state", "attempts", "last_error") == (
            "pending",
            1,
            "RuntimeError: rolled back",
        )


class TestWakeUp:
    def test_s23_an_idle_worker_starts_a_new_job_without_waiting_for_a_poll(self) -> None:
        with running_worker(poll_interval=30) as worker:
            wait_until(lambda: worker.stats.claimed == 0 and worker.wakeup.connected)
            time.sleep(0.2)
            started = time.monotonic()
            jobs.record.enqueue(label="wake")
            wait_until(lambda: count("tests_note") == 1, timeout=5)
            latency = time.monotonic() - started
        assert latency < 2.0  # a poll would take 30 s

    def test_s23_with_notify_off_polling_alone_runs_the_job(self) -> None:
        with (
            override_settings(PGJOBS={"NOTIFY": False}),
            running_worker(poll_interval=0.3) as worker,
        ):
            assert worker.listen is False
            jobs.record.enqueue(label="polled")
            wait_until(lambda: count("tests_note") == 1, timeout=5)

    def test_s23_the_worker_sleeps_until_the_next_scheduled_job(self) -> None:
        with running_worker(poll_interval=30) as worker:
            wait_until(lambda: worker.wakeup.connected)
            jobs.record.using(delay=1.5).enqueue(label="scheduled")
            # A fresh delayed job sends no NOTIFY: nudge the worker once so it looks.
            jobs.record.enqueue(label="now")
            started = time.monotonic()
            wait_until(lambda: count("tests_note") == 2, timeout=10)
            waited = time.monotonic() - started
        assert 1.0 < waited < 5.0


class TestHeartbeats:
    def test_s11_the_worker_heartbeats_long_jobs_so_they_are_not_reclaimed(self) -> None:
        job_id = jobs.record.using(lease=2).enqueue(label="long", sleep=5).id
        with running_worker(poll_interval=0.5) as worker:
            wait_until(lambda: count("tests_note") == 1)
            for _ in range(8):
                time.sleep(0.5)
                remaining = execute(
                    "SELECT extract(epoch FROM claimed_until - now()) FROM pgjobs_job "
                    "WHERE id = %s",
                    [job_id],
                )
                if not remaining:
                    break
                assert float(remaining[0][0]) > 0  # never lapsed while its worker lives
            wait_until(lambda: count() == 0, timeout=10)
        assert notes() == [(job_id, "long", 1)]
        assert worker.stats.succeeded == 1

    def test_a_heartbeat_due_during_a_backoff_waits_for_its_end_without_spinning(self) -> None:
        """No heartbeat is sent while the worker backs off from a fault: the loop sleeps
        to the backoff's end, it does not go round with a zero timeout on the heartbeat
        that came due meanwhile (a worker whose steps failed at every try once spun at
        three quarters of a core for as long as they failed)."""
        jobs.record.using(lease=30).enqueue(label="long", sleep=2.5)
        with running_worker(poll_interval=0.5) as worker:
            wait_until(lambda: count("tests_note") == 1)
            timeouts: list[float] = []
            wait = worker._wait

            def counted(timeout: float) -> None:
                timeouts.append(timeout)
                wait(timeout)

            worker._wait = counted  # type: ignore[method-assign]
            worker.faults.retry_at = time.monotonic() + 1.5
            worker.leases.next_heartbeat_at = time.monotonic() - 60  # due long ago
            time.sleep(1.0)
            turns = len(timeouts)
            wait_until(lambda: count() == 0, timeout=10)
        assert turns < 20, f"{turns} turns of the loop in 1 s of backoff: {timeouts[:10]}"
        assert worker.stats.succeeded == 1


@pytest.fixture
def quick_jobs_count_as_short(monkeypatch: pytest.MonkeyPatch) -> None:
    """Jobs that measured milliseconds count as short whatever the machine's load: a
    no-op timed at 12 ms on a busy CI machine would otherwise shrink the prefetch
    (PREFETCH_WAIT_S over the mean run time) and with it the jobs a test waits for."""
    monkeypatch.setattr(pacing, "PREFETCH_WAIT_S", 60.0)


class TestPrefetch:
    """Short jobs are claimed ahead of free threads; slow ones never are."""

    def _one_thread_held_by_a_gate(self, name: str, behind: list[dict[str, Any]]) -> None:
        """Three quick jobs (they give the worker a run time), then a gate that holds the
        only thread, then the jobs `behind`, in claim order. The tests that call it use
        `quick_jobs_count_as_short`."""
        jobs.GATES[name].clear()
        jobs.AT_GATE[name].clear()
        Job.objects.enqueue_many([{"kind": "tests.noop", "priority": 10}] * 3)
        Job.objects.enqueue("tests.gate", {"name": name}, priority=5)
        Job.objects.enqueue_many(behind)

    def _wait_for_the_gate(self, name: str, running: int) -> None:
        """Until the gate holds the thread and `running` jobs are claimed: before it does,
        a quick job may still be running, the gate among those waiting for the thread."""
        wait_until(
            lambda: jobs.AT_GATE[name].is_set() and count(where="state = 'running'") == running
        )

    @pytest.mark.usefixtures("quick_jobs_count_as_short")
    def test_short_jobs_wait_claimed_for_a_thread_up_to_the_prefetch(self) -> None:
        self._one_thread_held_by_a_gate("ahead", [{"kind": "tests.noop"}] * 20)
        try:
            with running_worker(concurrency=1, prefetch=5, poll_interval=0.2):
                self._wait_for_the_gate("ahead", running=6)
                time.sleep(0.3)
                assert count(where="state = 'running'") == 6  # the gate and 5 waiting
                jobs.GATES["ahead"].set()
                wait_until(lambda: count() == 0)
        finally:
            jobs.GATES["ahead"].set()

    def test_a_worker_claims_a_few_sizes_only(self) -> None:
        """Each claim size is a statement prepared once per connection."""
        worker = Worker(concurrency=10, prefetch=100)
        sizes = {free: worker.pacing.claim_size(free) for free in range(1, 111)}
        assert all(size <= free for free, size in sizes.items())
        assert [sizes[free] for free in range(1, 11)] == list(range(1, 11))
        assert sizes[110] == 110 and sizes[109] == 74 and sizes[11] == 11
        assert len(set(sizes.values())) <= 18

    def test_a_worker_asks_for_a_few_sizes_of_event_loop_places(self) -> None:
        """The threads' and the loop's claims are one statement per pair of sizes."""
        worker = Worker(concurrency=10, async_concurrency=100)
        now = time.monotonic()
        places = {free: worker.pacing.loop_places(free, 100, now) for free in range(101)}
        assert all(asked <= free for free, asked in places.items())
        assert places[100] == 100 and places[99] == 64 and places[1] == 1 and places[0] == 0
        assert len(set(places.values())) <= 9

    def test_slow_jobs_are_never_claimed_ahead(self) -> None:
        Job.objects.enqueue_many([{"kind": "tests.record", "payload": {"sleep": 0.2}}] * 6)
        most = 0
        with running_worker(concurrency=1, prefetch=50, poll_interval=0.2):
            deadline = time.monotonic() + 15
            while count() and time.monotonic() < deadline:
                most = max(most, count(where="state = 'running'"))
                time.sleep(0.01)
        assert count() == 0 and most == 1

    @pytest.mark.usefixtures("quick_jobs_count_as_short")
    def test_s25_a_stop_hands_back_the_waiting_jobs_at_once(self) -> None:
        self._one_thread_held_by_a_gate("stop", [{"kind": "tests.noop"}] * 20)
        try:
            with running_worker(concurrency=1, prefetch=5, poll_interval=0.2) as worker:
                self._wait_for_the_gate("stop", running=6)
                worker.stop()
                # Handed back while the gate still runs, their attempts refunded.
                wait_until(lambda: count(where="state = 'pending' AND attempts = 0") == 20)
                assert execute("SELECT kind FROM pgjobs_job WHERE state = 'running'") == [
                    ("tests.gate",)
                ]
                jobs.GATES["stop"].set()
        finally:
            jobs.GATES["stop"].set()
        assert count() == 20 and worker.stats.succeeded == 4

    @pytest.mark.usefixtures("quick_jobs_count_as_short")
    def test_a_job_whose_claim_lapsed_while_it_waited_is_not_started(
        self, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        # Heartbeats extend nothing, as when the process is paused past the lease.
        monkeypatch.setattr(
            type(Job.objects), "heartbeat_unlocked", lambda self, handles, extend=None: []
        )
        self._one_thread_held_by_a_gate("lapse", [])
        waiting = jobs.record.using(lease=1).enqueue(label="waited").id
        try:
            with running_worker(concurrency=1, prefetch=5, poll_interval=0.2):
                wait_until(lambda: row(waiting, "state") == ("running",))
                # Its claim lapses; the worker takes it back and claims it again.
                wait_until(lambda: row(waiting, "attempts") == (2,), timeout=10)
                jobs.GATES["lapse"].set()
                wait_until(lambda: count() == 0)
        finally:
            jobs.GATES["lapse"].set()
        assert notes() == [(waiting, "waited", 2)]  # never run on the lapsed first claim

    @pytest.mark.usefixtures("quick_jobs_count_as_short")
    def test_s21_a_waiting_transaction_mode_job_keeps_its_lease(self) -> None:
        self._one_thread_held_by_a_gate("lease", [])
        waiting = jobs.atomic_write.using(lease=1).enqueue(text="after the gate").id
        try:
            with running_worker(concurrency=1, prefetch=5, poll_interval=0.2):
                wait_until(lambda: row(waiting, "state") == ("running",))
                for _ in range(6):  # three leases long
                    time.sleep(0.5)
                    assert seconds_from_now("claimed_until", waiting) > 0
                    assert row(waiting, "attempts") == (1,)
                jobs.GATES["lease"].set()
                wait_until(lambda: count() == 0)
        finally:
            jobs.GATES["lease"].set()
        assert notes() == [(waiting, "after the gate", 1)]


def test_the_worker_logs_its_drain_window_as_times_not_epoch_seconds(
    caplog: pytest.LogCaptureFixture,
) -> None:
    from datetime import datetime

    jobs.noop.enqueue()
    with caplog.at_level(logging.INFO, logger="django_pgjobs.worker"):
        drain()
    stopped = next(r.getMessage() for r in caplog.records if "worker stopped" in r.getMessage())
    for name in ("first_claim_at", "last_recorded_at"):
        moment = stopped.split(f"{name}=")[1].split()[0]
        assert datetime.fromisoformat(moment).tzinfo is not None, stopped
