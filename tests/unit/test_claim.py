"""Claims in one rolled-back transaction: one statement (S6), order (S7), stamps (S8),
crash recovery (S9). Claimers racing each other: concurrency/test_claim.py."""

from __future__ import annotations

import json
import time
from datetime import timedelta

import pytest
from django.db import connection

from django_pgjobs.db import sql
from django_pgjobs.models import Job
from tests.helpers import (
    count,
    dead_row,
    execute,
    lapse,
    make_due,
    record_cancel_request,
    row,
    seconds_from_now,
)

pytestmark = pytest.mark.django_db


class TestS6ExactlyOnce:
    def test_s6_claim_is_one_statement(self, django_assert_num_queries) -> None:
        from django_pgjobs.managers.queues import limited_queues

        Job.objects.enqueue_many([{"kind": "demo.task"} for _ in range(5)])
        limited_queues("default", ["default"])  # whether "default" is limited, read now
        with django_assert_num_queries(1):
            handles = Job.objects.claim_batch("default", 5, "w1")
        assert len(handles) == 5

    def test_s6_a_claim_seconds_after_the_last_is_still_one_statement(
        self, django_assert_num_queries
    ) -> None:
        """Which queues have a limit is learnt from the claims themselves: a wake-up's
        claim, seconds after the last, reads no list of limited queues first."""
        Job.objects.enqueue_many([{"kind": "demo.task"} for _ in range(2)])
        assert len(Job.objects.claim_batch("default", 1, "w1")) == 1
        time.sleep(1.1)  # longer than a list of limited queues was once trusted
        with django_assert_num_queries(1):
            assert len(Job.objects.claim_batch("default", 1, "w1")) == 1


class TestS7Order:
    def test_s7_priority_desc_then_run_after_then_id(self) -> None:
        low_old = Job.objects.enqueue("demo.t", priority=-5, delay=0).id
        high_new = Job.objects.enqueue("demo.t", priority=5).id
        mid_a = Job.objects.enqueue("demo.t", priority=0).id
        mid_b = Job.objects.enqueue("demo.t", priority=0).id
        execute(
            "UPDATE pgjobs_job SET run_after = now() - interval '1 hour' WHERE id = %s", [mid_b]
        )
        execute(
            "UPDATE pgjobs_job SET run_after = now() - interval '2 hours' WHERE id = %s",
            [low_old],
        )
        order = [h.id for h in Job.objects.claim_batch("default", 10, "w1")]
        assert order == [high_new, mid_b, mid_a, low_old]

    def test_s7_claims_in_order_one_at_a_time(self) -> None:
        ids = [Job.objects.enqueue("demo.t", priority=p).id for p in (0, 3, 3, -1, 100, -100, 0)]
        claimed = []
        while handle := Job.objects.claim_one("default", "w1"):
            claimed.append(handle.id)
        expected = sorted(ids, key=lambda i: (-row(i, "priority")[0], i))
        assert claimed == expected

    def test_s7_order_holds_across_the_claimers_queues(self) -> None:
        a_low = Job.objects.enqueue("demo.t", queue="a", priority=1).id
        b_high = Job.objects.enqueue("demo.t", queue="b", priority=9).id
        c_other = Job.objects.enqueue("demo.t", queue="c", priority=50).id
        a_high = Job.objects.enqueue("demo.t", queue="a", priority=9).id
        execute(
            "UPDATE pgjobs_job SET run_after = now() - interval '1 minute' WHERE id = %s", [a_high]
        )
        order = [h.id for h in Job.objects.claim_batch(["a", "b"], 10, "w1")]
        assert order == [a_high, b_high, a_low]
        assert row(c_other, "state") == ("pending",)

    def test_s7_scheduled_jobs_are_not_claimed_until_due(self) -> None:
        later = Job.objects.enqueue("demo.t", delay=3600).id
        now = Job.objects.enqueue("demo.t").id
        assert [h.id for h in Job.objects.claim_batch("default", 10, "w1")] == [now]
        make_due(later)
        assert [h.id for h in Job.objects.claim_batch("default", 10, "w1")] == [later]

    def test_s7_n_zero_or_less_returns_nothing_without_a_query(
        self, django_assert_num_queries
    ) -> None:
        Job.objects.enqueue("demo.t")
        with django_assert_num_queries(0):
            assert Job.objects.claim_batch("default", 0, "w1") == []
            assert Job.objects.claim_batch("default", -3, "w1") == []
        assert row(Job.objects.get().id, "state") == ("pending",)

    def test_s7_claim_walks_the_index_without_sorting_the_backlog(self) -> None:
        execute(
            """
            INSERT INTO pgjobs_job (queue, kind, state, priority, run_after, attempts,
                                    max_attempts, lease_s, payload, errors, created_at)
            SELECT 'default', 'bulk', 'pending', g % 3,
                   now() + CASE WHEN g % 2 = 0 THEN interval '1 day' ELSE -interval '1 day' END
                         + g * interval '1 ms',
                   0, 5, 60, '{}', '[]', now()
            FROM generate_series(1, 30000) AS g
            """
        )
        execute("ANALYZE pgjobs_job")
        params = {
            "queues": ["default"],
            "floors": [None],
            "tops": [None],
            "lease_floor": None,
            "limit": 50,
            "worker_id": "w",
            "synchronous_commit": None,
            "due": True,
            "only_kinds": None,
            "not_kinds": None,
        }
        with connection.cursor() as cursor:
            cursor.execute("EXPLAIN (ANALYZE, FORMAT JSON) " + sql.CLAIM_JOBS, params)
            (plan,) = cursor.fetchone()
        nodes = list(_walk(json.loads(plan) if isinstance(plan, str) else plan))
        scans = [n for n in nodes if n.get("Relation Name") == "pgjobs_job"]
        assert not [n for n in scans if n["Node Type"] == "Seq Scan"]
        # Index scans read a handful of rows per level, never the 30,000-row backlog.
        assert max(n["Actual Rows"] * n["Actual Loops"] for n in scans) <= 50
        sorts = [n for n in nodes if n["Node Type"] == "Sort"]
        assert all(n["Actual Rows"] <= 10 for n in sorts)  # only the priority levels


