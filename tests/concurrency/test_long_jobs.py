"""Long-running jobs in-process: cancellation that reaches the handler (S32), timeouts
(S33), progress, and async handlers on the worker's event loop."""

from __future__ import annotations

import itertools
import logging
import time
from typing import Any

import pytest

from django_pgjobs import Cancelled, LeaseLost
from django_pgjobs.exceptions import InvalidTimeout
from django_pgjobs.models import Job
from tests import jobs
from tests.helpers import count, dead_row, execute, row, running_worker, wait_until

pytestmark = pytest.mark.django_db(transaction=True)


def notes(job_id: int) -> list[str]:
    return [
        text
        for (text,) in execute(
            "SELECT text FROM tests_note WHERE job_id = %s ORDER BY id", [job_id]
        )
    ]


def started(job_id: int) -> bool:
    return any(text.startswith(("started", "inside")) for text in notes(job_id))


class TestS32CancellationReachesTheHandler:
    def test_s32_cancelling_a_running_job_tells_its_handler_over_notify(
        self, caplog: pytest.LogCaptureFixture
    ) -> None:
        job_id = jobs.cooperative.enqueue().id
        with caplog.at_level(logging.INFO), running_worker(queues=["long"]) as worker:
            wait_until(lambda: started(job_id))
            assert Job.objects.cancel_many([job_id]) == 1
            wait_until(lambda: worker.stats.cancelled == 1)
        assert notes(job_id) == ["started", "saw cancel: cancelled"]
        assert dead_row(job_id, "reason") == ("cancelled",)  # requeueable, as before
        assert worker.stats.succeeded == worker.stats.lost == 0
        assert any(f"job cancelled id={job_id}" in m for m in caplog.messages)

    def test_s32_without_notify_the_next_heartbeat_tells_the_handler(self) -> None:
        job_id = jobs.cooperative.using(lease=2).enqueue().id
        with running_worker(queues=["long"], listen=False, poll_interval=0.2) as worker:
            wait_until(lambda: started(job_id))
            assert Job.objects.cancel_many([job_id]) == 1
            wait_until(lambda: worker.stats.cancelled == 1, timeout=5)
        assert notes(job_id)[-1] == "saw cancel: cancelled"

    def test_s32_s18_cancel_deletes_the_job_and_tells_its_handler(self) -> None:
        job_id = jobs.cooperative.enqueue().id
        with running_worker(queues=["long"]) as worker:
            wait_until(lambda: started(job_id))
            assert Job.objects.cancel(job_id) is True
            wait_until(lambda: worker.stats.cancelled == 1)
        assert row(job_id, "id") is None and dead_row(job_id, "id") is None
        assert Job.objects.cancel(job_id) is False

    def test_s32_a_job_inside_its_fence_is_told_and_dead_lettered_as_cancelled(self) -> None:
        job_id = jobs.fenced_waiter.enqueue().id
        with running_worker(queues=["long"]) as worker:
            wait_until(lambda: row(job_id, "state") == ("running",) and count("tests_note") == 0)
            time.sleep(0.2)  # inside the fence now (its note is not committed)
            started_at = time.monotonic()
            assert Job.objects.cancel_many([job_id]) == 1  # told: the fence holds the row
            assert time.monotonic() - started_at < 5  # the cancel did not wait for it
            wait_until(lambda: worker.stats.cancelled == 1)
            wait_until(lambda: dead_row(job_id, "reason") == ("cancelled",))
        assert count("tests_note") == 0  # the fence rolled back

    def test_s38_with_notify_off_a_job_inside_its_fence_is_told_at_its_heartbeat(
        self,
    ) -> None:
        """The PgBouncer setup: no NOTIFY, and the fence holds the row, so the cancel is a
        request; the worker's heartbeat, which a fence admits, finds it and tells the
        handler long before the sleep ends."""
        job_id = jobs.fenced_waiter.using(lease=2).enqueue(seconds=60).id
        with running_worker(queues=["long"], listen=False, poll_interval=0.2) as worker:
            wait_until(lambda: row(job_id, "state") == ("running",) and count("tests_note") == 0)
            time.sleep(0.2)  # inside the fence now (its note is not committed)
            assert Job.objects.cancel_many([job_id], reason="stop: quota") == 1
            wait_until(lambda: worker.stats.cancelled == 1, timeout=10)
            wait_until(lambda: dead_row(job_id, "reason") == ("stop: quota",))
        assert count("tests_note") == 0  # the fence rolled back

    def test_s32_a_transaction_mode_job_is_told_and_its_writes_rolled_back(self) -> None:
        job_id = jobs.atomic_waiter.enqueue().id
        with running_worker(queues=["long"]) as worker:
            wait_until(lambda: row(job_id, "state") == ("running",))
            time.sleep(0.2)
            assert Job.objects.cancel_many([job_id]) == 1
            wait_until(lambda: dead_row(job_id, "reason") == ("cancelled",))
            wait_until(lambda: worker.stats.cancelled == 1)
        assert count("tests_note") == 0

    def test_s32_an_async_handler_gets_cancelled_error_at_its_next_await(self) -> None:
        job_id = jobs.async_cancellable.enqueue().id
        with running_worker(queues=["long"]) as worker:
            wait_until(lambda: started(job_id))
            Job.objects.cancel_many([job_id])
            wait_until(lambda: worker.stats.cancelled == 1)
        assert notes(job_id) == ["started", "cancelled: cancelled"]
        assert dead_row(job_id, "reason") == ("cancelled",)

    def test_s32_a_cancelled_handlers_late_fenced_write_is_refused(self) -> None:
        job_id = jobs.cooperative.enqueue().id
        with running_worker(queues=["long"]):
            wait_until(lambda: started(job_id))
            handle = _claim_of(job_id)
            Job.objects.cancel_many([job_id])
            with pytest.raises(LeaseLost), handle.fenced():
                pass
            assert handle.ack() is False

    def test_a_handler_that_raises_cancelled_itself_dead_letters_its_job(self) -> None:
        jobs.POISON.clear()
        job_id = Job.objects.enqueue("tests.poison", {}).id
        jobs.POISON[job_id] = lambda ctx: (_ for _ in ()).throw(Cancelled("not worth it"))
        with running_worker(queues=["poison"]):
            wait_until(lambda: dead_row(job_id, "id") is not None)
        assert dead_row(job_id, "reason") == ("cancelled",)

    def test_a_job_cancelled_while_it_waits_for_a_thread_never_runs(self) -> None:
        blocker = jobs.cooperative.enqueue(seconds=30).id
        waiting = jobs.record.using(queue="long").enqueue(label="never").id
        with running_worker(queues=["long"], concurrency=1, prefetch=0) as worker:
            wait_until(lambda: started(blocker))
            Job.objects.cancel_many([waiting])
            Job.objects.cancel_many([blocker])
            wait_until(lambda: worker.stats.cancelled == 1)
        assert notes(waiting) == []


