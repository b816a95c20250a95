"""Parents where features meet (S29, S30, S40): a parent that a rollback, a cancel, the
admin, pruning or a batch's end took away, a parent acked without result retention, and
requeues of several dead parents of one child. Each test joins dependencies with another
feature and is named after the rules it joins."""

from __future__ import annotations

from typing import Any

import pytest
from django.db import transaction
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from django_pgjobs.batches import Callback, batch
from django_pgjobs.dependencies import Parent
from django_pgjobs.exceptions import InvalidDependency
from django_pgjobs.models import DeadJob, Job
from tests.helpers import count, dead_row, drain, execute, row, scalar

pytestmark = pytest.mark.django_db(transaction=True)


def claim_one(job_id: int) -> Any:
    (handle,) = [h for h in Job.objects.claim_batch("default", 100, "w") if h.id == job_id]
    return handle


def where(job_id: int) -> str | None:
    """'waiting', 'pending', ... for a live job; 'dead: <reason>'; None: in no table."""
    found = row(job_id, "state")
    if found is not None:
        return str(found[0])
    dead = dead_row(job_id, "reason")
    return None if dead is None else f"dead: {dead[0]}"


def assert_refused(after: list[Any], match: str = "left no trace") -> None:
    """An enqueue after `after` is refused with InvalidDependency, and writes nothing."""
    jobs_before, edges_before = count(), count("pgjobs_dependency")
    with pytest.raises(InvalidDependency, match=match):
        Job.objects.enqueue("demo.task", after=after)
    with pytest.raises(InvalidDependency, match=match):
        Job.objects.enqueue_many([{"kind": "demo.task", "after": after}])
    assert (count(), count("pgjobs_dependency")) == (jobs_before, edges_before)


class TestS40GoneParents:
    def test_s40_child_after_rolled_back_parent_is_refused(self) -> None:
        with transaction.atomic():
            parent = Job.objects.enqueue("demo.task")
            transaction.set_rollback(True)
        assert_refused([parent])

    def test_s18_s40_child_after_cancelled_parent_is_refused(self) -> None:
        parent = Job.objects.enqueue("demo.task")
        assert Job.objects.cancel(parent.id)
        assert_refused([parent])
        assert_refused([Parent(parent, on_failure="run")])

    def test_s24_s40_child_after_a_dead_letter_deleted_or_pruned_is_refused(self) -> None:
        deleted, pruned = (Job.objects.enqueue("demo.task") for _ in range(2))
        assert [h.fail("broken") for h in Job.objects.claim_batch("default", 2, "w")] == [True] * 2
        DeadJob.objects.filter(pk=deleted.id).delete()  # the admin's delete
        execute("UPDATE pgjobs_dead SET died_at = now() - interval '2 days'")
        assert DeadJob.objects.prune_outside_queues([], 3600, 100) == 1
        for parent in (deleted, pruned):
            assert_refused([Parent(parent, on_failure="run")])
            assert_refused([parent])

    def test_s31_s40_child_after_a_callback_deleted_unfired_is_refused(self) -> None:
        """Publish after on_success, after a failed batch: on_success was deleted unfired."""
        with batch(
            on_success=Callback("tests.plain", value=1), on_failure=Callback("tests.plain")
        ) as b:
            b.add("tests.misbehave", how="fail")
        on_success = b.on_success
        assert on_success is not None
        drain()  # the member dies, on_failure runs, on_success is deleted unfired
        assert where(on_success.id) is None
        assert_refused([on_success])

    def test_s12_s40_child_after_a_parent_acked_without_retention_is_refused(self) -> None:
        parent = Job.objects.enqueue("demo.task")
        assert claim_one(parent.id).ack("its result")
        assert_refused([parent], match="result_retention")

    def test_s12_s40_child_after_a_parent_done_with_retention_runs_with_its_result(
        self,
    ) -> None:
        parent = Job.objects.enqueue("demo.task", result_retention=3600)
        assert claim_one(parent.id).ack({"n": 1})
        child = Job.objects.enqueue("demo.task", after=[parent])
        assert where(child.id) == "pending"
        assert claim_one(child.id).parent_results() == {parent.id: {"n": 1}}

    def test_s24_s30_s40_a_live_child_whose_dead_parent_is_deleted_waits_for_the_others(
        self,
    ) -> None:
        """A dead parent's cancel dependents died with it, its on_failure="run" ones
        counted its death: deleting or pruning its letter later strands none of them."""
        parent = Job.objects.enqueue("demo.task")
        other = Job.objects.enqueue("demo.task", queue="other")
        dies = Job.objects.enqueue("demo.task", after=[parent])
        runs = Job.objects.enqueue("demo.task", after=[Parent(parent, on_failure="run"), other])
        assert claim_one(parent.id).fail("broken")
        assert where(dies.id) == f"dead: dependency failed: {parent.id}"
        assert row(runs.id, "state", "parents_left") == ("waiting", 1)
        DeadJob.objects.filter(pk=parent.id).delete()
        execute("UPDATE pgjobs_dead SET died_at = now() - interval '2 days'")
        assert DeadJob.objects.prune_outside_queues([], 3600, 100) == 1  # `dies`
        assert row(runs.id, "state", "parents_left") == ("waiting", 1)
        (handle,) = Job.objects.claim_batch("other", 1, "w")
        assert handle.id == other.id and handle.ack()
        assert where(runs.id) == "pending"
        assert count(where="state = 'waiting'") == 0

    @settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])
    @given(
        st.lists(
            st.one_of(
                st.integers(min_value=-(2**70), max_value=2**70),
                st.integers(min_value=1, max_value=12),  # ids handed out, then gone
            ),
            min_size=1,
            max_size=5,
        ),
        st.sampled_from(["cancel", "run"]),
    )
    def test_s40_hostile_parent_ids_are_refused_and_write_nothing(
        self, ids: list[int], on_failure: str
    ) -> None:
        if scalar("SELECT last_value FROM pgjobs_job_id_seq") < 12:
            with transaction.atomic():  # ids 1 to 12 handed out, then rolled back: gone
                Job.objects.enqueue_many([{"kind": "demo.task"}] * 12)
                transaction.set_rollback(True)
        with pytest.raises(InvalidDependency, match="Nothing was written"):
            Job.objects.enqueue(
                "demo.task", after=[Parent(job_id, on_failure=on_failure) for job_id in ids]
            )
        assert count() == 0 and count("pgjobs_dependency") == 0