def _walk(plan: object):
    if isinstance(plan, list):
        for item in plan:
            yield from _walk(item)
    elif isinstance(plan, dict):
        if "Node Type" in plan:
            yield plan
        for value in plan.values():
            if isinstance(value, list | dict):
                yield from _walk(value)


class TestS8Stamps:
    def test_s8_claim_stamps_attempt_token_worker_and_lease(self) -> None:
        job_id = Job.objects.enqueue("demo.t", lease=45).id
        (handle,) = Job.objects.claim_batch("default", 1, "host:1:abc")
        attempts, token, worker, claimed_at, until, state = row(
            job_id, "attempts", "claimed_by", "worker_id", "claimed_at", "claimed_until", "state"
        )
        assert (attempts, state, worker) == (1, "running", "host:1:abc")
        assert token == handle.token and handle.attempt == 1
        assert (until - claimed_at).total_seconds() == 45
        assert handle.claimed_until == until

    def test_s8_each_claim_gets_a_fresh_token(self) -> None:
        Job.objects.enqueue("demo.t")
        first = Job.objects.claim_one("default", "w1")
        lapse(first.id)
        second = Job.objects.claim_one("default", "w2")
        assert second.id == first.id and second.token != first.token
        assert second.attempt == 2


class TestS9Recovery:
    def test_s9_lapsed_job_is_claimable_again_and_consumes_an_attempt(self) -> None:
        job_id = Job.objects.enqueue("demo.t", max_attempts=3).id
        first = Job.objects.claim_one("default", "w1")
        assert Job.objects.claim_one("default", "w2") is None  # lease still valid
        lapse(job_id)
        second = Job.objects.claim_one("default", "w2")
        assert (second.id, second.attempt, second.worker_id) == (job_id, 2, "w2")
        errors = row(job_id, "errors")[0]
        assert errors[-1]["error"] == "lease lapsed" and errors[-1]["attempt"] == 1
        assert errors[-1]["worker_id"] == "w1"
        assert not first.ack()

    def test_s9_lapsed_job_with_no_attempts_left_is_dead_lettered_before_the_claim(
        self,
    ) -> None:
        job_id = Job.objects.enqueue("demo.t", max_attempts=1).id
        Job.objects.claim_one("default", "w1")
        lapse(job_id)
        assert Job.objects.claim_one("default", "w2") is None
        assert row(job_id, "id") is None
        reason, attempts, last_error = dead_row(job_id, "reason", "attempts", "last_error")
        assert (reason, attempts, last_error) == ("max attempts exceeded", 1, "lease lapsed")

    def test_s9_pre_claim_burial_does_not_cost_other_jobs_their_claim(self) -> None:
        spent = Job.objects.enqueue("demo.t", max_attempts=1).id
        Job.objects.claim_one("default", "w1")
        lapse(spent)
        fresh = Job.objects.enqueue("demo.t").id
        assert [h.id for h in Job.objects.claim_batch("default", 5, "w2")] == [fresh]
        assert dead_row(spent, "reason") == ("max attempts exceeded",)

    def test_s9_lapsed_claims_come_back_to_any_queue_claimer_of_theirs_only(self) -> None:
        job_id = Job.objects.enqueue("demo.t", queue="mail").id
        Job.objects.claim_one("mail", "w1")
        lapse(job_id)
        assert Job.objects.claim_one("default", "w2") is None
        assert Job.objects.claim_one("mail", "w2").id == job_id

    def test_s9_lease_is_stamped_from_the_row(self) -> None:
        job_id = Job.objects.enqueue("demo.t", lease=7).id
        Job.objects.claim_one("default", "w1")
        # From the claim's moment (its statement's start: in this test's transaction,
        # a little after now()), for the row's own lease.
        assert row(job_id, "claimed_until - claimed_at") == (timedelta(seconds=7),)
        assert 6 < seconds_from_now("claimed_until", job_id) < 8
        assert count("pgjobs_dead") == 0


