"""Limits where they meet (S34, S35, S37): keys over several queues, a queue's limit and
rate with keyed jobs in it, claims that waited for their turn, a rated queue's worker."""

from __future__ import annotations

import itertools
import threading
from datetime import datetime, timedelta

import pytest

from django_pgjobs.models import Job, QueueControl
from tests import jobs
from tests.concurrency.test_limits import most_at_once, most_in_a_window, tenant_intervals
from tests.helpers import execute, other_connection, run_threads, running_worker, wait_until

pytestmark = pytest.mark.django_db(transaction=True)


def keyed(tenant: str, queue: str, n: int = 0) -> int:
    return Job.objects.enqueue("tests.tenant", {"tenant": tenant, "n": n}, queue=queue).id


def running_in(queue: str) -> int:
    ((n,),) = execute(
        "SELECT count(*) FROM pgjobs_job WHERE state = 'running' AND queue = %s", [queue]
    )
    return int(n)


class TestS37KeysOverSeveralQueues:
    def test_s34_s37_every_key_of_every_queue_gets_its_turn(self) -> None:
        """Tenants a000-a029 in one queue and z in another: a claimer of both serves
        every tenant in turn, not the first five of the first queue over and over."""
        tenants = [f"a{i:03}" for i in range(30)]
        for tenant in tenants:
            for n in range(4):
                keyed(tenant, "qa", n)
        for n in range(20):
            keyed("z", "qb", n)
        assert execute("SELECT count(*) FROM pgjobs_job WHERE limit_key IS NULL") == [(0,)]
        served: set[str] = set()
        for _ in range(9):  # 45 claims: 31 keys, each one at a time in a fair turn
            handles = Job.objects.claim_batch(["qa", "qb"], 5, "w")
            assert handles
            served.update(handle.payload["tenant"] for handle in handles)
            Job.objects.ack_batch(handles)
        assert served == {*tenants, "z"}

    def test_s34_s37_a_key_in_two_queues_holds_its_limit_over_both(self) -> None:
        for n in range(6):
            keyed("shared", "qa", n)
            keyed("shared", "qb", n)
        first = Job.objects.claim_batch(["qa"], 5, "w1")
        second = Job.objects.claim_batch(["qb"], 5, "w2")
        third = Job.objects.claim_batch(["qa", "qb"], 5, "w3")
        assert len(first) + len(second) + len(third) == 2  # tests.tenant: concurrency=2


class TestS37QueueLimitsBindKeyedJobs:
    def test_s34_s37_keyed_jobs_count_against_the_queue_limit(self) -> None:
        QueueControl.objects.set_limit("qa", 1)
        for tenant in ("t1", "t2", "t3"):
            keyed(tenant, "qa")
        Job.objects.enqueue("tests.noop", queue="qa")
        assert len(Job.objects.claim_batch("qa", 10, "w1")) == 1
        assert Job.objects.claim_batch("qa", 10, "w2") == []
        assert Job.objects.claim_batch(["qa", "default"], 10, "w3") == []
        assert running_in("qa") == 1

    def test_s35_s37_keyed_claims_count_against_the_queue_rate(self) -> None:
        QueueControl.objects.set_rate("qa", "1/m")
        for tenant in ("t1", "t2", "t3"):
            keyed(tenant, "qa")
        Job.objects.enqueue("tests.noop", queue="qa")
        taken = [len(Job.objects.claim_batch("qa", 5, f"w{i}")) for i in range(4)]
        assert sum(taken) == 1
        assert execute("SELECT count(*) FROM pgjobs_rate_claim WHERE scope = 'queue:qa'") == [(1,)]

    def test_s34_s37_a_limit_set_behind_the_processs_back_binds_keyed_claims(self) -> None:
        """A process keeps which queues have a limit as its claims last saw it; a keyed
        claim that has not heard of a new limit yet takes none of that queue's jobs
        rather than too many."""
        keyed("t1", "qa")
        keyed("t2", "qa")
        Job.objects.claim_batch("qa", 1, "w0")  # learns that "qa" has no limit
        execute(
            "INSERT INTO pgjobs_queue (name, paused, max_running, limit_from_settings, "
            "updated_at) VALUES ('qa', false, 1, false, now())"
        )
        assert Job.objects.claim_batch("qa", 5, "w1") == []
        assert running_in("qa") == 1

    @pytest.mark.parametrize("listen", [True, False], ids=["notify", "poll-only"])
    def test_s34_s37_workers_keep_a_queue_limit_with_keyed_and_unkeyed_jobs(
        self, listen: bool
    ) -> None:
        """Two workers of 6 threads each on a queue limited to 2, with keyed jobs of
        many tenants and unkeyed jobs mixed: never more than 2 run at once."""
        QueueControl.objects.set_limit("tenants", 2)
        for i in range(12):
            jobs.tenant.enqueue(tenant=f"t{i % 6}", seconds=0.15, n=i)
            Job.objects.enqueue("tests.record", {"label": f"u{i}", "sleep": 0.05}, queue="tenants")
        samples: list[int] = []
        options = {"queues": ["tenants"], "concurrency": 6, "listen": listen, "poll_interval": 0.2}
        with running_worker(**options), running_worker(**options):

            def drained() -> bool:
                samples.append(running_in("tenants"))
                return execute("SELECT count(*) FROM pgjobs_job") == [(0,)]

            wait_until(drained, timeout=60, interval=0.01)
        assert max(samples) <= 2
        spans = [span for spans in tenant_intervals().values() for span in spans]
        assert len(spans) == 12 and most_at_once(spans) <= 2

    @pytest.mark.parametrize("listen", [True, False], ids=["notify", "poll-only"])
    def test_s34_s37_a_worker_of_several_queues_runs_the_keyed_jobs_of_a_limited_one(
        self, listen: bool
    ) -> None:
        """The claim of the other queues, which finds no keyed job in them, does not
        make the worker forget those waiting in the limited queue."""
        QueueControl.objects.set_limit("qa", 1)
        for n in range(4):
            keyed(f"t{n}", "qa", n)
        options = {"queues": ["qa", "qb"], "concurrency": 4, "listen": listen}
        with running_worker(**options, poll_interval=0.5):
            wait_until(lambda: execute("SELECT count(*) FROM pgjobs_job") == [(0,)], timeout=15)

    @pytest.mark.parametrize("kind", ["tests.noop", "tests.tenant"], ids=["unkeyed", "keyed"])
    def test_s37_a_worker_takes_the_jobs_of_a_queue_limited_behind_its_back_without_a_poll(
        self, kind: str
    ) -> None:
        """Its claim that skipped the queue's jobs, having learnt the queue has a limit
        now, claims again at once by the limited queue's own way: not at its poll."""

        def enqueue(n: int) -> None:
            payload = {"tenant": f"t{n}", "n": n} if kind == "tests.tenant" else {}
            Job.objects.enqueue(kind, payload, queue="qa")

        with running_worker(queues=["qa", "qb"], concurrency=4, poll_interval=30):
            enqueue(0)
            wait_until(lambda: execute("SELECT count(*) FROM pgjobs_job") == [(0,)])
            execute(
                "INSERT INTO pgjobs_queue (name, paused, max_running, limit_from_settings, "
                "updated_at) VALUES ('qa', false, 1, false, now())"
            )
            for n in range(1, 4):
                enqueue(n)  # each wakes the worker (NOTIFY)
            wait_until(lambda: execute("SELECT count(*) FROM pgjobs_job") == [(0,)], timeout=15)


