"""Dependencies (S29, S30) under races, on separate connections: parents of one child
ending at the same moment, a child written while its parent ends, and real workers
draining workflows with no child claimed before its parents are done."""

from __future__ import annotations

import threading
from typing import Any

import pytest
from django.db import connections, transaction

from django_pgjobs.claims import JobHandle
from django_pgjobs.dependencies import Parent
from django_pgjobs.models import Job
from django_pgjobs.workflows import workflow
from tests.helpers import count, dead_row, drain, execute, row, run_threads, wait_until

pytestmark = pytest.mark.django_db(transaction=True)


def waiting_on_a_lock() -> bool:
    """Whether some other backend is blocked on a row lock right now."""
    rows = execute(
        "SELECT count(*) FROM pg_stat_activity"
        " WHERE wait_event_type = 'Lock' AND datname = current_database()"
    )
    return bool(rows[0][0])


class TestS29Races:
    def test_s29_eight_parents_acked_at_the_same_moment_free_their_child_once(self) -> None:
        for _ in range(30):
            execute("DELETE FROM pgjobs_job")
            parents = [Job.objects.enqueue("demo.task") for _ in range(8)]
            child = Job.objects.enqueue("demo.task", after=parents)
            handles = Job.objects.claim_batch("default", 8, "claimer")
            assert len(handles) == 8
            acked = run_threads(
                8, lambda i, handles=handles: Job.objects.ack_batch([handles[i]], [i])
            )
            assert acked == [1] * 8
            assert row(child.id, "state", "parents_left") == ("pending", 0)
            assert count(where="state = 'waiting'") == 0

    def test_s29_s30_parents_of_two_children_acked_and_failed_at_once_free_both(self) -> None:
        """Eight parents shared by two children (each child locked in id order: no
        deadlock), half acked and half failed under on_failure="run", all at once."""
        for attempt in range(20):
            execute("DELETE FROM pgjobs_job")
            execute("DELETE FROM pgjobs_dead")
            parents = [Job.objects.enqueue("demo.task") for _ in range(8)]
            after = [Parent(parent, on_failure="run") for parent in parents]
            children = [Job.objects.enqueue("demo.task", after=after) for _ in range(2)]
            handles = Job.objects.claim_batch("default", 8, "claimer")

            def end(i: int, handles: list[JobHandle] = handles) -> bool:
                return handles[i].ack() if i % 2 else handles[i].fail("broken")

            assert run_threads(8, end) == [True] * 8
            for child in children:
                assert row(child.id, "state", "parents_left") == ("pending", 0), attempt
            assert count("pgjobs_dead") == 4

    def test_s29_s40_a_child_written_while_its_parent_is_acked_is_never_stranded(self) -> None:
        """With result retention the child is always written; without, a parent acked
        first left no trace, and the child is refused (S40)."""
        from django_pgjobs.exceptions import InvalidDependency

        for attempt in range(40):
            execute("DELETE FROM pgjobs_job")
            retained = attempt % 2 == 0
            parent = Job.objects.enqueue("demo.task", result_retention=3600 if retained else None)
            (handle,) = Job.objects.claim_batch("default", 1, "claimer")

            def race(index: int, handle: Any = handle, parent: Any = parent) -> int | None:
                if index == 0:
                    Job.objects.ack_batch([handle], ["done"])
                    return None
                try:
                    return Job.objects.enqueue("demo.task", after=[parent]).id
                except InvalidDependency:
                    return None

            child_id = run_threads(2, race)[1]
            if child_id is None:
                assert not retained, attempt
            else:
                assert row(child_id, "state") == ("pending",), attempt
            assert count(where="state = 'waiting'") == 0

    def test_s29_an_ack_that_waited_for_the_childs_writer_sees_the_child(self) -> None:
        """The ordering a statement snapshot gets wrong: the writer locks the parent, the
        ack's statement starts and waits for that lock, then the writer commits."""
        parent = Job.objects.enqueue("demo.task")
        (handle,) = Job.objects.claim_batch("default", 1, "claimer")
        locked, release = threading.Event(), threading.Event()
        written: list[int] = []

        def writer() -> None:
            try:
                with transaction.atomic():
                    written.append(Job.objects.enqueue("demo.task", after=[parent]).id)
                    locked.set()
                    release.wait(30)
            finally:
                connections.close_all()

        def ack() -> None:
            try:
                Job.objects.ack_batch([handle], ["r"])
            finally:
                connections.close_all()

        thread = threading.Thread(target=writer)
        thread.start()
        assert locked.wait(30)
        acker = threading.Thread(target=ack)
        acker.start()
        wait_until(waiting_on_a_lock)
        release.set()
        thread.join(30)
        acker.join(30)
        (child_id,) = written
        assert row(child_id, "state") == ("pending",)
        ended = execute("SELECT ended FROM pgjobs_dependency WHERE child_id = %s", [child_id])
        assert ended == [("done",)]

    def test_s30_a_child_written_while_its_parent_fails_dies_or_is_refused(self) -> None:
        from django_pgjobs.exceptions import InvalidDependency

        for attempt in range(30):
            execute("DELETE FROM pgjobs_job")
            execute("DELETE FROM pgjobs_dead")
            parent = Job.objects.enqueue("demo.task")
            (handle,) = Job.objects.claim_batch("default", 1, "claimer")

            def race(index: int, handle: Any = handle, parent: Any = parent) -> int | None:
                if index == 0:
                    handle.fail("broken")
                    return None
                try:
                    return Job.objects.enqueue("demo.task", after=[parent]).id
                except InvalidDependency:
                    return None

            child_id = run_threads(2, race)[1]
            if child_id is not None:  # written first: it died with its parent
                assert row(child_id) is None, attempt
                assert dead_row(child_id, "reason") == (f"dependency failed: {parent.id}",)
            assert count(where="state = 'waiting'") == 0


