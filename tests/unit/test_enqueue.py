"""Enqueue in one rolled-back transaction: option resolution (S2), keys (S3), bulk (S5).
Commits, racing enqueues and the wake-up (S1, S3, S5, S23): concurrency/test_enqueue.py."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.test import override_settings

from django_pgjobs import registry
from django_pgjobs.managers import enqueue as managers
from django_pgjobs.models import Job
from django_pgjobs.registry import JobDefinition
from tests.helpers import count, execute, row, seconds_from_now

pytestmark = pytest.mark.django_db


class TestS2Resolution:
    def test_s2_app_defaults(self) -> None:
        job_id = Job.objects.enqueue("demo.task").id
        assert row(job_id, "queue", "priority", "max_attempts", "lease_s", "expires_at") == (
            "default",
            0,
            10,
            60,
            None,
        )

    @override_settings(
        PGJOBS={
            "LEASE": 30,
            "QUEUES": {"mail": {"LEASE": 90, "MAX_ATTEMPTS": 4, "PRIORITY": 5, "EXPIRES": 600}},
        }
    )
    def test_s2_queue_settings_over_app_defaults(self) -> None:
        job_id = Job.objects.enqueue("demo.task", queue="mail").id
        assert row(job_id, "priority", "max_attempts", "lease_s") == (5, 4, 90)
        assert 599 < seconds_from_now("expires_at", job_id) <= 600
        other = Job.objects.enqueue("demo.task").id
        assert row(other, "lease_s") == (30,)

    @override_settings(PGJOBS={"QUEUES": {"mail": {"LEASE": 90, "MAX_ATTEMPTS": 4}}})
    def test_s2_decorator_over_queue_settings_and_explicit_over_decorator(self) -> None:
        registry.register(
            JobDefinition(
                kind="demo.decorated",
                func=_noop,
                defaults={"queue": "mail", "max_attempts": 7, "priority": 3},
            )
        )
        try:
            by_decorator = Job.objects.enqueue("demo.decorated").id
            assert row(by_decorator, "queue", "max_attempts", "priority", "lease_s") == (
                "mail",
                7,
                3,
                90,
            )
            explicit = Job.objects.enqueue(
                "demo.decorated", queue="default", max_attempts=2, priority=-4, lease=5
            ).id
            assert row(explicit, "queue", "max_attempts", "priority", "lease_s") == (
                "default",
                2,
                -4,
                5,
            )
        finally:
            registry.unregister("demo.decorated")

    def test_s2_delay_wins_over_run_after(self) -> None:
        far = execute("SELECT now() + interval '1 day'")[0][0]
        job_id = Job.objects.enqueue("demo.task", run_after=far, delay=10).id
        assert 9 < seconds_from_now("run_after", job_id) <= 10

    def test_s2_run_after_is_stored_as_given(self) -> None:
        at = execute("SELECT date_trunc('second', now()) + interval '2 hours'")[0][0]
        job_id = Job.objects.enqueue("demo.task", run_after=at).id
        assert row(job_id, "run_after") == (at,)

    def test_s2_expires_counts_from_enqueue_and_lease_rounds_up(self) -> None:
        job_id = Job.objects.enqueue("demo.task", expires=timedelta(minutes=5), lease=1.2).id
        assert 299 < seconds_from_now("expires_at", job_id) <= 300
        assert row(job_id, "lease_s") == (2,)

    def test_s2_get_job_shows_the_resolved_values(self) -> None:
        job_id = Job.objects.enqueue("demo.task", {"a": [1, 2]}, priority=9, max_attempts=3).id
        record = Job.objects.get_job(job_id)
        assert record is not None
        assert (record.priority, record.max_attempts, record.lease_s) == (9, 3, 60)
        assert record.payload == {"a": [1, 2]}
        assert record.state == "pending"


def _noop(**payload: object) -> None:
    return None


class TestS3Keys:
    def test_s3_replace_merges_payload_and_schedule(self) -> None:
        first = Job.objects.enqueue("demo.sync", {"v": 1}, key="account:7", delay=60)
        second = Job.objects.enqueue("demo.sync", {"v": 2}, key="account:7", delay=5)
        assert first.inserted and second.merged and second.id == first.id
        assert count() == 1
        assert row(first.id, "payload")[0] == {"v": 2}
        assert 4 < seconds_from_now("run_after", first.id) <= 5

    def test_s3_keep_schedule_replaces_payload_keeps_run_after(self) -> None:
        first = Job.objects.enqueue("demo.sync", {"v": 1}, key="k", delay=60)
        again = Job.objects.enqueue(
            "demo.sync", {"v": 2}, key="k", delay=1, on_conflict="keep_schedule"
        )
        assert again == (first.id, False)
        assert row(first.id, "payload")[0] == {"v": 2}
        assert 59 < seconds_from_now("run_after", first.id) <= 60

    def test_s3_ignore_changes_nothing(self) -> None:
        first = Job.objects.enqueue("demo.sync", {"v": 1}, key="k", delay=60)
        again = Job.objects.enqueue("demo.sync", {"v": 2}, key="k", delay=1, on_conflict="ignore")
        assert again == (first.id, False)
        assert row(first.id, "payload")[0] == {"v": 1}
        assert 59 < seconds_from_now("run_after", first.id) <= 60

    def test_s3_keys_are_per_kind_and_null_keys_never_merge(self) -> None:
        a = Job.objects.enqueue("demo.a", key="same").id
        b = Job.objects.enqueue("demo.b", key="same").id
        c = Job.objects.enqueue("demo.a").id
        d = Job.objects.enqueue("demo.a").id
        assert len({a, b, c, d}) == 4

    def test_s3_trigger_while_running_is_stored_not_inserted(self) -> None:
        job_id = Job.objects.enqueue("demo.sync", {"v": 1}, key="k").id
        (handle,) = Job.objects.claim_batch("default", 1, "w1")
        again = Job.objects.enqueue("demo.sync", {"v": 2}, key="k", delay=30)
        assert again == (job_id, False)
        assert count() == 1
        state, payload, rerun_payload = row(job_id, "state", "payload", "rerun_payload")
        assert (state, payload, rerun_payload) == ("running", {"v": 1}, {"v": 2})
        assert 29 < seconds_from_now("rerun_after", job_id) <= 30
        assert handle.payload == {"v": 1}

    def test_s3_a_finished_key_can_be_enqueued_again(self) -> None:
        first = Job.objects.enqueue("demo.sync", key="k").id
        (handle,) = Job.objects.claim_batch("default", 1, "w1")
        assert handle.ack()
        second = Job.objects.enqueue("demo.sync", key="k")
        assert second.inserted and second.id != first


class TestS5Bulk:
    def test_s5_enqueue_many_writes_rows_in_order(self) -> None:
        results = Job.objects.enqueue_many(
            [{"kind": "demo.bulk", "payload": {"i": i}, "priority": i % 3} for i in range(50)]
        )
        assert len(results) == 50 and all(result.inserted for result in results)
        for i, result in enumerate(results):
            assert row(result.id, "payload", "priority") == ({"i": i}, i % 3)

    def test_s5_enqueue_many_is_one_statement(self, django_assert_num_queries) -> None:
        with django_assert_num_queries(1):
            Job.objects.enqueue_many([{"kind": "demo.bulk"} for _ in range(200)])
        assert count() == 200

    def test_s5_enqueue_many_merges_keys_like_enqueue(self) -> None:
        live = Job.objects.enqueue("demo.sync", {"v": 0}, key="a", delay=100).id
        results = Job.objects.enqueue_many(
            [
                {"kind": "demo.sync", "key": "a", "payload": {"v": 1}},
                {"kind": "demo.sync", "key": "b", "payload": {"v": 2}},
                {"kind": "demo.sync", "key": "b", "payload": {"v": 3}, "delay": 9},
                {"kind": "demo.sync", "payload": {"v": 4}},
            ]
        )
        assert results[0] == (live, False)
        assert results[1].inserted and results[2] == (results[1].id, False)
        assert results[3].inserted
        assert row(live, "payload")[0] == {"v": 1}
        assert row(results[1].id, "payload")[0] == {"v": 3}
        assert 8 < seconds_from_now("run_after", results[1].id) <= 9
        assert count() == 3

    def test_s5_enqueue_many_validates_everything_first(self) -> None:
        from django_pgjobs.exceptions import InvalidPriority

        with pytest.raises(InvalidPriority, match=r"jobs\[1\]"):
            Job.objects.enqueue_many([{"kind": "demo.ok"}, {"kind": "demo.bad", "priority": 500}])
        assert count() == 0

    def test_s5_enqueue_many_of_nothing_writes_nothing(self, django_assert_num_queries) -> None:
        with django_assert_num_queries(0):
            assert Job.objects.enqueue_many([]) == []


class TestS5BulkInDocuments:
    """Batches longer than ENQUEUE_CHUNK go as several documents, each written while the
    next is validated (here three jobs a document)."""

    @pytest.fixture(autouse=True)
    def small_documents(self, monkeypatch: pytest.MonkeyPatch) -> None:
        monkeypatch.setattr(managers, "ENQUEUE_CHUNK", 3)

    def test_s5_rows_come_back_in_order_across_documents(self, django_assert_num_queries) -> None:
        jobs = [{"kind": "demo.bulk", "payload": {"i": i}, "priority": i % 3} for i in range(10)]
        # The savepoint and its release, and four documents.
        with django_assert_num_queries(6):
            results = Job.objects.enqueue_many(jobs)
        assert [result.inserted for result in results] == [True] * 10
        assert sorted(result.id for result in results) == [result.id for result in results]
        for i, result in enumerate(results):
            assert row(result.id, "payload", "priority") == ({"i": i}, i % 3)

    @pytest.mark.parametrize(
        ("on_conflict", "payload", "run_in"),
        [("replace", 7, 70), ("keep_schedule", 7, 10), ("ignore", 0, 10)],
    )
    def test_s5_a_key_in_several_documents_merges_as_in_one(
        self, on_conflict: str, payload: int, run_in: int
    ) -> None:
        # "a" is in the first, second and third documents, "b" twice in the second.
        jobs = [
            {"kind": "demo.sync", "key": "a", "payload": {"v": 0}, "delay": 10},
            {"kind": "demo.other"},
            {"kind": "demo.other"},
            {"kind": "demo.sync", "key": "b", "payload": {"v": 1}},
            {"kind": "demo.sync", "key": "a", "payload": {"v": 4}, "delay": 40},
            {"kind": "demo.sync", "key": "b", "payload": {"v": 5}},
            {"kind": "demo.sync", "key": "a", "payload": {"v": 7}, "delay": 70},
        ]
        results = Job.objects.enqueue_many(jobs, on_conflict=on_conflict)
        first_a, first_b = results[0].id, results[3].id
        assert [r.inserted for r in results] == [True, True, True, True, False, False, False]
        assert results[4].id == results[6].id == first_a and results[5].id == first_b
        assert row(first_a, "payload")[0] == {"v": payload}
        assert run_in - 1 < seconds_from_now("run_after", first_a) <= run_in
        assert row(first_b, "payload")[0] == ({"v": 1} if on_conflict == "ignore" else {"v": 5})
        assert count() == 4


class TestSignalsByKind:
    def test_a_receiver_connected_for_one_kind_hears_that_kind_only(self) -> None:
        """Django matches senders by identity; the kind a job is sent with is never the
        string object a receiver was connected with, and it is heard all the same."""
        from django_pgjobs import signals

        heard: list[tuple[str, int]] = []

        def on_enqueued(sender: str, **kwargs: object) -> None:
            heard.append((sender, kwargs["job_id"]))  # type: ignore[arg-type]

        kind = ".".join(["demo", "task"])  # not the object enqueue is given
        signals.job_enqueued.connect(on_enqueued, sender=kind, dispatch_uid="test-by-kind")
        try:
            first = Job.objects.enqueue("demo.task").id
            Job.objects.enqueue("demo.sync")
            Job.objects.enqueue_many([{"kind": "demo.task"}, {"kind": "demo.bulk"}])
            assert signals.job_enqueued.has_listeners("".join(["demo.", "task"]))
            assert not signals.job_enqueued.has_listeners("demo.sync")
        finally:
            assert signals.job_enqueued.disconnect(
                sender="".join(["demo", ".task"]), dispatch_uid="test-by-kind"
            )
        Job.objects.enqueue("demo.task")
        assert [sender for sender, _ in heard] == ["demo.task", "demo.task"]
        assert heard[0][1] == first