class TestS37ClaimsAreStampedWhenTheirSlotIsTaken:
    @pytest.mark.parametrize("kind", ["tests.noop", "tests.tenant"], ids=["unkeyed", "keyed"])
    def test_s35_s37_a_claim_that_waited_for_its_turn_counts_from_when_it_got_it(
        self, kind: str
    ) -> None:
        """A claim whose transaction began before it waited for the queue's turn is
        stamped when it got the turn: the next claim straight after it is refused."""
        QueueControl.objects.set_rate("rq", "1/s")
        for n in range(3):
            payload = {"tenant": f"t{n}"} if kind == "tests.tenant" else {}
            Job.objects.enqueue(kind, payload, queue="rq")
        Job.objects.claim_batch("default", 1, "warm")  # the list of limited queues is read
        with other_connection(autocommit=False) as holder:
            # Another claimer's turn, held longer than the rate's period.
            holder.execute("SELECT 1 FROM pgjobs_queue WHERE name = 'rq' FOR UPDATE")
            releaser = threading.Timer(1.3, holder.rollback)
            releaser.start()
            began = execute("SELECT clock_timestamp()")[0][0]
            (taken,) = run_threads(1, lambda _: Job.objects.claim_batch("rq", 1, "late"))
            releaser.join()
        assert len(taken) == 1
        assert Job.objects.claim_batch("rq", 1, "next") == []
        stamps = [at for (at,) in execute("SELECT at FROM pgjobs_rate_claim ORDER BY at")]
        assert len(stamps) == 1
        # The job's own stamp is the rate's: the claim's lease and claimed_at start when
        # the turn was had, not when its transaction began to wait (1.3 s before).
        assert taken[0].claimed_at == stamps[0]
        assert taken[0].claimed_at - began >= timedelta(seconds=1.2)
        assert taken[0].claimed_until - taken[0].claimed_at == timedelta(seconds=taken[0].lease_s)


class TestS37RatedQueuesWakeWhenASlotOpens:
    @pytest.mark.parametrize("listen", [True, False], ids=["notify", "poll-only"])
    def test_s35_s37_a_worker_claims_as_soon_as_the_next_slot_opens(self, listen: bool) -> None:
        """A queue at 5 claims a second, a worker polling every 2 s: it claims again
        when the window reopens, not at its next poll (which halved the rate)."""
        QueueControl.objects.set_rate("rated", "5/s")
        Job.objects.enqueue_many([{"kind": "tests.claim_time", "queue": "rated"}] * 20)
        with running_worker(queues=["rated"], concurrency=4, listen=listen, poll_interval=2.0):
            wait_until(lambda: execute("SELECT count(*) FROM pgjobs_job") == [(0,)], timeout=30)
        moments = sorted(
            datetime.fromisoformat(text) for (text,) in execute("SELECT text FROM tests_note")
        )
        assert len(moments) == 20
        assert most_in_a_window(moments, timedelta(seconds=1)) <= 5
        gaps = [b - a for a, b in itertools.pairwise(moments)]
        # The slot opens one period after the claim it waits for: a worker that slept
        # until its poll would leave gaps of up to 2 s.
        assert max(gaps) < timedelta(seconds=1.5)