def end_in(queue: str, how: str) -> int:
    """Claim the one job of `queue` and end it (`how`: "ack" or "fail"); its id."""
    (handle,) = Job.objects.claim_batch(queue, 2, "w")
    assert handle.ack("ok") if how == "ack" else handle.fail("broken")
    return int(handle.id)


class TestS30S40RequeuedParents:
    """C after [P, Q] (and D after C), both parents dead: C and D died with P."""

    def write(self) -> tuple[Any, Any, Any, Any]:
        p = Job.objects.enqueue("demo.task", queue="p")
        q = Job.objects.enqueue("demo.task", queue="q")
        c = Job.objects.enqueue("demo.task", queue="c", after=[p, q])
        d = Job.objects.enqueue("demo.task", queue="c", after=[c])
        end_in("p", "fail")
        end_in("q", "fail")
        for job in (c, d):
            assert where(job.id) == f"dead: dependency failed: {p.id}"
        return p, q, c, d

    def test_s30_s40_requeueing_one_dead_parent_runs_no_child_whose_other_parent_is_dead(
        self,
    ) -> None:
        p, q, c, d = self.write()
        assert DeadJob.objects.requeue([p.id]).requeued == 1
        assert end_in("p", "ack") == p.id
        assert where(c.id) is not None and where(c.id).startswith("dead: ")  # type: ignore[union-attr]
        assert where(d.id) is not None and where(d.id).startswith("dead: ")  # type: ignore[union-attr]
        assert Job.objects.claim_batch("c", 5, "w") == []
        # Q's requeue brings them back: C waits for Q only (P is done), D for C.
        assert DeadJob.objects.requeue([q.id]).requeued == 1
        assert row(c.id, "state", "parents_left") == ("waiting", 1)
        assert row(d.id, "state", "parents_left") == ("waiting", 1)
        assert end_in("q", "ack") == q.id
        (handle,) = Job.objects.claim_batch("c", 5, "w")
        assert handle.id == c.id
        assert handle.parent_results() == {p.id: "ok", q.id: "ok"}
        assert handle.ack()
        assert where(d.id) == "pending"

    def test_s30_s40_requeueing_the_other_parent_first_then_the_first_brings_the_child_back(
        self,
    ) -> None:
        p, q, c, d = self.write()
        assert DeadJob.objects.requeue([q.id]).requeued == 1
        assert where(c.id) == f"dead: dependency failed: {p.id}"  # P is still dead
        assert DeadJob.objects.requeue([p.id]).requeued == 1
        assert row(c.id, "state", "parents_left") == ("waiting", 2)
        assert row(d.id, "state", "parents_left") == ("waiting", 1)
        end_in("q", "ack")
        end_in("p", "ack")
        assert where(c.id) == "pending"

    def test_s30_s40_a_dead_parent_under_on_failure_run_does_not_hold_the_child_back(
        self,
    ) -> None:
        p = Job.objects.enqueue("demo.task", queue="p")
        q = Job.objects.enqueue("demo.task", queue="q")
        c = Job.objects.enqueue("demo.task", queue="c", after=[p, Parent(q, on_failure="run")])
        end_in("p", "fail")
        end_in("q", "fail")
        assert DeadJob.objects.requeue([p.id]).requeued == 1
        assert row(c.id, "state", "parents_left") == ("waiting", 1)
        end_in("p", "ack")
        assert where(c.id) == "pending"

    def test_s30_s40_both_parents_requeued_at_once_bring_the_child_back(self) -> None:
        p, q, c, d = self.write()
        assert DeadJob.objects.requeue([p.id, q.id]).requeued == 2
        assert row(c.id, "state", "parents_left") == ("waiting", 2)
        end_in("p", "ack")
        end_in("q", "ack")
        assert where(c.id) == "pending"
        assert row(d.id, "state", "parents_left") == ("waiting", 1)  # for C
