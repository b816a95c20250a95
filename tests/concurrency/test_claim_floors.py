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
from django.db import DataError, connection, transaction

from django_pgjobs.conf import pgjobs_settings
from django_pgjobs.db import connection as db
from django_pgjobs.maintenance import TableCare
from django_pgjobs.managers import floors as floors_module
from django_pgjobs.managers.floors import ClaimFloors, claim_floors
from django_pgjobs.models import Job
from tests.helpers import execute, other_connection, scalar, wait_until

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

    from_start = Job.objects.claim_cost([QUEUE]).buffers
    from_floor = Job.objects.claim_cost([QUEUE], floors=floors).buffers

    assert from_start > 200  # a visit of the rows of every claimed job, a page at a time
    assert from_floor < from_start / 5
    (handle,) = Job.objects.claim_batch(QUEUE, 10, "floors-test")  # the live one is found
    assert handle.kind == "tests.noop"


def test_s42_a_keyed_job_waiting_in_the_queue_does_not_hold_its_floor_back(
    held_horizon: None,
) -> None:
    """The floors are the unkeyed claim's: a keyed trigger waiting for its key (found by
    the chaos run's pins: its floors stayed at the trigger's enqueue, 322 buffers a claim)."""
    # Three of one key whose concurrency is 2: two run, the third waits, pending.
    Job.objects.enqueue_many(
        [{"kind": "tests.tenant", "payload": {"tenant": "t"}, "queue": QUEUE}] * 3
    )
    running = Job.objects.claim_batch(QUEUE, 2, "floors-test")
    assert [handle.kind for handle in running] == ["tests.tenant"] * 2
    leave_claimed(3000)
    assert (
        scalar("SELECT count(*) FROM pgjobs_job WHERE limit_key IS NOT NULL AND state = 'pending'")
        == 1
    )
    Job.objects.enqueue("tests.noop", queue=QUEUE)
    floors = ClaimFloors("default")
    floors.engage(True)

    from_start = Job.objects.claim_cost([QUEUE]).buffers
    from_floor = Job.objects.claim_cost([QUEUE], floors=floors).buffers

    assert from_floor < from_start / 5, (from_floor, from_start)


def test_claim_cost_takes_no_job_and_leaves_the_session_as_it_was() -> None:
    job_id = Job.objects.enqueue("tests.noop", queue=QUEUE).id
    with transaction.atomic():
        cost = Job.objects.claim_cost([QUEUE])
        assert execute("SHOW plan_cache_mode") == [("auto",)]  # its settings were local
    assert cost.ms > 0 and cost.buffers > 0
    assert "LockRows" in cost.plan and "Execution Time" in cost.plan
    assert execute("SELECT name FROM pg_prepared_statements WHERE name = 'pgjobs_explained'") == []
    (handle,) = Job.objects.claim_batch(QUEUE, 10, "floors-test")  # still pending
    assert handle.id == job_id


def test_a_statement_explained_that_fails_leaves_no_prepared_statement_behind() -> None:
    with pytest.raises(DataError):
        db.explained_as_worker("-- fails\nSELECT 1 / %(zero)s::int", {"zero": 0}, None)
    assert execute("SELECT name FROM pg_prepared_statements WHERE name = 'pgjobs_explained'") == []
    assert db.explained_as_worker("-- works\nSELECT %(one)s::int", {"one": 1}, None)


def test_plan_cost_reads_the_top_nodes_shared_hits_and_reads_only() -> None:
    plan = (
        "Result  (cost=0.1..0.2 rows=1 width=8) (actual rows=1 loops=1)\n"
        "  Buffers: shared hit=30 read=4 dirtied=7 written=2, temp read=9 written=9\n"
        "  ->  Index Scan  (actual rows=1 loops=1)\n"
        "        Buffers: shared hit=12\n"
        "Planning:\n"
        "  Buffers: shared hit=100\n"
        "Execution Time: 1.250 ms"
    )
    assert db.plan_cost(plan) == (1.25, 34)
    assert db.plan_cost("Result (actual rows=0 loops=1)\nExecution Time: 0.010 ms") == (0.01, 0)


def test_s42_an_ack_probes_its_own_rows_not_the_whole_primary_key(
    held_horizon: None,
) -> None:
    """A worker's ack is planned once, when its connection first sends it, and kept until
    new statistics come: none come while the horizon is held. Planned from the statistics
    a VACUUM leaves under the held horizon (a few live rows in pages of dead ones), the
    ack joined its rows with the table by a walk of the whole primary key, three times a
    statement (78,000 buffers, 120-180 ms an ack, at 500 jobs/s two minutes into a pin)."""
    leave_claimed(3000)
    execute("VACUUM pgjobs_job")  # in vain: the statistics of few live rows, many pages
    explained: list[str] = []

    def worker() -> None:
        try:
            db.tune_worker_connection(None)  # prepared, planned once, as a worker's
            leave_claimed(10)  # its ack planned now
            leave_claimed(3000)  # the table grows on under the horizon
            Job.objects.enqueue_many([{"kind": "tests.noop", "queue": QUEUE}] * 10)
            handles = Job.objects.claim_batch(QUEUE, 10, "floors-test")
            explained.append(explain_prepared_ack(handles))
            assert Job.objects.ack_batch(handles) == 10  # the explained one rolled back
        finally:
            connection.close()

    thread = threading.Thread(target=worker)
    thread.start()
    thread.join(120)

    [plan] = explained
    assert "Delete on pgjobs_job" in plan
    assert db.plan_cost(plan)[1] < 600, plan  # its ten rows, their index entries, edges