class TestClaimSaysWhenNextDue:
    """A claim that comes up short says when a job of its queues is next due (the same
    answer as next_due_in), so that a worker whose queues ran dry need not ask."""

    def test_a_short_claim_answers_as_next_due_in_and_a_full_one_does_not(self) -> None:
        Job.objects.enqueue("demo.t", delay=20)
        Job.objects.enqueue("demo.t")
        handles, (known, due_in) = Job.objects.claim_for_worker("default", 5, "w")
        assert len(handles) == 1 and known
        asked = Job.objects.next_due_in("default")
        assert due_in is not None and asked is not None and 19 < due_in <= 20
        assert abs(due_in - asked) < 1
        Job.objects.enqueue_many([{"kind": "demo.t"}] * 3)
        handles, (known, due_in) = Job.objects.claim_for_worker("default", 2, "w")
        assert (len(handles), known, due_in) == (2, False, None)

    def test_nothing_due_is_known_as_none(self) -> None:
        assert Job.objects.claim_for_worker("default", 5, "w") == ([], (True, None))

    def test_a_claim_of_a_limited_queue_leaves_the_worker_to_ask(self) -> None:
        from django_pgjobs.models import QueueControl

        QueueControl.objects.set_limit("default", 5)
        Job.objects.enqueue("demo.t", delay=20)
        handles, (known, due_in) = Job.objects.claim_for_worker("default", 5, "w")
        assert (handles, known, due_in) == ([], False, None)

    def test_s37_a_rated_queue_says_when_its_next_slot_opens(self) -> None:
        """S37: the workers of a rate-limited queue wake when its next slot opens: the
        claim that found the rate spent says when (and so does next_due_in)."""
        from django_pgjobs.models import QueueControl

        QueueControl.objects.set_rate("default", "2/10s")
        Job.objects.enqueue_many([{"kind": "demo.t"}] * 4)
        handles, (known, _) = Job.objects.claim_for_worker("default", 5, "w")
        assert (len(handles), known) == (2, False)
        asked = Job.objects.next_due_in("default")
        assert asked is not None and 9 < asked <= 10
        # With nothing runnable left to wait for it, the slot is no reason to wake.
        execute(
            "UPDATE pgjobs_job SET run_after = now() + interval '1 hour' WHERE state = 'pending'"
        )
        asked = Job.objects.next_due_in("default")
        assert asked is not None and asked > 30  # the claims' lease, not the slot

    def test_s34_s37_a_rated_queue_whose_keyed_jobs_wait_for_their_key_does_not_spin(
        self,
    ) -> None:
        """The window emptied, but the job that waits is keyed, at its key's limit: the
        rate is not what holds it, so the answer is not a slot from now."""
        from django_pgjobs.models import QueueControl

        QueueControl.objects.set_rate("long", "1000/1s")
        Job.objects.enqueue_many([{"kind": "tests.locked_tenant", "payload": {"tenant": "a"}}] * 2)
        handles, _ = Job.objects.claim_for_worker("long", 5, "w")
        assert len(handles) == 1  # the key admits one at a time
        execute("UPDATE pgjobs_rate_claim SET at = at - interval '2 s'")
        asked = Job.objects.next_due_in("long")
        assert asked is not None and asked > 1  # the running claim's lease, not 1 ms

    def test_s37_a_rated_queue_whose_window_emptied_says_one_slot_from_now(self) -> None:
        """A worker stalled past the period between its claim and its question finds
        the window empty: a slot is open, so the answer is one slot's spacing (the
        period over the rate), neither never (it slept to its poll) nor now (a job that
        waits for its key's limit instead would make it spin)."""
        from django_pgjobs.models import QueueControl

        QueueControl.objects.set_rate("default", "5/1s")
        Job.objects.enqueue_many([{"kind": "demo.t"}] * 8)
        handles, _ = Job.objects.claim_for_worker("default", 8, "w")
        assert len(handles) == 5
        execute("UPDATE pgjobs_rate_claim SET at = at - interval '2 s'")
        asked = Job.objects.next_due_in("default")
        assert asked is not None and 0 < asked <= 0.2


