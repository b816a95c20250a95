"""The job table's care (issue 27): a VACUUM when the dead rows claims walk past outnumber
the live ones and can be removed; none in vain while the horizon that held the last one's
leftovers still holds; and the worker does it by itself, without waiting for autovacuum."""

from __future__ import annotations

from typing import Any

import pytest
from django.test import override_settings

from django_pgjobs.maintenance import TableCare
from django_pgjobs.managers.floors import claim_floors
from django_pgjobs.models import Job, Worker
from tests.helpers import execute, other_connection, running_worker, scalar, wait_until

pytestmark = pytest.mark.django_db(transaction=True)


def dead_rows() -> int:
    """The statistics' dead rows of the job table, once this session's counts are in."""
    return int(scalar("SELECT n_dead_tup FROM pg_stat_user_tables WHERE relname = 'pgjobs_job'"))


def vacuums() -> int:
    return int(scalar("SELECT vacuum_count FROM pg_stat_user_tables WHERE relname = 'pgjobs_job'"))


def leave_dead_rows(n: int) -> None:
    """Write `n` jobs and delete them, as finished jobs go; wait for the statistics."""
    before = dead_rows()
    Job.objects.enqueue_many([{"kind": "tests.noop", "queue": "care"}] * n)
    execute("DELETE FROM pgjobs_job WHERE queue = 'care'")
    execute("SELECT pg_stat_force_next_flush()")
    wait_until(lambda: dead_rows() >= before + n, timeout=15, interval=0.2)


def test_s42_dead_rows_beyond_the_live_ones_are_vacuumed() -> None:
    leave_dead_rows(1500)
    ran = vacuums()

    assert TableCare(min_dead=1000).run_once() is True

    assert vacuums() == ran + 1
    assert dead_rows() < 1000


def test_dead_rows_fewer_than_the_live_ones_or_the_minimum_are_left_to_autovacuum() -> None:
    Job.objects.enqueue_many([{"kind": "tests.noop", "queue": "kept"}] * 1500)
    leave_dead_rows(1200)
    ran = vacuums()

    assert TableCare(min_dead=1000).run_once() is False  # 1,200 dead beside 1,500 live
    assert TableCare(min_dead=5000).run_once() is False
    assert vacuums() == ran


def test_s42_dead_rows_enough_to_slow_claims_are_vacuumed_behind_a_bigger_backlog() -> None:
    """Claims walk the dead entries, not the backlog: past `dead_enough` dead rows the
    table is vacuumed however many live rows wait."""
    Job.objects.enqueue_many([{"kind": "tests.noop", "queue": "kept"}] * 1500)
    leave_dead_rows(1200)
    ran = vacuums()

    assert TableCare(min_dead=1000, dead_enough=1100).run_once() is True

    assert vacuums() == ran + 1


def test_s42_no_vacuum_in_vain_while_the_horizon_holds_and_one_as_soon_as_it_moves() -> None:
    care = TableCare(min_dead=1000)
    with other_connection(autocommit=False) as pin:
        pin.execute("SELECT txid_current()")  # an XID held: the horizon stays here
        leave_dead_rows(1500)

        assert care.run_once() is True  # the first under this horizon: it cannot know
        left = dead_rows()
        assert left >= 1500  # nothing could go
        ran = vacuums()
        leave_dead_rows(500)

        assert care.run_once() is False  # the same horizon: another VACUUM is in vain
        assert vacuums() == ran
        pin.rollback()

    assert care.run_once() is True
    assert dead_rows() < 1000


