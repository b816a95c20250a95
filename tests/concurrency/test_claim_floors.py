"""Claims under a held xmin horizon (issue 27): while something holds the horizon, every
job claimed leaves a dead entry in the claim index that VACUUM cannot remove; a claim that
reads each queue from its floor (CLAIM_FLOORS) reads past them, and misses no job that a
writer could still make visible: not one of a transaction open since before the floor,
not one of a level above or below the one it knew, and a backdated one only until the
floors are read again from the start."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest
from django.db import connection, transaction

from django_pgjobs.db import sql
from django_pgjobs.maintenance import TableCare
from django_pgjobs.managers import claiming
from django_pgjobs.managers.claiming import ClaimFloors
from django_pgjobs.models import Job
from tests.helpers import execute, other_connection, wait_until

pytestmark = pytest.mark.django_db(transaction=True)

QUEUE = "floors"


@pytest.fixture
def held_horizon() -> Iterator[None]:
    """A session idle in a transaction that holds an XID: VACUUM removes nothing."""
    with other_connection(autocommit=False) as pin:
        pin.execute("SELECT txid_current()")
        yield
        pin.rollback()


@pytest.fixture(autouse=True)
def floors_off() -> Iterator[None]:
    yield
    Job.objects.claim_from_floors(False)


def leave_claimed(n: int) -> None:
    """Enqueue, claim and ack `n` jobs of QUEUE: n dead entries in the claim index."""
    Job.objects.enqueue_many([{"kind": "tests.noop", "queue": QUEUE}] * n)
    while handles := Job.objects.claim_batch(QUEUE, 500, "floors-test"):
        Job.objects.ack_batch(handles)


def claim_buffers(params: dict[str, Any]) -> int:
    """Shared buffers one claim of QUEUE reads (EXPLAIN ANALYZE, rolled back)."""
    statement = sql.claim_jobs(10)
    with transaction.atomic():
        with connection.cursor() as cursor:
            cursor.execute(
                f"EXPLAIN (ANALYZE, BUFFERS, TIMING OFF, FORMAT JSON) {statement}",
                {
                    "queues": [QUEUE],
                    "worker_id": "floors-explain",
                    "synchronous_commit": None,
                    "due": True,
                    "only_kinds": None,
                    "not_kinds": None,
                    **params,
                },
            )
            (plan,) = cursor.fetchone()
        transaction.set_rollback(True)
    top = plan[0]["Plan"]
    return int(top["Shared Hit Blocks"] + top["Shared Read Blocks"])


def test_s42_from_its_floor_a_claim_reads_past_the_dead_entries_of_claimed_jobs(
    held_horizon: None,
) -> None:
    leave_claimed(3000)
    Job.objects.enqueue("tests.noop", queue=QUEUE)
    # What the table's care does under the held horizon: it removes nothing, and leaves
    # statistics of a table of one live row in 3,000 (which once planned the claim's
    # update as a hash of the whole primary key).
    execute("VACUUM pgjobs_job")
    floors = ClaimFloors("default")
    floors.engage(True)

    from_start = claim_buffers({"floors": [None], "tops": [None], "lease_floor": None})
    from_floor = claim_buffers({**floors.params([QUEUE]), "lease_floor": floors.lease_floor})

    assert from_start > 200  # a visit of the rows of every claimed job, a page at a time
    assert from_floor < from_start / 5
    (handle,) = Job.objects.claim_batch(QUEUE, 10, "floors-test")  # the live one is found
    assert handle.kind == "tests.noop"


def test_s42_a_job_written_by_a_transaction_open_since_before_the_floor_is_claimed_at_once(
    held_horizon: None,
) -> None:
    leave_claimed(500)
    Job.objects.claim_from_floors(True)
    floors_read = threading.Event()
    committed = threading.Event()
    claimed: list[int] = []

    def claimer() -> None:
        try:
            claiming.claim_floors("default").params([QUEUE])  # read while the writer is open
            floors_read.set()
            committed.wait(10)
            claimed.extend(h.id for h in Job.objects.claim_batch(QUEUE, 10, "floors-test"))
        finally:
            connection.close()

    with transaction.atomic():
        job_id = Job.objects.enqueue("tests.noop", queue=QUEUE).id  # run_after: now()
        time.sleep(0.3)  # older than the floor's margin
        thread = threading.Thread(target=claimer)
        thread.start()
        assert floors_read.wait(10)
    committed.set()
    thread.join(10)

    assert claimed == [job_id]


def test_s42_levels_above_and_below_the_known_top_are_claimed_in_priority_order(
    held_horizon: None,
) -> None:
    leave_claimed(500)
    Job.objects.claim_from_floors(True)
    Job.objects.enqueue("tests.noop", queue=QUEUE)
    (first,) = Job.objects.claim_batch(QUEUE, 1, "floors-test")  # the top learnt: 0
    Job.objects.ack_batch([first])
    low = Job.objects.enqueue("tests.noop", queue=QUEUE, priority=-50).id
    middle = Job.objects.enqueue("tests.noop", queue=QUEUE).id
    high = Job.objects.enqueue("tests.noop", queue=QUEUE, priority=50).id

    order = [Job.objects.claim_batch(QUEUE, 1, "floors-test")[0].id for _ in range(3)]

    assert order == [high, middle, low]


def test_s42_a_backdated_job_behind_the_floor_waits_only_until_floors_are_read_from_the_start(
    held_horizon: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(claiming, "FLOORS_RESET_S", 2.0)
    leave_claimed(500)
    Job.objects.claim_from_floors(True)
    assert Job.objects.claim_batch(QUEUE, 1, "floors-test") == []  # the floors are read
    job_id = Job.objects.enqueue("tests.noop", queue=QUEUE).id
    execute("UPDATE pgjobs_job SET run_after = now() - interval '1 hour' WHERE id = %s", [job_id])

    assert Job.objects.claim_batch(QUEUE, 1, "floors-test") == []  # behind the floor
    found: list[int] = []

    def claimed() -> bool:
        found.extend(h.id for h in Job.objects.claim_batch(QUEUE, 1, "floors-test"))
        return bool(found)

    wait_until(claimed, timeout=10, interval=0.05)  # the floors read from the start

    assert found == [job_id]


def test_s42_the_table_care_engages_floors_while_the_horizon_holds_and_lets_go_after() -> None:
    care = TableCare(min_dead=1000)
    floors = claiming.claim_floors("default")
    with other_connection(autocommit=False) as pin:
        pin.execute("SELECT txid_current()")
        leave_claimed(1500)
        execute("SELECT pg_stat_force_next_flush()")
        wait_until(lambda: Job.objects.table_upkeep()[0] >= 1500, timeout=15, interval=0.2)
        care.run_once()  # a VACUUM under this horizon: it cannot know before
        assert not floors.engaged
        care.run_once()
        assert floors.engaged  # the same horizon holds what the VACUUM left
        pin.rollback()

    care.run_once()

    assert not floors.engaged
