"""Lock order where features meet (S29, S30, S41): a worker's ack, retry or fail batch of
several parents, which locks its rows and then their waiting children, against an
enqueue `after=` a child and another parent of that batch, which locks both as parents.
Real threads on separate connections, several rounds each."""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

import pytest
from django.db import connections

from django_pgjobs.claims import Failure, JobHandle
from django_pgjobs.dependencies import Parent
from django_pgjobs.exceptions import InvalidDependency
from django_pgjobs.models import Job
from tests.helpers import count, dead_row, execute, other_connection, row, wait_until

pytestmark = pytest.mark.django_db(transaction=True)

ROUNDS = 5


def lock_waits() -> int:
    """How many other backends wait for a lock right now."""
    rows = execute(
        "SELECT count(*) FROM pg_stat_activity"
        " WHERE wait_event_type = 'Lock' AND datname = current_database()"
    )
    return int(rows[0][0])


def reset() -> None:
    for table in ("pgjobs_job", "pgjobs_dead", "pgjobs_dependency"):
        execute(f"DELETE FROM {table}")


def in_thread(target: Callable[[], Any], outcome: dict[str, Any], name: str) -> threading.Thread:
    def run() -> None:
        try:
            outcome[name] = target()
        except BaseException as error:  # reported by the test
            outcome[name] = error
        finally:
            connections.close_all()

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread


def race(end: Callable[[list[JobHandle]], Any], after: Callable[[Any, Any], list[Any]]) -> Any:
    """One round: parents `a` (of the waiting `child`) and `b` (retained), claimed; a
    transaction holds `b` a moment (a claim, a fence); the worker's batch `end`s both and
    waits for `b`; an enqueue `after(child, b)` starts meanwhile; then `b` is let go.
    Returns the jobs and the two outcomes."""
    reset()
    a = Job.objects.enqueue("demo.task")
    child = Job.objects.enqueue("demo.task", after=[a])
    b = Job.objects.enqueue("demo.task", result_retention=3600)
    assert a.id < child.id < b.id  # the enqueue locks the child first, in id order
    handles = Job.objects.claim_batch("default", 2, "w")
    assert sorted(h.id for h in handles) == [a.id, b.id]
    outcome: dict[str, Any] = {}
    with other_connection(autocommit=False) as holder:
        holder.execute("SELECT id FROM pgjobs_job WHERE id = %s FOR UPDATE", [b.id])
        ender = in_thread(lambda: end(handles), outcome, "end")
        wait_until(lambda: lock_waits() >= 1)
        writer = in_thread(
            lambda: Job.objects.enqueue("demo.task", after=after(child, b)), outcome, "enqueue"
        )
        wait_until(lambda: lock_waits() >= 2)
        holder.commit()
    ender.join(30)
    writer.join(30)
    assert not ender.is_alive() and not writer.is_alive()
    return a, child, b, outcome["end"], outcome["enqueue"]


class TestS41AckAgainstEnqueue:
    def test_s29_s41_an_ack_of_two_parents_and_an_enqueue_after_a_child_and_one_never_deadlock(
        self,
    ) -> None:
        """S41: the ack releases the child while the enqueue waits, holding nothing."""
        for attempt in range(ROUNDS):
            _, child, b, acked, written = race(
                lambda handles: Job.objects.ack_batch(handles, ["a", "b"]),
                lambda child, b: [child, b],
            )
            assert acked == 2, (attempt, acked)
            assert not isinstance(written, BaseException), (attempt, written)
            assert row(child.id, "state") == ("pending",)
            assert row(b.id, "state") == ("done",)
            assert row(written.id, "state", "parents_left") == ("waiting", 1)
            edges = execute(
                "SELECT parent_id, ended FROM pgjobs_dependency WHERE child_id = %s"
                " ORDER BY parent_id",
                [written.id],
            )
            assert edges == [(child.id, None), (b.id, "done")]

    def test_s30_s41_a_fail_of_two_parents_and_an_enqueue_after_a_child_and_one_never_deadlock(
        self,
    ) -> None:
        """S41 on the failure path, which deletes the waiting child (a stronger lock than
        a release): the enqueue then finds its parent dead and is refused, nothing
        written."""
        for attempt in range(ROUNDS):
            a, child, _, failed, written = race(
                lambda handles: Job.objects.fail_batch([(h, Failure("broken")) for h in handles]),
                lambda child, b: [child, Parent(b, on_failure="run")],
            )
            assert failed == 2, (attempt, failed)
            assert isinstance(written, InvalidDependency), (attempt, written)
            assert dead_row(child.id, "reason") == (f"dependency failed: {a.id}",)
            assert count() == 0 and count(where="state = 'waiting'") == 0

    def test_s13_s41_a_retry_of_two_parents_and_an_enqueue_after_a_child_and_one_never_deadlock(
        self,
    ) -> None:
        """S41: a retry ends neither parent; the child is written after both."""
        for attempt in range(ROUNDS):
            *_, retried, written = race(
                lambda handles: Job.objects.retry_batch(
                    [(h, Failure("again"), 0) for h in handles]
                ),
                lambda child, b: [child, b],
            )
            assert retried == 2, (attempt, retried)
            assert not isinstance(written, BaseException), (attempt, written)
            assert row(written.id, "state", "parents_left") == ("waiting", 2)

    def test_s29_s41_free_racing_acks_and_enqueues_never_deadlock(self) -> None:
        """S41 without a holder: the batch and the enqueue start at the same moment."""
        for attempt in range(20):
            reset()
            a = Job.objects.enqueue("demo.task")
            child = Job.objects.enqueue("demo.task", after=[a])
            b = Job.objects.enqueue("demo.task", result_retention=3600)
            handles = Job.objects.claim_batch("default", 2, "w")
            barrier = threading.Barrier(2)
            outcome: dict[str, Any] = {}

            def ack(
                handles: list[JobHandle] = handles, barrier: threading.Barrier = barrier
            ) -> int:
                barrier.wait(10)
                return Job.objects.ack_batch(handles, ["a", "b"])

            def enqueue(
                child: Any = child, b: Any = b, barrier: threading.Barrier = barrier
            ) -> Any:
                barrier.wait(10)
                return Job.objects.enqueue("demo.task", after=[child, b])

            threads = [in_thread(ack, outcome, "ack"), in_thread(enqueue, outcome, "enqueue")]
            for thread in threads:
                thread.join(30)
            assert outcome["ack"] == 2, (attempt, outcome)
            written = outcome["enqueue"]
            assert not isinstance(written, BaseException), (attempt, written)
            assert row(written.id, "state", "parents_left") == ("waiting", 1)
            assert row(child.id, "state") == ("pending",)