def _claim_of(job_id: int) -> Any:
    """A handle on the running job's current claim (as its worker holds it)."""
    from django_pgjobs.claims import JobHandle

    (values,) = execute(
        "SELECT queue, kind, claimed_by, attempts, max_attempts, lease_s, claimed_at, "
        "claimed_until, worker_id, run_after, created_at FROM pgjobs_job WHERE id = %s",
        [job_id],
    )
    queue, kind, token, attempt, max_attempts, lease_s, at, until, worker, run_after, created = (
        values
    )
    return JobHandle(
        id=job_id,
        queue=queue,
        kind=kind,
        key=None,
        priority=0,
        run_after=run_after,
        attempt=attempt,
        max_attempts=max_attempts,
        lease_s=lease_s,
        token=token,
        claimed_at=at,
        claimed_until=until,
        worker_id=worker,
        expires_at=None,
        created_at=created,
        payload={},
        using="default",
        manager=Job.objects,
    )


class TestS33Timeouts:
    def test_s33_a_sync_handler_past_its_timeout_is_abandoned_and_retried(self) -> None:
        job_id = jobs.stubborn.enqueue(seconds=2).id
        other = jobs.record.using(queue="long").enqueue(label="ran beside").id
        with running_worker(queues=["long"], concurrency=1, prefetch=0, poll_interval=0.2):
            # Its only thread is replaced: the other job runs while the stubborn one sleeps.
            wait_until(lambda: notes(other) == ["ran beside"], timeout=5)
            wait_until(
                lambda: (
                    row(job_id, "attempts", "last_error")[0] == 2
                    or dead_row(job_id, "id") is not None
                ),
                timeout=10,
            )
            wait_until(lambda: dead_row(job_id, "id") is not None, timeout=15)
        (errors,) = dead_row(job_id, "errors")
        assert [entry["error"] for entry in errors] == ["timed out after 0.5 s"] * 2
        assert dead_row(job_id, "reason") == ("max attempts exceeded",)
        assert "late write" not in notes(job_id)  # the abandoned handlers' fences refused

    def test_s33_an_async_handler_is_cancelled_at_its_deadline(self) -> None:
        job_id = jobs.async_cancellable.using(timeout=0.3, max_attempts=1).enqueue().id
        with running_worker(queues=["long"]):
            wait_until(lambda: dead_row(job_id, "id") is not None, timeout=10)
        assert notes(job_id) == ["started", "cancelled: None"]
        (errors,) = dead_row(job_id, "errors")
        assert errors[-1]["error"] == "timed out after 0.3 s"

    def test_s33_a_transaction_mode_job_is_bounded_by_statement_timeout(self) -> None:
        job_id = jobs.atomic_slow_sql.enqueue().id
        with running_worker(queues=["long"]):
            wait_until(lambda: dead_row(job_id, "id") is not None, timeout=15)
        (errors,) = dead_row(job_id, "errors")
        assert [entry["error"] for entry in errors] == ["timed out after 0.5 s"] * 2
        assert count("tests_note") == 0  # rolled back each time

    @pytest.mark.parametrize("timeout", [-1, 0, float("nan"), "soon", True, 10**12])
    def test_s33_a_bad_timeout_is_refused_at_enqueue_and_nothing_is_written(
        self, timeout: Any
    ) -> None:
        with pytest.raises(InvalidTimeout, match="timeout"):
            jobs.record.using(timeout=timeout).enqueue()
        assert count() == 0

    def test_s33_a_bad_timeout_is_refused_at_definition(self) -> None:
        from django_pgjobs import job

        with pytest.raises(InvalidTimeout):
            job(name="tests.never_defined", timeout=-5)(lambda: None)

    def test_s33_the_timeout_travels_with_the_job(self) -> None:
        job_id = jobs.stubborn.enqueue().id
        assert row(job_id, "timeout_s") == (0.5,)
        assert Job.objects.get_job(job_id).timeout_s == 0.5
        assert row(jobs.record.using(timeout=7).enqueue().id, "timeout_s") == (7.0,)


