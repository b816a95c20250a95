"""Claims exactly once (S6) when claimers race: two threads for one row, many draining one
backlog, and no lock left held once a claim has committed. Claims in one transaction:
unit/test_claim.py."""

from __future__ import annotations

import threading
from collections import Counter

import pytest

from django_pgjobs.models import Job
from tests.helpers import count, execute, run_threads

pytestmark = pytest.mark.django_db


class TestS6ExactlyOnce:
    @pytest.mark.django_db(transaction=True)
    def test_s6_two_workers_race_for_one_row_exactly_one_gets_it(self) -> None:
        for _ in range(20):
            execute("DELETE FROM pgjobs_job")
            job_id = Job.objects.enqueue("demo.task").id
            got = run_threads(
                2, lambda i: [h.id for h in Job.objects.claim_batch("default", 1, f"w{i}")]
            )
            assert sorted(len(ids) for ids in got) == [0, 1]
            assert [job_id] in got

    @pytest.mark.django_db(transaction=True)
    def test_s6_no_claim_lock_is_held_after_the_claim(self) -> None:
        Job.objects.enqueue("demo.task")
        (handle,) = Job.objects.claim_batch("default", 1, "w1")
        # The claim committed: another connection can lock the row without waiting.
        execute("SET lock_timeout = '100ms'")
        assert execute("SELECT id FROM pgjobs_job FOR UPDATE NOWAIT") == [(handle.id,)]

    @pytest.mark.django_db(transaction=True)
    @pytest.mark.parametrize(("threads", "jobs", "batch"), [(6, 40, 1), (8, 5000, 50)])
    def test_s6_concurrent_drain_claims_and_acks_each_job_exactly_once(
        self, threads: int, jobs: int, batch: int
    ) -> None:
        per_thread = jobs
        all_ids = [
            result.id
            for result in Job.objects.enqueue_many(
                [{"kind": "demo.task", "payload": {"n": i}} for i in range(threads * per_thread)]
            )
        ]
        lock = threading.Lock()
        claims: Counter[int] = Counter()
        acks: Counter[int] = Counter()

        def drain(index: int) -> None:
            while True:
                handles = Job.objects.claim_batch("default", batch, f"worker-{index}")
                if not handles:
                    return
                acked = Job.objects.ack_batch(handles)
                assert acked == len(handles)
                with lock:
                    claims.update(h.id for h in handles)
                    acks.update(h.id for h in handles)

        run_threads(threads, drain, timeout=300)
        assert set(claims) == set(all_ids)
        assert max(claims.values()) == 1
        assert max(acks.values()) == 1
        assert count() == 0
