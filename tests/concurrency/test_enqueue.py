"""Enqueue across transactions and connections: a job exists for others only once its
transaction commits (S1), racing enqueues of one key make one row (S3), a bulk enqueue in
several documents rolls back whole (S5), and the wake-up is sent at commit (S23). Option
resolution, keys and bulk in one transaction: unit/test_enqueue.py."""

from __future__ import annotations

import random
import threading
import time
from typing import Any
from unittest import mock

import psycopg
import pytest
from django.db import IntegrityError, transaction
from django.test import override_settings

from django_pgjobs.managers import enqueue as managers
from django_pgjobs.models import Job
from tests.helpers import count, execute, other_connection, row, run_threads

pytestmark = pytest.mark.django_db


class TestS1Transactions:
    @pytest.mark.django_db(transaction=True)
    def test_s1_enqueue_in_rolled_back_transaction_leaves_no_job(self) -> None:
        with pytest.raises(RuntimeError), transaction.atomic():
            Job.objects.enqueue("demo.task", {"n": 1})
            raise RuntimeError("the request failed")
        assert count() == 0

    @pytest.mark.django_db(transaction=True)
    def test_s1_job_invisible_and_unclaimable_until_commit(self) -> None:
        with other_connection() as other:
            with transaction.atomic():
                job_id = Job.objects.enqueue("demo.task", {"n": 1}).id
                seen = other.execute("SELECT count(*) FROM pgjobs_job").fetchone()
                assert seen == (0,)
                claimed = _claim_on(other, "default")
                assert claimed == []
            assert other.execute("SELECT id FROM pgjobs_job").fetchall() == [(job_id,)]
            assert _claim_on(other, "default") == [job_id]

    @pytest.mark.django_db(transaction=True)
    def test_s1_enqueue_is_one_insert_on_the_callers_connection(self) -> None:
        with transaction.atomic():
            Job.objects.enqueue("demo.task")
            # Same connection, same transaction: the row is visible here before commit.
            assert count() == 1
            transaction.set_rollback(True)
        assert count() == 0


def _claim_on(conn: psycopg.Connection, queue: str) -> list[int]:
    """Claim with a bare connection, the way another worker process would."""
    from django_pgjobs.db import sql

    params = {
        "queues": [queue],
        "floors": [None],
        "tops": [None],
        "lease_floor": None,
        "limit": 10,
        "worker_id": "other",
        "synchronous_commit": None,
        "due": False,
        "only_kinds": None,
        "not_kinds": None,
    }
    with conn.cursor() as cursor:
        cursor.execute(sql.CLAIM_JOBS, params)
        return [r[2] for r in cursor.fetchall() if r[2] is not None]


class TestS3Keys:
    @pytest.mark.django_db(transaction=True)
    def test_s3_sixteen_threads_enqueue_one_key_at_once(self) -> None:
        def enqueue(index: int) -> tuple[int, bool]:
            return Job.objects.enqueue("demo.sync", {"from": index}, key="hot")

        results = run_threads(16, enqueue)
        assert count() == 1
        assert len({job_id for job_id, _ in results}) == 1
        assert sum(inserted for _, inserted in results) == 1

    @pytest.mark.django_db(transaction=True)
    def test_s3_racing_transactions_on_one_key_all_commit_into_one_row(self) -> None:
        def enqueue(index: int) -> int:
            with transaction.atomic():
                result = Job.objects.enqueue("demo.sync", {"from": index}, key="hot")
                execute("SELECT pg_sleep(0.01)")
            return result.id

        ids = run_threads(8, enqueue)
        assert len(set(ids)) == 1
        assert count() == 1