def explain_prepared_ack(handles: list[Any]) -> str:
    """EXPLAIN (ANALYZE, BUFFERS) of this connection's prepared ACK_JOBS (the plan it
    keeps) for `handles`, rolled back."""
    [(name,)] = execute(
        "SELECT name FROM pg_prepared_statements WHERE statement LIKE %s",
        ["%Complete claimed jobs whose claim is current%"],
    )
    claims = db.array_of_claims(handles)
    nulls = db.array_of_nulls(len(handles))
    with transaction.atomic():
        rows = execute(
            f"EXPLAIN (ANALYZE, BUFFERS, TIMING OFF) EXECUTE {name}(%s, %s, %s, %s, %s, %s)",
            [claims["ids"], claims["tokens"], nulls, pgjobs_settings.CHANNEL, False, None],
        )
        transaction.set_rollback(True)
    return "\n".join(row[0] for row in rows)


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
            claim_floors("default").params([QUEUE])  # read while the writer is open
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


def test_s42_a_backdated_job_behind_the_floor_waits_only_until_the_floors_are_lowered(
    held_horizon: None,
) -> None:
    leave_claimed(500)
    Job.objects.claim_from_floors(True)
    assert Job.objects.claim_batch(QUEUE, 1, "floors-test") == []  # the floors are read
    job_id = Job.objects.enqueue("tests.noop", queue=QUEUE).id
    execute("UPDATE pgjobs_job SET run_after = now() - interval '1 hour' WHERE id = %s", [job_id])
    time.sleep(floors_module.FLOORS_STEP_S)

    # The claims' own readings go on from the floors: they never find it.
    assert Job.objects.claim_batch(QUEUE, 1, "floors-test") == []
    Job.objects.lower_claim_floors()  # the maintenance thread's reading from the start

    assert [h.id for h in Job.objects.claim_batch(QUEUE, 1, "floors-test")] == [job_id]


def test_s42_a_reading_in_flight_while_the_floors_are_lowered_keeps_the_lower_floor(
    held_horizon: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The claims' reading of the floors from the last ones on, sent before the
    maintenance thread lowered them to a job put back behind its floor, and answered
    after: the claims keep the lowered floor and take the job."""
    leave_claimed(200)
    floors = claim_floors("default")
    Job.objects.claim_from_floors(True)
    assert Job.objects.claim_batch(QUEUE, 1, "floors-test") == []
    job_id = Job.objects.enqueue("tests.noop", queue=QUEUE).id
    execute("UPDATE pgjobs_job SET run_after = now() - interval '1 hour' WHERE id = %s", [job_id])
    reading = threading.Event()
    lowered = threading.Event()

    def lower() -> None:
        assert reading.wait(10)
        try:
            Job.objects.lower_claim_floors()
        finally:
            connection.close()
            lowered.set()

    # The claims' reading is held between its question and its answer while the other
    # thread lowers the floors.
    thread = threading.Thread(target=lower)
    thread.start()
    real_fetchall = db.fetchall

    claims_thread = threading.current_thread()

    def held_reading(statement: str, params: Any, using: str | None) -> Any:
        rows = real_fetchall(statement, params, using)
        if threading.current_thread() is claims_thread:
            reading.set()
            assert lowered.wait(10)
        return rows

    monkeypatch.setattr(db, "fetchall", held_reading)
    floors._read([QUEUE])
    monkeypatch.undo()
    thread.join(10)

    assert [h.id for h in Job.objects.claim_batch(QUEUE, 1, "floors-test")] == [job_id]


def test_s42_the_table_care_engages_floors_while_the_horizon_holds_and_lets_go_after() -> None:
    care = TableCare(min_dead=1000)
    floors = claim_floors("default")
    with other_connection(autocommit=False) as pin:
        pin.execute("SELECT txid_current()")
        leave_claimed(1500)
        execute("SELECT pg_stat_force_next_flush()")
        wait_until(lambda: Job.objects.table_upkeep()[0] >= 1500, timeout=15, interval=0.2)
        care.run_once()  # the first look: a horizon seen once may be anybody's
        assert not floors.engaged
        care.run_once()
        assert floors.engaged  # the same horizon at the next look: something holds it
        pin.rollback()

    care.run_once()

    assert not floors.engaged


def test_s42_a_backlog_bigger_than_the_dead_rows_does_not_keep_the_floors_off() -> None:
    """A worker behind its backlog is the one whose claims walk the dead entries: the
    floors engage whatever the live rows, though no VACUUM is due."""
    care = TableCare(min_dead=1000)
    floors = claim_floors("default")
    Job.objects.enqueue_many([{"kind": "tests.noop", "queue": "backlog"}] * 5000)
    with other_connection(autocommit=False) as pin:
        pin.execute("SELECT txid_current()")
        leave_claimed(1500)
        execute("SELECT pg_stat_force_next_flush()")
        wait_until(lambda: Job.objects.table_upkeep()[0] >= 1500, timeout=15, interval=0.2)
        assert care.run_once() is False  # 3,000 dead (two a job) beside 5,000 live
        care.run_once()
        assert floors.engaged
        pin.rollback()
