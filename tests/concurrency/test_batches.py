"""Batches with callbacks (S31) on real connections: each callback fires once, in the
transaction that records the last member's end, whatever ends race it (members acked
and failed at once, a member added or the batch sealed at that moment), and the
callbacks that do not match how the members ended never become visible."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from django_pgjobs.batches import Callback, add_to_batch, batch, get_batch, seal_batch
from django_pgjobs.claims import JobHandle
from django_pgjobs.exceptions import BatchEnded, InvalidBatch, InvalidJobOption
from django_pgjobs.models import Batch, Job
from tests import jobs
from tests.helpers import count, dead_row, drain, execute, row, run_threads

pytestmark = pytest.mark.django_db(transaction=True)


def callbacks() -> dict[str, Callback]:
    return {
        "on_success": Callback("tests.batch_report", label="success"),
        "on_failure": Callback("tests.batch_report", label="failure"),
        "on_complete": Callback("tests.batch_report", label="complete"),
    }


def write(members: int, *, open: bool = False, **given: Any) -> Any:
    with batch(**(given or callbacks()), open=open) as b:
        for n in range(members):
            b.add("tests.plain", value=n)
    return b


def states(b: Any) -> dict[str, str | None]:
    """Where each callback of `b` is now, by what it fires on."""
    record = get_batch(b.id)
    assert record is not None
    return {c.fires_on: c.job_state for c in record.callbacks}


def reset() -> None:
    for table in ("pgjobs_job", "pgjobs_dead", "pgjobs_dependency", "pgjobs_batch"):
        execute(f"DELETE FROM {table}")
    execute("DELETE FROM pgjobs_batch_callback")


class TestS31Ends:
    def test_s31_all_members_done_release_on_success_and_on_complete_only(self) -> None:
        b = write(5)
        assert states(b) == {"success": "waiting", "failure": "waiting", "complete": "waiting"}
        handles = Job.objects.claim_batch("default", 10, "w")
        assert sorted(h.id for h in handles) == sorted(m.id for m in b.members)
        assert Job.objects.ack_batch(handles[:4], [1] * 4) == 4
        assert states(b)["complete"] == "waiting"  # one member left
        assert get_batch(b.id).done == 4  # type: ignore[union-attr]
        assert Job.objects.ack_batch(handles[4:], [1]) == 1
        record = get_batch(b.id)
        assert record is not None
        assert (record.state, record.members, record.done, record.failed) == (
            "succeeded",
            5,
            5,
            0,
        )
        assert states(b) == {"success": "pending", "failure": None, "complete": "pending"}
        assert [c.fires_on for c in record.fired] == ["success", "complete"]
        assert record.ended_at is not None

    def test_s31_a_dead_member_releases_on_failure_and_on_complete_with_the_tally(
        self,
    ) -> None:
        with batch(**callbacks()) as b:
            b.add("tests.plain", value=1)
            b.add("tests.misbehave", how="fail")
        drain()  # the members, then the callbacks, which note what they read
        notes = sorted(text for (text,) in execute("SELECT text FROM tests_note"))
        assert notes == [
            f"complete batch={b.id} state=failed members=2 done=1 failed=1 results=1",
            f"failure batch={b.id} state=failed members=2 done=1 failed=1 results=1",
        ]
        assert dead_row(b.callback_jobs[0].id) is None and count() == 0

    def test_s31_a_cancelled_member_counts_as_failed(self) -> None:
        b = write(2)
        Job.objects.cancel(b.members[0].id)
        (handle,) = Job.objects.claim_batch("default", 5, "w")
        handle.ack()
        record = get_batch(b.id)
        assert record is not None and (record.state, record.done, record.failed) == (
            "failed",
            1,
            1,
        )

    def test_s31_an_empty_batch_ends_when_written(self) -> None:
        b = write(0)
        assert states(b) == {"success": "pending", "failure": None, "complete": "pending"}

    def test_s31_an_open_batch_waits_for_its_seal_and_takes_members_until_it_ends(
        self,
    ) -> None:
        b = write(1, open=True, on_complete=Callback("tests.plain", value=7))
        (first,) = Job.objects.claim_batch("default", 5, "w")
        first.ack()
        assert get_batch(b.id).state == "open"  # type: ignore[union-attr]
        late = b.add("tests.plain", value=2)
        assert late is not None and row(late.id, "state") == ("pending",)
        (second,) = Job.objects.claim_batch("default", 5, "w")
        second.ack()
        assert states(b) == {"complete": "waiting"}
        assert seal_batch(b.id) is True
        assert seal_batch(b.id) is False
        record = get_batch(b.id)
        assert record is not None and (record.state, record.members, record.done) == (
            "succeeded",
            2,
            2,
        )
        assert states(b) == {"complete": "pending"}
        with pytest.raises(BatchEnded, match="has ended"):
            add_to_batch(b.id, "tests.plain", value=3)
        assert count(where="kind = 'tests.plain'") == 1  # the callback only

    def test_s31_a_sealed_batch_takes_members_while_one_runs(self) -> None:
        b = write(1, on_complete=Callback("tests.plain"))
        (running,) = Job.objects.claim_batch("default", 5, "w")
        sibling = add_to_batch(b.id, "tests.plain", value=5)
        running.ack()
        assert states(b) == {"complete": "waiting"}
        (handle,) = Job.objects.claim_batch("default", 5, "w")
        assert handle.id == sibling.id
        handle.ack()
        assert states(b) == {"complete": "pending"}

    def test_s31_the_members_children_show_and_the_seal_does_not(self) -> None:
        b = write(1, on_complete=Callback("tests.plain"))
        member = Job.objects.get_job(b.members[0].id)
        fired = Job.objects.get_job(b.callback_jobs[0].id)
        assert member is not None and fired is not None
        assert member.children == (b.callback_jobs[0].id,)
        assert fired.parents == (b.members[0].id,)  # not the seal's negative id

    def test_s31_a_dead_member_requeued_after_the_end_changes_nothing(self) -> None:
        with batch(on_failure=Callback("tests.plain"), on_success=Callback("tests.plain")) as b:
            b.add("tests.misbehave", how="fail")
        drain()
        assert count() == 0
        record = get_batch(b.id)
        assert record is not None and record.state == "failed"
        from django_pgjobs.models import DeadJob

        assert DeadJob.objects.requeue([b.members[0].id]).requeued == 1
        drain()
        after = get_batch(b.id)
        assert after is not None and (after.state, after.done, after.failed) == ("failed", 0, 1)
        assert count() == 0


class TestS31Races:
    def test_s31_eight_last_members_ended_at_the_same_moment_fire_once(self) -> None:
        for attempt in range(50):
            reset()
            b = write(8)
            handles = Job.objects.claim_batch("default", 8, "w")
            assert len(handles) == 8

            def end(i: int, handles: list[JobHandle] = handles, attempt: int = attempt) -> bool:
                if attempt % 2 and i == 3:
                    return handles[i].fail("broken")
                return Job.objects.ack_batch([handles[i]], [i]) == 1

            assert run_threads(8, end) == [True] * 8
            record = get_batch(b.id)
            assert record is not None
            failed = attempt % 2
            assert (record.done, record.failed) == (8 - failed, failed)
            assert record.state == ("failed" if failed else "succeeded")
            released = execute(
                "SELECT count(*) FROM pgjobs_job WHERE state = 'pending' AND kind = %s",
                ["tests.batch_report"],
            )[0][0]
            assert released == 2  # on_complete and one of on_success / on_failure
            assert count(where="state = 'waiting'") == 0

    def test_s31_a_member_added_as_the_last_one_ends_is_counted_or_refused(self) -> None:
        for _ in range(30):
            reset()
            b = write(1, on_complete=Callback("tests.plain"))
            (handle,) = Job.objects.claim_batch("default", 5, "w")

            def race(i: int, handle: JobHandle = handle, b: Any = b) -> Any:
                if i == 0:
                    return handle.ack()
                try:
                    return add_to_batch(b.id, "tests.plain", value=1)
                except BatchEnded:
                    return None

            acked, added = run_threads(2, race)
            assert acked is True
            record = get_batch(b.id)
            assert record is not None
            if added is None:  # the end came first: nothing was added
                assert (record.state, record.members) == ("succeeded", 1)
                assert states(b) == {"complete": "pending"}
            else:  # the member came first: the batch waits for it
                assert (record.state, record.members) == ("sealed", 2)
                assert row(b.callback_jobs[0].id, "state", "parents_left") == ("waiting", 1)

    def test_s31_a_seal_racing_the_last_end_fires_once(self) -> None:
        for _ in range(30):
            reset()
            b = write(1, open=True, on_complete=Callback("tests.plain"))
            (handle,) = Job.objects.claim_batch("default", 5, "w")
            run_threads(2, lambda i, h=handle, b=b: h.ack() if i == 0 else seal_batch(b.id))
            record = get_batch(b.id)
            assert record is not None and (record.state, record.done) == ("succeeded", 1)
            assert states(b) == {"complete": "pending"}


class TestS31Workers:
    def test_s31_members_fanning_out_while_they_run_end_their_batch_once(self) -> None:
        with batch(on_complete=Callback("tests.batch_report", label="complete")) as b:
            b.add("tests.fan_out", depth=3)
        drain(concurrency=8)
        notes = [text for (text,) in execute("SELECT text FROM tests_note ORDER BY id")]
        members = 1 + 2 + 4 + 8
        assert len([n for n in notes if n.startswith("member")]) == members
        assert notes[-1] == (
            f"complete batch={b.id} state=succeeded members={members} done={members} "
            f"failed=0 results={members}"
        )
        # the callback started after every member ended (database clock)
        assert count() == 0

    def test_s31_a_batch_of_ten_thousand_members_fires_once(self) -> None:
        with batch(on_complete=Callback("tests.batch_report", label="complete")) as b:
            for _ in range(10_000):
                b.add("tests.noop")
        assert len(b.members) == 10_000
        assert row(b.callback_jobs[0].id, "parents_left") == (10_000,)
        drain(concurrency=8)
        assert [text for (text,) in execute("SELECT text FROM tests_note")] == [
            f"complete batch={b.id} state=succeeded members=10000 done=10000 failed=0 results=10000"
        ]
        assert count() == 0


class TestS31Refusals:
    def test_a_batch_without_a_callback_or_with_a_bad_one_is_refused(self) -> None:
        with pytest.raises(InvalidBatch, match="needs a callback"):
            batch()
        with pytest.raises(InvalidBatch, match="takes a Callback"):
            batch(on_complete="tests.plain")  # type: ignore[arg-type]
        with pytest.raises(InvalidJobOption):
            Callback(object())
        with (
            pytest.raises(InvalidBatch, match=r"cannot take \['key'\]"),
            batch(on_complete=Callback("tests.plain")) as b,
        ):
            b.add(jobs.plain.using(key="k"), value=1)
        assert count() == 0 and Batch.objects.count() == 0

    def test_an_exception_in_the_block_writes_nothing(self) -> None:
        with pytest.raises(RuntimeError), batch(on_complete=Callback("tests.plain")) as b:
            b.add("tests.plain")
            raise RuntimeError("changed my mind")
        assert count() == 0 and Batch.objects.count() == 0 and b.id is None

    @settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
    @given(
        st.one_of(
            st.integers(min_value=-(2**70), max_value=2**70),
            st.text(max_size=20),
            st.floats(allow_nan=True),
            st.none(),
            st.booleans(),
        )
    )
    def test_a_hostile_batch_id_is_a_clear_error_and_writes_nothing(self, value: Any) -> None:
        with pytest.raises(InvalidBatch):
            add_to_batch(value, "tests.plain")
        with pytest.raises(InvalidBatch):
            seal_batch(value)
        assert count() == 0


def test_s31_ended_batches_are_pruned_once_their_callbacks_ran_and_open_ones_kept() -> None:
    ended = write(0, on_complete=Callback("tests.plain"))
    kept = write(1, on_complete=Callback("tests.plain"))
    assert Batch.objects.prune(0, 100) == 0  # its callback is still to run: ctx.batch()
    (callback,) = Job.objects.claim_batch("default", 1, "w")
    assert callback.id == ended.callback_jobs[0].id and callback.ack()
    assert Batch.objects.prune(0, 100) == 1
    assert get_batch(ended.id) is None and get_batch(kept.id) is not None
    assert count("pgjobs_batch_callback", "batch_id = %s", [ended.id]) == 0


class TestS31AfterCallbacks:
    def test_a_job_after_a_callback_that_does_not_fire_dies_with_it(self) -> None:
        with batch(
            on_success=Callback("tests.plain", value=1), on_failure=Callback("tests.plain")
        ) as b:
            b.add("tests.misbehave", how="fail")
        success, _failure = b.callback_jobs
        publish = Job.objects.enqueue("tests.plain", after=[success])
        drain()
        assert dead_row(publish.id, "reason") == (f"dependency failed: {success.id}",)
        assert count() == 0 and count(where="state = 'waiting'") == 0

    def test_a_job_after_a_callback_that_fires_runs_after_it(self) -> None:
        with batch(on_success=Callback("tests.plain", value=1)) as b:
            b.add("tests.plain", value=2)
        publish = Job.objects.enqueue("tests.record", {"label": "after"}, after=b.callback_jobs)
        drain()
        assert dead_row(publish.id) is None and count() == 0
        assert execute("SELECT text FROM tests_note") == [("after",)]


def test_the_tally_so_far_counts_on_a_callback_still_waiting() -> None:
    b = write(2, on_success=Callback("tests.plain"), on_complete=Callback("tests.plain"))
    Job.objects.cancel(b.callback_jobs[0].id)  # its edges go with it
    (first, _) = Job.objects.claim_batch("default", 5, "w")
    first.ack()
    record = get_batch(b.id)
    assert record is not None and (record.members, record.done, record.failed) == (2, 1, 0)


def test_a_batch_without_a_waiting_callback_refuses_members_and_says_why() -> None:
    b = write(1, open=True, on_complete=Callback("tests.plain"))
    Job.objects.cancel(b.callback_jobs[0].id)
    with pytest.raises(InvalidBatch, match="no callback left waiting"):
        add_to_batch(b.id, "tests.plain")
