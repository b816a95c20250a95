"""Fencing (S16): writes in a fence commit with the ack or not at all, a stale worker's
result never commits after a newer claim, and no claimer takes a job over while its fence
is open. The rest of the handle, in one transaction: unit/test_handle.py."""

from __future__ import annotations

import itertools
import threading

import pytest
from django.db import connection

from django_pgjobs.claims import JobHandle
from django_pgjobs.exceptions import LeaseLost
from django_pgjobs.models import Job
from tests.helpers import count, execute, lapse, row, run_threads, seconds_from_now, wait_until

pytestmark = pytest.mark.django_db


def claim(**enqueue_options: object) -> JobHandle:
    """Enqueue one job on a queue of its own (unless told one) and claim it."""
    enqueue_options.setdefault("queue", f"solo-{next(_solo_queues)}")
    job_id = Job.objects.enqueue("demo.t", {"n": 1}, **enqueue_options).id
    handle = Job.objects.claim_one(str(enqueue_options["queue"]), "w1")
    assert handle is not None and handle.id == job_id
    return handle


_solo_queues = itertools.count()


class TestS16Fencing:
    @pytest.mark.django_db(transaction=True)
    def test_s16_fenced_writes_and_ack_commit_together(self) -> None:
        handle = claim()
        with handle.fenced():
            execute("INSERT INTO tests_note (text) VALUES ('result')")
            assert handle.ack()
            assert not handle.finished  # not until the block commits
        assert handle.finished
        assert count("tests_note") == 1 and count() == 0

    @pytest.mark.django_db(transaction=True)
    def test_s16_an_error_in_the_fence_rolls_back_writes_and_ack(self) -> None:
        handle = claim()
        with pytest.raises(RuntimeError), handle.fenced():
            execute("INSERT INTO tests_note (text) VALUES ('result')")
            handle.ack()
            raise RuntimeError("crash before commit")
        assert count("tests_note") == 0
        assert row(handle.id, "state") == ("running",)
        assert not handle.finished

    @pytest.mark.django_db(transaction=True)
    def test_s16_stale_worker_result_never_commits_after_a_newer_claim(self) -> None:
        """A worker paused past its lease wakes up and tries to write: refused, and the
        newer claim's result stands."""
        stale = claim()
        lapse(stale.id)
        fresh = Job.objects.claim_one(stale.queue, "w2")
        assert fresh is not None
        with fresh.fenced():
            execute("INSERT INTO tests_note (text) VALUES ('fresh')")
            assert fresh.ack()
        with pytest.raises(LeaseLost), stale.fenced():
            execute("INSERT INTO tests_note (text) VALUES ('stale')")
        assert execute("SELECT text FROM tests_note") == [("fresh",)]

    @pytest.mark.django_db(transaction=True)
    def test_s16_no_takeover_while_a_fence_is_open(self) -> None:
        """The fence locks the row: once the lease lapses mid-fence, a claimer still skips
        the job, so the fenced writes commit and the job is not handed out twice."""
        handle = claim(lease=1)
        entered = threading.Event()
        release = threading.Event()
        acked: list[bool] = []

        def fenced_writer() -> None:
            try:
                with handle.fenced():
                    entered.set()
                    assert release.wait(10)
                    execute("INSERT INTO tests_note (text) VALUES ('fenced')")
                    acked.append(handle.ack())
            finally:
                connection.close()

        writer = threading.Thread(target=fenced_writer)
        writer.start()
        assert entered.wait(10)
        wait_until(lambda: seconds_from_now("claimed_until", handle.id) < 0)
        thief = run_threads(1, lambda _: Job.objects.claim_one(handle.queue, "thief"))
        release.set()
        writer.join(10)
        assert thief == [None]
        assert acked == [True]
        assert execute("SELECT text FROM tests_note") == [("fenced",)]
        assert count() == 0