class TestProgress:
    def test_progress_is_stored_with_its_time_and_read_by_get_job(self) -> None:
        job_id = jobs.progressing.enqueue(steps=4, pause=0.4).id
        seen: list[Any] = []
        with running_worker(queues=["long"]):

            def reported() -> bool:
                record = Job.objects.get_job(job_id)
                if record is not None and record.progress is not None:
                    seen.append(record.progress)
                return record is not None and record.state == "running" and len(seen) > 0

            wait_until(reported, timeout=10)
            wait_until(lambda: row(job_id, "id") is None, timeout=10)
        first = seen[0]
        assert set(first) == {"fraction", "message", "data", "at"}
        assert 0 < first["fraction"] <= 1 and first["message"].startswith("step ")
        assert first["data"]["step"] == round(first["fraction"] * 4)

    def test_progress_is_written_at_most_once_a_second_per_job(
        self, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        writes: list[float] = []
        real = type(Job.objects).heartbeat_unlocked

        def counting(self: Any, handles: Any, progress: Any = None) -> Any:
            writes.extend(time.monotonic() for report in progress or [] if report is not None)
            return real(self, handles, progress)

        monkeypatch.setattr(type(Job.objects), "heartbeat_unlocked", counting)
        job_id = jobs.progressing.enqueue(steps=60, pause=0.05).id  # 60 reports in 3 s
        with running_worker(queues=["long"]):
            wait_until(lambda: row(job_id, "id") is None, timeout=15)
        assert 1 <= len(writes) <= 5
        gaps = [later - earlier for earlier, later in itertools.pairwise(writes)]
        assert all(gap >= 0.9 for gap in gaps)

    def test_progress_outside_a_worker_is_written_at_once(self) -> None:
        job_id = jobs.record.enqueue().id
        handle = Job.objects.claim_one("default", "test")
        assert handle is not None and handle.id == job_id
        handle.progress(0.25, "a quarter", rows=10)
        stored = Job.objects.get_job(job_id).progress
        assert (stored["fraction"], stored["message"], stored["data"]) == (
            0.25,
            "a quarter",
            {"rows": 10},
        )
        assert Job.objects.get_jobs([job_id])[job_id].progress == stored

    def test_jobsctl_running_shows_each_running_job_with_its_progress(self) -> None:
        from io import StringIO

        from django.core.management import call_command

        def jobsctl(*args: str) -> list[str]:
            out = StringIO()
            call_command("jobsctl", "running", *args, stdout=out)
            return out.getvalue().splitlines()

        assert jobsctl() == ["No job is running."]
        first, second = (jobs.record.enqueue().id for _ in range(2))
        jobs.record.using(queue="other").enqueue()
        reporting = Job.objects.claim_one("default", "w-1")
        Job.objects.claim_one("default", "w-2")
        assert reporting is not None and reporting.id == first
        reporting.progress(0.4, "embedding   chunks\n", rows=4)
        lines = jobsctl("default")
        assert lines[0].split()[:6] == ["id", "queue", "kind", "worker", "attempt", "running"]
        rows = {line.split()[0]: line for line in lines[2:]}
        assert set(rows) == {str(first), str(second)}  # the other queue's job is not running
        assert "w-1" in rows[str(first)] and "1/10" in rows[str(first)]
        assert rows[str(first)].rstrip().endswith("40% embedding chunks (0 s ago)")
        assert rows[str(second)].rstrip().endswith(" -")
        assert jobsctl("--limit", "1")[-1] == "(the first 1; --limit N shows more)"
        assert jobsctl("nosuch") == ["No job is running in nosuch."]

    def test_jobsctl_cancel_dead_letters_pending_and_running_jobs_by_id(self) -> None:
        from io import StringIO

        from django.core.management import call_command

        pending, running = (jobs.record.enqueue().id for _ in range(2))
        execute("UPDATE pgjobs_job SET priority = 5 WHERE id = %s", [running])
        assert Job.objects.claim_one("default", "w").id == running
        out = StringIO()
        call_command("jobsctl", "cancel", str(pending), str(running), "999999999", stdout=out)
        assert out.getvalue().startswith("Cancelled 2 of 3 job(s)")
        assert "not pending or running" in out.getvalue()
        assert dead_row(pending, "reason") == dead_row(running, "reason") == ("cancelled",)


class TestAsyncHandlers:
    def test_async_handlers_run_many_at_once_on_one_event_loop(self) -> None:
        Job.objects.enqueue_many([{"kind": "tests.async_sleep", "payload": {"seconds": 1}}] * 60)
        most = 0
        with running_worker(queues=["async"], concurrency=2, async_concurrency=100):
            deadline = time.monotonic() + 20
            while count() and time.monotonic() < deadline:
                most = max(most, count(where="state = 'running'"))
                time.sleep(0.02)
        assert count() == 0
        assert most > 10  # far more than its 2 threads: they wait together, on one loop

    def test_an_async_handler_writes_under_its_fence_with_the_async_orm(self) -> None:
        done = jobs.async_fenced.enqueue(text="kept").id
        with running_worker(queues=["async"]):
            wait_until(lambda: row(done, "id") is None)
        assert notes(done) == ["kept"]

    def test_an_async_fence_rolls_back_with_the_error(self) -> None:
        failed = jobs.async_fenced.using(max_attempts=1).enqueue(text="undone", fail=True).id
        with running_worker(queues=["async"]):
            wait_until(lambda: dead_row(failed, "id") is not None)
        assert notes(failed) == []
        assert "rolled back with the fence" in dead_row(failed, "last_error")[0]
