"""Batches where features meet (S29, S31, S40): jobs written after a batch's callbacks,
what the builder and the stored batch call their callbacks, the parents' results a
child reads, and batches whose queues PGJOBS["QUEUE_DATABASES"] routes."""

from __future__ import annotations

from typing import Any

import pytest
from django.test import override_settings
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from django_pgjobs.batches import Callback, batch, get_batch, seal_batch
from django_pgjobs.dependencies import Parent
from django_pgjobs.exceptions import InvalidBatch, InvalidKind
from django_pgjobs.models import Batch, Job
from tests import jobs
from tests.helpers import count, drain, execute, row

pytestmark = pytest.mark.django_db(transaction=True)

#: Queues in several databases: "ingestion" in a database of its own (never opened here:
#: a refusal comes before any statement).
ROUTED = {"QUEUE_DATABASES": {"ingestion": "jobs_a"}}


class TestS29S31AfterCallbacks:
    def test_s29_s31_a_job_after_a_named_callback_runs_after_it_as_the_docs_write_it(
        self,
    ) -> None:
        with batch(
            on_success=Callback("tests.plain", value=1), on_complete=Callback("tests.plain")
        ) as b:
            b.add("tests.plain", value=2)
        assert b.on_success is not None and b.on_complete is not None and b.on_failure is None
        assert [job.id for job in b.callback_jobs] == [b.on_success.id, b.on_complete.id]
        publish = jobs.record.using(after=[b.on_success]).enqueue(label="published")
        assert row(publish.id, "state") == ("waiting",)
        drain()
        assert execute("SELECT text FROM tests_note") == [("published",)]
        assert count() == 0

    def test_s31_fired_means_released_on_the_stored_batch_and_the_builder_has_no_other(
        self,
    ) -> None:
        with batch(
            on_success=Callback("tests.plain", value=1), on_failure=Callback("tests.plain")
        ) as b:
            b.add("tests.misbehave", how="fail")
        assert not hasattr(b, "fired")  # the builder's are `callback_jobs`, all written
        drain()
        record = get_batch(b.id)  # type: ignore[arg-type]
        assert record is not None and b.on_failure is not None
        assert [c.job_id for c in record.fired] == [b.on_failure.id]

    def test_s29_a_job_function_given_to_job_objects_enqueue_is_refused_with_the_way(
        self,
    ) -> None:
        with pytest.raises(InvalidKind, match=r"record\.using\(after=.*\)\.enqueue"):
            Job.objects.enqueue(jobs.record, after=[])  # type: ignore[arg-type]
        assert count() == 0


class TestS29S40ParentResults:
    def test_s29_s40_parent_results_are_the_done_parents_results_none_included(self) -> None:
        """None is a result a parent returned; a parent whose death counted as done
        (on_failure="run") is not there; a parent that left no trace cannot be named."""
        returned_none = Job.objects.enqueue("demo.task", queue="a")
        kept = Job.objects.enqueue("demo.task", queue="b", result_retention=3600)
        died = Job.objects.enqueue("demo.task", queue="c")
        child = Job.objects.enqueue(
            "demo.task", queue="d", after=[returned_none, Parent(died, on_failure="run")]
        )
        for queue, end in (("a", "ack"), ("b", "ack"), ("c", "fail")):
            (handle,) = Job.objects.claim_batch(queue, 1, "w")
            assert (
                handle.ack({"kept": True} if queue == "b" else None)
                if end == "ack"
                else (handle.fail("broken"))
            )
        late = Job.objects.enqueue("demo.task", queue="d", after=[kept])
        handles = {h.id: h for h in Job.objects.claim_batch("d", 5, "w")}
        assert handles[child.id].parent_results() == {returned_none.id: None}
        assert handles[late.id].parent_results() == {kept.id: {"kept": True}}


class TestS31RoutedBatches:
    def test_s31_seal_and_get_batch_under_routes_refuse_without_using_and_write_nothing(
        self,
    ) -> None:
        with batch(on_complete=Callback("tests.plain"), open=True) as b:
            pass
        assert b.id is not None
        with override_settings(PGJOBS=ROUTED):
            with pytest.raises(InvalidBatch, match=r"using=.*default, jobs_a"):
                seal_batch(b.id)
            with pytest.raises(InvalidBatch, match=r"using="):
                get_batch(b.id)
            assert get_batch(b.id, using="default") is not None
            assert seal_batch(b.id, using="default") is True
        record = get_batch(b.id)
        assert record is not None and record.state == "succeeded"

    def test_s31_a_batch_written_under_routes_seals_in_its_own_database(self) -> None:
        with override_settings(PGJOBS=ROUTED):
            with batch(on_complete=Callback("tests.plain"), open=True) as b:
                pass
            assert b.using == "default"  # its queues' database
            assert b.seal() is True
        assert Batch.objects.get(pk=b.id).state == "succeeded"

    @settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
    @given(
        st.one_of(
            st.integers(min_value=-(2**70), max_value=2**70),
            st.text(max_size=10),
            st.none(),
            st.booleans(),
        )
    )
    def test_s31_hostile_batch_ids_under_routes_are_a_clear_error(self, value: Any) -> None:
        with override_settings(PGJOBS=ROUTED):
            with pytest.raises(InvalidBatch):
                seal_batch(value)
            with pytest.raises(InvalidBatch):
                get_batch(value)
        assert count() == 0 and Batch.objects.count() == 0