def test_s12_a_claim_acked_twice_in_one_batch_is_done_once_with_its_result_kept() -> None:
    Job.objects.enqueue("tests.noop", result_retention=60)
    (handle,) = Job.objects.claim_batch("default", 1, "twice")

    assert Job.objects.ack_batch([handle, handle], [{"n": 1}, {"n": 1}]) == 1

    record = Job.objects.get_job(handle.id)
    assert record is not None and record.state == "done" and record.result == {"n": 1}


class TestAWorkersThreadsAndEventLoopClaimTogether:
    """A worker with async kinds claims for its threads and its event loop, each into
    capacity of its own kind, in one statement: a wake-up's claim is one round trip."""

    LOOP = ["tests.async_double"]

    def _enqueue(self, sync: int, loop: int) -> None:
        Job.objects.enqueue_many(
            [{"kind": "tests.noop", "priority": 1}] * sync
            + [{"kind": "tests.async_double", "payload": {"value": 1}, "priority": 5}] * loop
        )

    def _claim(self, threads: int, places: int) -> tuple[list[str], int]:
        from django.test.utils import CaptureQueriesContext

        with CaptureQueriesContext(connection) as queries:
            handles, _ = Job.objects.claim_for_worker(
                "default", threads, "w", places=places, loop_kinds=self.LOOP
            )
        claims = [query for query in queries if "Claim up to" in query["sql"]]
        return sorted(handle.kind for handle in handles), len(claims)

    def test_each_kind_fills_its_own_capacity_in_one_statement(self) -> None:
        self._enqueue(sync=5, loop=5)
        kinds, statements = self._claim(threads=2, places=3)
        assert kinds == ["tests.async_double"] * 3 + ["tests.noop"] * 2
        assert statements == 1

    @pytest.mark.parametrize(("threads", "places"), [(0, 3), (3, 0)])
    def test_a_full_side_takes_nothing_of_its_kinds(self, threads: int, places: int) -> None:
        """Higher-priority jobs of the full side's kinds wait; the other side's are taken."""
        self._enqueue(sync=5, loop=5)
        kinds, statements = self._claim(threads=threads, places=places)
        expected = "tests.async_double" if places else "tests.noop"
        assert kinds == [expected] * 3
        assert statements == 1

    def test_a_short_claim_of_both_says_when_the_next_job_is_due(self) -> None:
        self._enqueue(sync=1, loop=1)
        Job.objects.enqueue("tests.noop", delay=20)
        handles, (known, due_in) = Job.objects.claim_for_worker(
            "default", 5, "w", places=5, loop_kinds=self.LOOP
        )
        assert len(handles) == 2 and known
        assert due_in is not None and 19 < due_in <= 20

    def test_s34_an_async_keyed_job_is_taken_by_the_claim_that_finds_it(self) -> None:
        """An idle worker knows of no keyed job waiting; the claim's statement finds one
        of the event loop's kinds: the same claim takes it, not the next poll."""
        from django_pgjobs.managers import claiming

        claiming._keyed.clear()
        job_id = Job.objects.enqueue("tests.async_tenant", {"tenant": "t1"}).id
        handles, _ = Job.objects.claim_for_worker(
            "mixed", 2, "w", places=2, loop_kinds=["tests.async_tenant"]
        )
        assert [handle.id for handle in handles] == [job_id]

    def test_a_claim_short_of_the_jobs_it_buried_says_look_again_now(self) -> None:
        """Every job the statement took was cancelled (S38) and buried: more may wait."""
        ids = [Job.objects.enqueue("tests.noop").id for _ in range(2)]
        Job.objects.enqueue("tests.noop")
        for job_id in ids:
            record_cancel_request(job_id, reason="stop")
        handles, due = Job.objects.claim_for_worker("default", 2, "w")
        assert handles == [] and due == (True, 0.0)
        assert len(Job.objects.claim_batch("default", 5, "w")) == 1