class TestS29Workers:
    def test_s29_no_child_is_claimed_before_all_its_parents_are_done(self) -> None:
        """Timed on the database clock: every job keeps its first claim (started_at) and
        its ack (finished_at) while result retention is on."""
        with workflow() as wf:
            roots = [wf.add("tests.plain", value=n) for n in range(6)]
            middles = [
                wf.add("tests.plain", after=roots[n : n + 3], value=10 + n) for n in range(4)
            ]
            wf.add("tests.plain", after=middles, value=99)
        chain = [Job.objects.enqueue("tests.plain", {"value": 0})]
        for n in range(20):
            chain.append(Job.objects.enqueue("tests.plain", {"value": n}, after=[chain[-1]]))
        execute("UPDATE pgjobs_job SET result_ttl_s = 3600")
        drain(concurrency=8)
        edges = execute(
            "SELECT p.finished_at, c.started_at FROM pgjobs_dependency AS d"
            " JOIN pgjobs_job AS p ON p.id = d.parent_id"
            " JOIN pgjobs_job AS c ON c.id = d.child_id"
        )
        done = execute("SELECT count(*) FROM pgjobs_job WHERE state = 'done'")[0][0]
        assert done == 6 + 4 + 1 + 21
        assert len(edges) == 3 * 4 + 4 + 20
        assert all(started > finished for finished, started in edges)

    def test_s30_a_failing_parent_under_a_worker_takes_only_its_cancel_dependents(
        self,
    ) -> None:
        bad = Job.objects.enqueue("tests.misbehave", {"how": "fail"})
        dies = Job.objects.enqueue("tests.plain", after=[bad])
        runs = Job.objects.enqueue("tests.plain", after=[Parent(bad, on_failure="run")])
        drain()
        assert dead_row(bad.id, "reason") == ("hopeless",)
        assert dead_row(dies.id, "reason") == (f"dependency failed: {bad.id}",)
        assert row(runs.id) is None and dead_row(runs.id) is None  # ran and was acked
        assert count() == 0


class TestS29Plans:
    def test_s29_a_parents_ack_on_a_worker_connection_reads_only_the_rows_it_moves(
        self,
    ) -> None:
        """A worker's connection plans without sorts (TUNE_WORKER_SESSION); the function
        that ends parents plans with them, or locking its children in id order walks the
        job table's primary key from end to end (10 ms an ack with 10,000 jobs).

        The table is analyzed first, as a worker's table is once its care or autovacuum
        came by: on one never analyzed, the ack's own generic plan may scan it (see
        "Every statement finds its rows by primary key" in explanation/pressure.md),
        and whether it was depended on which tests ran before this one."""
        Job.objects.enqueue_many([{"kind": "demo.task"}] * 3000)  # other work, not touched
        parents = Job.objects.enqueue_many([{"kind": "demo.task", "queue": "fan"}] * 5)
        child = Job.objects.enqueue("demo.task", after=parents, queue="other")
        execute("ANALYZE pgjobs_job")
        Job.objects.tune_worker_connection()
        handles = Job.objects.claim_batch("fan", 5, "w")
        with transaction.atomic():
            assert Job.objects.ack_batch(handles) == 5
            (read,) = execute(
                "SELECT coalesce(idx_tup_fetch, 0) + coalesce(seq_tup_read, 0)"
                " FROM pg_stat_xact_user_tables WHERE relname = 'pgjobs_job'"
            )[0]
        assert row(child.id, "state") == ("pending",)
        assert read < 100, f"the ack read {read} rows of pgjobs_job"