class TestS5BulkInDocuments:
    """Batches longer than ENQUEUE_CHUNK go as several documents, each written while the
    next is validated (here three jobs a document)."""

    @pytest.fixture(autouse=True)
    def small_documents(self, monkeypatch: pytest.MonkeyPatch) -> None:
        monkeypatch.setattr(managers, "ENQUEUE_CHUNK", 3)

    @pytest.mark.django_db(transaction=True)
    def test_s5_a_bad_job_late_in_the_batch_rolls_back_every_document(self) -> None:
        from django_pgjobs.exceptions import InvalidPriority

        jobs: list[dict[str, Any]] = [{"kind": "demo.ok", "payload": {"i": i}} for i in range(8)]
        jobs.append({"kind": "demo.bad", "priority": 500})
        with other_connection() as listener:
            listener.execute("LISTEN pgjobs")
            with pytest.raises(InvalidPriority, match=r"jobs\[8\]"):
                Job.objects.enqueue_many(iter(jobs))
            assert list(listener.notifies(timeout=0.3, stop_after=1)) == []
        assert count() == 0

    @pytest.mark.django_db(transaction=True)
    def test_s5_a_bad_batch_inside_a_transaction_leaves_the_rest_of_it(self) -> None:
        from django_pgjobs.exceptions import InvalidPayload

        jobs: list[dict[str, Any]] = [{"kind": "demo.ok"} for _ in range(7)]
        jobs.append({"kind": "demo.bad", "payload": {"x": float("nan")}})
        with transaction.atomic():
            kept = Job.objects.enqueue("demo.kept").id
            with pytest.raises(InvalidPayload, match=r"jobs\[7\]"):
                Job.objects.enqueue_many(jobs)
            after = Job.objects.enqueue_many([{"kind": "demo.after"}] * 4)
        assert sorted(execute("SELECT kind FROM pgjobs_job")) == [("demo.after",)] * 4 + [
            ("demo.kept",)
        ]
        assert row(kept, "state") == ("pending",) and len(after) == 4

    @pytest.mark.django_db(transaction=True)
    def test_s5_a_database_error_rolls_back_every_document(self) -> None:
        # The server refuses the third document, sent after two were written: its rows
        # are altered on their way out to a lease of -1 s, which breaks a check
        # constraint (validation never lets one through).
        jobs = [{"kind": "demo.ok"} for _ in range(9)]
        original = managers.EnqueueBatch._document

        def forged(self: Any, chunk: list[Any], rows: list[str]) -> dict[str, Any]:
            params = original(self, chunk, rows)
            if len(self.jobs) == 9:
                params["jobs"] = params["jobs"].replace(",60,", ",-1,")
            return params

        with (
            mock.patch.object(managers.EnqueueBatch, "_document", forged),
            pytest.raises(IntegrityError, match="lease_s"),
        ):
            Job.objects.enqueue_many(jobs)
        assert count() == 0
        assert Job.objects.enqueue_many(jobs)[8].inserted

    @pytest.mark.django_db(transaction=True)
    def test_s5_a_connection_killed_mid_batch_raises_operational_error_and_writes_all_or_none(
        self,
    ) -> None:
        """pg_terminate_backend at a random moment of a pipelined batch: the caller gets
        Django's OperationalError, as from any statement on a lost connection (never
        psycopg's "cannot exit pipeline mode while busy"), and the batch is written whole
        or not at all; the next batch, on a new connection, is written."""
        from django.db import OperationalError, connection

        from django_pgjobs.db import connection as db

        batch = [{"kind": "demo.ok", "payload": {"text": "x" * 200}}] * 600
        randomness = random.Random(27)
        lost = 0
        with other_connection() as killer_connection:

            def kill(pid: int | None, delay: float) -> None:
                # Once the batch's transaction has begun (its first document is sent),
                # and a random moment later.
                for _ in range(2000):
                    began = killer_connection.execute(
                        "SELECT 1 FROM pg_stat_activity WHERE pid = %s AND xact_start IS NOT NULL",
                        [pid],
                    ).fetchall()
                    if began:
                        break
                time.sleep(delay)
                killer_connection.execute("SELECT pg_terminate_backend(%s)", [pid])

            for _ in range(12):
                connection.ensure_connection()
                killer = threading.Thread(
                    target=kill,
                    args=(db.backend_pid("default"), randomness.uniform(0.0, 0.005)),
                )
                killer.start()
                try:
                    Job.objects.enqueue_many(batch)
                except OperationalError:
                    lost += 1
                finally:
                    killer.join()
                    connection.close()
                assert count() % len(batch) == 0
        assert lost  # some kills landed before the batch was written
        written = count()
        assert len(Job.objects.enqueue_many(batch)) == len(batch)
        assert count() == written + len(batch)


@pytest.mark.django_db(transaction=True)
class TestS23Notify:
    def test_s23_runnable_enqueue_notifies_its_queue_at_commit(self) -> None:
        with other_connection() as listener:
            listener.execute("LISTEN pgjobs")
            with transaction.atomic():
                Job.objects.enqueue("demo.task", queue="mail")
                Job.objects.enqueue("demo.task", queue="mail")
                Job.objects.enqueue("demo.task", queue="other")
                assert list(listener.notifies(timeout=0.2, stop_after=1)) == []
            received = [n.payload for n in listener.notifies(timeout=1, stop_after=2)]
            # PostgreSQL folds identical payloads of one transaction: one per queue.
            assert sorted(received) == ["mail", "other"]
            assert list(listener.notifies(timeout=0.2, stop_after=1)) == []

    def test_s23_scheduled_enqueue_sends_nothing(self) -> None:
        with other_connection() as listener:
            listener.execute("LISTEN pgjobs")
            Job.objects.enqueue("demo.task", delay=60)
            assert list(listener.notifies(timeout=0.3, stop_after=1)) == []

    def test_s23_bulk_enqueue_sends_one_notify_per_queue(self) -> None:
        with other_connection() as listener:
            listener.execute("LISTEN pgjobs")
            Job.objects.enqueue_many([{"kind": "demo.bulk"} for _ in range(500)])
            received = [n.payload for n in listener.notifies(timeout=0.5, stop_after=3)]
            assert received == ["default"]

    def test_s23_rolled_back_enqueue_sends_nothing(self) -> None:
        with other_connection() as listener:
            listener.execute("LISTEN pgjobs")
            with transaction.atomic():
                Job.objects.enqueue("demo.task")
                transaction.set_rollback(True)
            assert list(listener.notifies(timeout=0.3, stop_after=1)) == []

    def test_s23_notify_can_be_switched_off(self) -> None:
        with other_connection() as listener, override_settings(PGJOBS={"NOTIFY": False}):
            listener.execute("LISTEN pgjobs")
            Job.objects.enqueue("demo.task")
            assert list(listener.notifies(timeout=0.3, stop_after=1)) == []
        assert count() == 1
