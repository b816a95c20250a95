"""Dependencies (S29, S30) inside one transaction: waiting, release by the statement
that records the last parent's end, failure propagation, requeue, parents' results and
hostile `after=`. Races and real workers: concurrency/test_workflows.py."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from django_pgjobs.dependencies import MAX_PARENTS, Parent
from django_pgjobs.exceptions import InvalidDependency
from django_pgjobs.models import DeadJob, Job
from tests.helpers import count, dead_row, execute, row

pytestmark = pytest.mark.django_db


def claim(worker: str = "w", n: int = 10) -> list[Any]:
    return Job.objects.claim_batch("default", n, worker)


def claim_one(job_id: int) -> Any:
    (handle,) = [handle for handle in claim(n=100) if handle.id == job_id]
    return handle


def state(job_id: int) -> str | None:
    found = row(job_id, "state")
    if found is not None:
        return str(found[0])
    dead = dead_row(job_id, "reason")
    return None if dead is None else f"dead: {dead[0]}"


class TestS29Waiting:
    def test_s29_a_child_waits_and_is_not_claimable_until_its_parent_is_done(self) -> None:
        parent = Job.objects.enqueue("demo.task")
        child = Job.objects.enqueue("demo.task", after=[parent])
        assert state(child.id) == "waiting"
        (handle,) = claim()
        assert handle.id == parent.id
        assert claim() == []
        assert handle.ack({"n": 1})
        assert state(child.id) == "pending"
        (handle,) = claim()
        assert handle.id == child.id
        assert handle.parent_results() == {parent.id: {"n": 1}}

    def test_s29_the_child_becomes_pending_in_the_ack_batch_statement_of_its_last_parent(
        self,
    ) -> None:
        parents = [Job.objects.enqueue("demo.task") for _ in range(3)]
        child = Job.objects.enqueue("demo.task", after=parents)
        assert row(child.id, "parents_left") == (3,)
        handles = claim()
        first, rest = handles[:1], handles[1:]
        assert Job.objects.ack_batch(first, ["a"]) == 1
        assert row(child.id, "state", "parents_left") == ("waiting", 2)
        assert Job.objects.ack_batch(rest, ["b", "c"]) == 2
        assert row(child.id, "state", "parents_left") == ("pending", 0)
        results = claim_one(child.id).parent_results()
        assert sorted(results.values()) == ["a", "b", "c"]

    def test_s29_s40_a_parent_already_done_counts_as_done_while_it_is_kept(self) -> None:
        kept = Job.objects.enqueue("demo.task", result_retention=3600)
        claim_one(kept.id).ack({"kept": True})
        gone = Job.objects.enqueue("demo.task")
        claim_one(gone.id).ack("gone")
        assert row(gone.id) is None  # no retention: deleted, no trace of its success
        with pytest.raises(InvalidDependency, match="left no trace"):
            Job.objects.enqueue("demo.task", after=[kept.id, gone.id])
        child = Job.objects.enqueue("demo.task", after=[kept.id])
        assert state(child.id) == "pending"
        assert claim_one(child.id).parent_results() == {kept.id: {"kept": True}}

    def test_s29_a_retried_parent_has_not_ended(self) -> None:
        parent = Job.objects.enqueue("demo.task", max_attempts=3)
        child = Job.objects.enqueue("demo.task", after=[parent])
        assert claim_one(parent.id).retry("boom", delay=0)
        assert state(child.id) == "waiting"
        assert claim_one(parent.id).ack()
        assert state(child.id) == "pending"

    def test_s29_a_chain_moves_one_link_per_ack(self) -> None:
        first = Job.objects.enqueue("demo.task")
        links = [first]
        for _ in range(5):
            links.append(Job.objects.enqueue("demo.task", after=[links[-1]]))
        for link in links:
            handles = claim()
            assert [handle.id for handle in handles] == [link.id]
            handles[0].ack()
        assert count() == 0
        assert count("pgjobs_dependency") == 0  # an acked child's edges are deleted

    def test_s29_the_builder_writes_every_job_in_one_statement(
        self, django_assert_max_num_queries: Any
    ) -> None:
        from django_pgjobs.workflows import workflow

        with django_assert_max_num_queries(4), workflow() as wf:
            fetch = wf.add("demo.fetch", url="https://example.com")
            embeds = [wf.add("demo.embed", after=[fetch], n=n) for n in range(3)]
            index = wf.add("demo.index", after=embeds)
        assert [state(step.id) for step in (fetch, *embeds, index)] == [
            "pending",
            "waiting",
            "waiting",
            "waiting",
            "waiting",
        ]
        assert row(index.id, "parents_left") == (3,)
        record = Job.objects.get_job(index.id)
        assert record is not None
        assert record.state == "waiting"
        assert record.parents == tuple(sorted(step.id for step in embeds))

    def test_s29_get_job_shows_parents_children_and_what_is_left(self) -> None:
        parent = Job.objects.enqueue("demo.task")
        child = Job.objects.enqueue("demo.task", after=[parent])
        record = Job.objects.get_job(parent.id)
        assert record is not None and record.children == (child.id,)
        record = Job.objects.get_job(child.id)
        assert record is not None
        assert (record.state, record.parents, record.parents_left) == ("waiting", (parent.id,), 1)

    def test_s29_enqueue_many_and_using_take_after(self) -> None:
        from tests.jobs import plain

        parent = Job.objects.enqueue("demo.task")
        children = Job.objects.enqueue_many(
            [{"kind": "demo.task", "after": [parent]}, {"kind": "demo.task"}]
        )
        assert [state(child.id) for child in children] == ["waiting", "pending"]
        via_using = plain.using(after=[parent]).enqueue(value=2)
        assert state(via_using.id) == "waiting"


class TestS30Failure:
    def test_s30_a_failed_parent_takes_its_descendants_with_it(self) -> None:
        parent = Job.objects.enqueue("demo.task")
        child = Job.objects.enqueue("demo.task", after=[parent])
        grandchild = Job.objects.enqueue("demo.task", after=[child])
        runs_anyway = Job.objects.enqueue("demo.task", after=[Parent(parent, on_failure="run")])
        assert claim_one(parent.id).fail("broken")
        assert state(parent.id) == "dead: broken"
        assert state(child.id) == f"dead: dependency failed: {parent.id}"
        assert state(grandchild.id) == f"dead: dependency failed: {parent.id}"
        assert state(runs_anyway.id) == "pending"
        assert claim_one(runs_anyway.id).parent_results() == {}

    def test_s30_spent_attempts_and_cancel_propagate_the_same_way(self) -> None:
        spent = Job.objects.enqueue("demo.task", max_attempts=1)
        after_spent = Job.objects.enqueue("demo.task", after=[spent])
        assert claim_one(spent.id).retry("boom")
        assert state(after_spent.id) == f"dead: dependency failed: {spent.id}"
        cancelled = Job.objects.enqueue("demo.task")
        after_cancelled = Job.objects.enqueue("demo.task", after=[cancelled])
        assert Job.objects.cancel_many([cancelled.id]) == 1
        assert state(after_cancelled.id) == f"dead: dependency failed: {cancelled.id}"
        deleted = Job.objects.enqueue("demo.task")
        after_deleted = Job.objects.enqueue("demo.task", after=[deleted])
        assert Job.objects.cancel(deleted.id)
        assert state(after_deleted.id) == f"dead: dependency failed: {deleted.id}"

    def test_s30_a_deleted_waiting_child_leaves_no_edge_behind(self) -> None:
        parent = Job.objects.enqueue("demo.task")
        child = Job.objects.enqueue("demo.task", after=[parent])
        assert Job.objects.cancel(child.id)
        assert count("pgjobs_dependency") == 0
        assert claim_one(parent.id).ack()

    def test_s30_a_waiting_job_can_be_cancelled_and_takes_its_children(self) -> None:
        parent = Job.objects.enqueue("demo.task")
        child = Job.objects.enqueue("demo.task", after=[parent])
        grandchild = Job.objects.enqueue("demo.task", after=[child])
        assert Job.objects.cancel_many([child.id]) == 1
        assert state(child.id) == "dead: cancelled"
        assert state(grandchild.id) == f"dead: dependency failed: {child.id}"
        assert claim_one(parent.id).ack()
        assert count(where="state = 'pending'") == 0

    def test_s30_an_expired_parent_takes_its_children(self) -> None:
        parent = Job.objects.enqueue("demo.task", expires=60)
        child = Job.objects.enqueue("demo.task", after=[parent])
        execute(
            "UPDATE pgjobs_job SET expires_at = now() - interval '1 s' WHERE id = %s", [parent.id]
        )
        assert Job.objects.sweep_expired(10) == (1, 0)
        assert state(child.id) == f"dead: dependency failed: {parent.id}"

    def test_s30_requeueing_the_dead_parent_brings_its_descendants_back_to_waiting(
        self,
    ) -> None:
        other = Job.objects.enqueue("demo.task")
        parent = Job.objects.enqueue("demo.task")
        child = Job.objects.enqueue("demo.task", after=[parent, other])
        grandchild = Job.objects.enqueue("demo.task", after=[child])
        handles = {handle.id: handle for handle in claim()}
        handles[other.id].ack("other")
        handles[parent.id].fail()
        assert count("pgjobs_dead") == 3
        DeadJob.objects.requeue([parent.id])
        assert state(parent.id) == "pending"
        assert row(child.id, "state", "parents_left") == ("waiting", 1)
        assert row(grandchild.id, "state", "parents_left") == ("waiting", 1)
        claim_one(parent.id).ack("again")
        assert sorted(claim_one(child.id).parent_results().values()) == ["again", "other"]

    def test_s30_a_child_of_a_dead_parent_is_refused_unless_it_runs_anyway(self) -> None:
        parent = Job.objects.enqueue("demo.task")
        claim_one(parent.id).fail()
        with pytest.raises(InvalidDependency, match="dead letter"):
            Job.objects.enqueue("demo.task", after=[parent])
        child = Job.objects.enqueue("demo.task", after=[Parent(parent.id, on_failure="run")])
        assert state(child.id) == "pending"


class TestS29HostileAfter:
    def test_s29_bad_after_is_refused_and_nothing_is_written(self) -> None:
        parent = Job.objects.enqueue("demo.task")
        before = count(), count("pgjobs_dependency"), row(parent.id, "has_children")
        top = int(execute("SELECT last_value FROM pgjobs_job_id_seq")[0][0])
        for bad in (
            [top + 1],  # not yet handed out (a job's own id, say)
            [0],
            [-5],
            [2**63],
            [True],
            ["1"],
            [1.5],
            [None],
            "1",
            7,
            {"id": 1},
            [parent, Parent(parent, on_failure="run")],
            [Parent(parent, on_failure="later")],
            [parent.id] * 2 + list(range(10**9, 10**9 + MAX_PARENTS)),
        ):
            with pytest.raises(InvalidDependency):
                Job.objects.enqueue("demo.task", after=bad)
        with pytest.raises(InvalidDependency, match="key"):
            Job.objects.enqueue("demo.task", key="k", after=[parent])
        assert (count(), count("pgjobs_dependency"), row(parent.id, "has_children")) == before

    @settings(
        max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
    )
    @given(
        after=st.one_of(
            st.lists(
                st.one_of(
                    st.integers(max_value=0),
                    st.integers(min_value=10**15),
                    st.text(max_size=5),
                    st.floats(allow_nan=True),
                    st.booleans(),
                    st.none(),
                    st.builds(
                        Parent,
                        st.integers(min_value=10**12, max_value=2**63 - 1),
                        st.text(max_size=8),
                    ),
                ),
                min_size=1,
                max_size=20,
            ),
            st.text(max_size=5),
            st.integers(),
            st.dictionaries(st.text(max_size=3), st.integers(), max_size=3),
        )
    )
    def test_s29_hypothesis_hostile_after_gets_a_clear_error_and_writes_nothing(
        self, after: Any
    ) -> None:
        before = count(), count("pgjobs_dependency")
        with pytest.raises(InvalidDependency):
            Job.objects.enqueue("demo.task", after=after)
        with pytest.raises(InvalidDependency):
            Job.objects.enqueue_many([{"kind": "demo.task", "after": after}])
        assert (count(), count("pgjobs_dependency")) == before


class TestS29Builder:
    def test_s29_a_workflow_whose_block_raises_writes_nothing(self) -> None:
        from django_pgjobs.workflows import workflow

        before = count(), count("pgjobs_dependency")
        with pytest.raises(RuntimeError), workflow() as wf:
            first = wf.add("demo.task")
            wf.add("demo.task", after=[first])
            raise RuntimeError("changed my mind")
        assert (count(), count("pgjobs_dependency")) == before
        assert first.id is None

    def test_s29_a_workflow_refuses_keys_other_databases_and_foreign_steps(self) -> None:
        from django_pgjobs.exceptions import InvalidJobOption
        from django_pgjobs.workflows import workflow
        from tests.jobs import keyed, plain

        with workflow() as other:
            pass
        with workflow() as unwritten:
            with workflow() as wf:
                with pytest.raises(InvalidJobOption, match="key"):
                    wf.add(keyed, account=1, version=1)
                with pytest.raises(InvalidJobOption, match="cannot take"):
                    wf.add(plain.using(key="k"), value=1)
                with pytest.raises(InvalidJobOption, match="takes a @job"):
                    wf.add(42)
                foreign = unwritten.add("demo.task")
                with pytest.raises(InvalidDependency, match="open workflow"):
                    wf.add("demo.task", after=[foreign])
                wf.add("demo.task")
            assert [step.id is not None for step in wf.steps] == [True]
        assert other.steps == []

    def test_s29_a_waiting_task_reads_as_ready_in_django_tasks(self) -> None:
        from django_pgjobs.backend import _STATUS

        assert _STATUS["waiting"] == _STATUS["pending"]