def test_s42_claims_read_from_floors_until_the_vacuum_after_the_horizon_moved(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Once the horizon moves, the dead entries it kept are still in the claims' way
    until a VACUUM removes them: the claims read from their floors until then, not from
    their start through all of them."""
    care = TableCare(min_dead=1000)
    floors = claim_floors("default")
    engaged_at_vacuum: list[bool] = []
    vacuum = Job.objects.vacuum

    def watched_vacuum(**kwargs: Any) -> None:
        engaged_at_vacuum.append(floors.engaged)
        vacuum(**kwargs)

    monkeypatch.setattr(Job.objects, "vacuum", watched_vacuum)
    try:
        with other_connection(autocommit=False) as pin:
            pin.execute("SELECT txid_current()")  # an XID held: the horizon stays here
            leave_dead_rows(1500)
            care.run_once()
            care.run_once()
            assert floors.engaged
            pin.rollback()
        engaged_at_vacuum.clear()

        assert care.run_once() is True

        assert engaged_at_vacuum == [True]
        assert not floors.engaged
        assert dead_rows() < 1000
    finally:
        Job.objects.claim_from_floors(False)


@override_settings(PGJOBS={"VACUUM_INTERVAL": 0.2})
def test_s42_a_worker_vacuums_the_table_by_itself_within_its_interval() -> None:
    with running_worker(queues=["default"]):
        ran = vacuums()
        leave_dead_rows(1500)
        wait_until(lambda: vacuums() > ran, timeout=10, interval=0.1)
    assert dead_rows() < 1000


@override_settings(PGJOBS={"VACUUM_INTERVAL": 0.2, "WORKER_HEARTBEAT": 0.2})
def test_s42_a_worker_says_in_the_registry_while_its_claims_read_from_floors() -> None:
    def reads_from_floors(worker: Any) -> bool:
        # Not registered yet (a loaded machine starts it late): not yet, then.
        rows = [row for row in Worker.objects.status() if row.id == worker.worker_id]
        return bool(rows) and rows[0].claims_from_floors

    with running_worker(queues=["default"]) as worker:
        with other_connection(autocommit=False) as pin:
            pin.execute("SELECT txid_current()")  # an XID held: the horizon stays here
            leave_dead_rows(1500)
            wait_until(lambda: reads_from_floors(worker), timeout=10, interval=0.1)
            pin.rollback()
        wait_until(lambda: not reads_from_floors(worker), timeout=10, interval=0.1)


@override_settings(PGJOBS={"VACUUM_INTERVAL": 0.2})
def test_s42_a_worker_lowers_its_floors_to_a_job_put_back_behind_them(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """While its claims read from floors, a worker's maintenance thread reads them from
    the start and lowers them: a job written behind its queue's floor (backdated in its
    transaction, as a claim put back with its old run_after is) runs while the horizon
    still holds, though the claims' own readings go on from the floors."""
    from django.db import transaction

    from django_pgjobs.worker import services

    monkeypatch.setattr(services, "FLOORS_RESET_S", 0.5)
    with (
        running_worker(queues=["default"], poll_interval=0.2),
        other_connection(autocommit=False) as pin,
    ):
        pin.execute("SELECT txid_current()")  # an XID held: the horizon stays here
        leave_dead_rows(1500)
        wait_until(Job.objects.reads_from_floors, timeout=10, interval=0.1)
        Job.objects.enqueue("tests.noop")  # its claim reads the queue's floor
        wait_until(lambda: not Job.objects.exists(), timeout=10)
        with transaction.atomic():
            job_id = Job.objects.enqueue("tests.noop").id
            execute(
                "UPDATE pgjobs_job SET run_after = now() - interval '1 hour' WHERE id = %s",
                [job_id],
            )

        # Lowered within 0.5 s (and the care's look): well before the 10 s at which the
        # claims themselves once read the floors from the start.
        wait_until(lambda: not Job.objects.filter(id=job_id).exists(), timeout=5)
        assert Job.objects.reads_from_floors()  # the horizon held all along
        pin.rollback()


def test_s42_a_table_grown_past_its_statistics_is_analyzed_and_its_statements_planned_anew(
    request: pytest.FixtureRequest,
) -> None:
    """A generic plan made while the job table was a few pages probes rows by a
    sequential scan, and a backend keeps it while the table grows, until new statistics
    come: the care ANALYZEs a table grown past twice its statistics' size, once."""
    care = TableCare(min_dead=10**9)  # no VACUUM: only the growth counts
    # Nor autovacuum's ANALYZE of the 20,000 rows, where the server runs it.
    execute("ALTER TABLE pgjobs_job SET (autovacuum_enabled = false)")
    request.addfinalizer(lambda: execute("ALTER TABLE pgjobs_job RESET (autovacuum_enabled)"))
    execute("VACUUM pgjobs_job")
    with other_connection() as backend:
        backend.execute("SET plan_cache_mode = force_generic_plan")
        backend.execute(
            "PREPARE probe(bigint[]) AS SELECT id FROM pgjobs_job WHERE id = ANY($1) FOR UPDATE"
        )

        def plan() -> str:
            rows = backend.execute("EXPLAIN EXECUTE probe('{1,2,3}')").fetchall()
            return "\n".join(row[0] for row in rows)

        assert "Seq Scan on pgjobs_job" in plan()  # planned for a table of a few pages
        Job.objects.enqueue_many([{"kind": "tests.noop", "queue": "care"}] * 20_000)
        pages, planned = Job.objects.table_pages()
        assert pages > 4 * max(planned, 64)
        assert "Seq Scan on pgjobs_job" in plan()  # kept while the table grew
        analyzed = int(
            scalar("SELECT analyze_count FROM pg_stat_user_tables WHERE relname = 'pgjobs_job'")
        )

        care.run_once()

        assert "pgjobs_job_pkey" in plan()
        pages, planned = Job.objects.table_pages()
        assert planned == pages
        care.run_once()  # not grown since: no other ANALYZE
        execute("SELECT pg_stat_force_next_flush()")
        assert (
            int(
                scalar("SELECT analyze_count FROM pg_stat_user_tables WHERE relname = 'pgjobs_job'")
            )
            == analyzed + 1
        )
