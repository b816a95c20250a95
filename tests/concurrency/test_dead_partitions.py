"""S44: dead letters in time partitions, made ahead by the sweeper and dropped whole.

The spans here are seconds (PGJOBS["DEAD_PARTITION_SPAN"]) so that a partition ages past
its retention within a test; every range partition a test made is dropped after it."""

from __future__ import annotations

import itertools
import threading
import time
from collections.abc import Iterator
from typing import Any

import psycopg
import pytest
from django.db import connections
from django.test import override_settings
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from django_pgjobs.maintenance import Sweeper
from django_pgjobs.models import DeadJob, Job
from tests.helpers import (
    count,
    drain,
    drop_dead_range_partitions,
    execute,
    other_connection,
    running_worker,
    scalar,
    wait_until,
)

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture(autouse=True)
def no_range_partitions() -> Iterator[None]:
    """No range partition before the test (another test's sweeps made days of them),
    and none of the test's after it."""
    drop_dead_range_partitions()
    yield
    drop_dead_range_partitions()


def pgjobs(**options: Any) -> Any:
    from django.conf import settings

    return override_settings(PGJOBS={**getattr(settings, "PGJOBS", {}), **options})


def fail_jobs(n: int, queue: str = "default") -> list[int]:
    """Enqueue `n` jobs that fail for good, and let a burst worker (no sweeps) run them
    to their dead letters."""
    ids = [
        Job.objects.enqueue("tests.misbehave", {"how": "fail"}, queue=queue).id for _ in range(n)
    ]
    drain(queues=[queue])
    assert count("pgjobs_dead", "id = ANY(%s)", [ids]) == n
    return ids


def minute_now() -> int:
    """The database clock's minute (the span of DEAD_PARTITION_SPAN=60), from its epoch."""
    return int(scalar("SELECT floor(extract(epoch FROM clock_timestamp()) / 60)"))


def partition_of(letter_id: int) -> str:
    return str(
        scalar("SELECT tableoid::regclass::text FROM pgjobs_dead WHERE id = %s", [letter_id])
    )


def test_s44_partitions_are_made_ahead_and_take_the_letters_of_their_span() -> None:
    with pgjobs(DEAD_PARTITION_SPAN=60):
        early = fail_jobs(2)  # before any partition: the default one takes them
        assert {partition_of(i) for i in early} == {"pgjobs_dead_default"}

        first_from = minute_now()
        result = Sweeper().run_once()
        first_to = minute_now()
        assert result.partitions_made in (7, 8)  # from this span's start to 7 spans ahead
        ranges = [p for p in DeadJob.objects.partitions() if p.upper is not None]
        assert ranges[-1].upper is not None and ranges[0].lower is not None
        reach = scalar("SELECT extract(epoch FROM %s - now())", [ranges[-1].upper])
        assert 6 * 60 <= reach <= 8 * 60
        for lower, upper in itertools.pairwise(ranges):
            assert lower.upper == upper.lower  # contiguous, no overlap

        # The letters of a new partition's span moved into it; later letters land in
        # theirs, and the sweeper makes no partition twice.
        later = fail_jobs(1)
        for letter in [*early, *later]:
            died = scalar("SELECT died_at FROM pgjobs_dead WHERE id = %s", [letter])
            home = next((p.name for p in ranges if p.lower <= died < p.upper), None)
            assert partition_of(letter) == (home or "pgjobs_dead_default")
        assert partition_of(later[0]) != "pgjobs_dead_default"
        # The sweeper makes no partition twice: only one per span begun since (on a slow
        # machine the test can cross a minute, and the horizon moves by a span).
        second_from = minute_now()
        made = Sweeper().run_once().partitions_made
        second_to = minute_now()
        assert second_from - first_to <= made <= second_to - first_from
        assert count("pgjobs_dead") == 3


def test_s44_letters_go_whole_with_their_partition_past_the_longest_retention() -> None:
    with pgjobs(
        DEAD_PARTITION_SPAN=1,
        DEAD_RETENTION=4,
        QUEUES={"brief": {"DEAD_RETENTION": 1}},
    ):
        Sweeper().run_once()
        old = fail_jobs(3)
        brief = fail_jobs(2, queue="brief")
        parent = Job.objects.enqueue("tests.noop").id
        # A letter with an edge to its parent (S29): the edge goes with the partition.
        execute("UPDATE pgjobs_dead SET has_parents = true WHERE id = %s", [old[0]])
        execute(
            "INSERT INTO pgjobs_dependency (child_id, parent_id, on_failure) "
            "VALUES (%s, %s, 'cancel')",
            [old[0], parent],
        )
        time.sleep(1.5)
        # The brief queue's letters (1 s, shorter than the longest) are deleted row by
        # row; the others wait for their partition to end 4 s ago (an empty partition of
        # the test's first second may go already, on a slow machine).
        first = Sweeper().run_once()
        assert first.dead_pruned == 2
        assert sorted(r[0] for r in execute("SELECT id FROM pgjobs_dead")) == sorted(old)
        time.sleep(4.5)
        young = fail_jobs(1)
        second = Sweeper().run_once()
        assert second.partitions_dropped >= 1 and second.dead_pruned == 0
        assert [r[0] for r in execute("SELECT id FROM pgjobs_dead")] == young
        assert count("pgjobs_dependency") == 0
        assert not set(old + brief) & {r[0] for r in execute("SELECT id FROM pgjobs_dead")}
        # They went with their partition, not through the default one row by row.
        assert scalar("SELECT count(*) FROM pgjobs_dead_default") == 0


def test_s44_no_partition_is_dropped_while_a_queue_keeps_its_letters_forever() -> None:
    with pgjobs(
        DEAD_PARTITION_SPAN=1,
        DEAD_RETENTION=1,
        QUEUES={"archive": {"DEAD_RETENTION": None}},
    ):
        Sweeper().run_once()
        kept = fail_jobs(1, queue="archive")
        gone = fail_jobs(1)
        time.sleep(2.2)
        result = Sweeper().run_once()
        assert result.partitions_dropped == 0 and result.dead_pruned == 1
        assert [r[0] for r in execute("SELECT id FROM pgjobs_dead")] == kept
        assert gone[0] not in kept


def test_s44_a_letter_written_by_hand_outside_every_range_lands_in_the_default_one() -> None:
    with pgjobs(DEAD_PARTITION_SPAN=60, DEAD_RETENTION=3600):
        Sweeper().run_once()
        (letter,) = fail_jobs(1)
        for moved_to in ("now() + interval '10 years'", "now() - interval '10 years'"):
            execute(f"UPDATE pgjobs_dead SET died_at = {moved_to} WHERE id = %s", [letter])
            assert partition_of(letter) == "pgjobs_dead_default"
        # Older than the retention, it is pruned from there, row by row (S24).
        assert Sweeper().run_once().dead_pruned == 1
        assert count("pgjobs_dead") == 0


def test_s44_retention_drops_partitions_under_a_running_drain() -> None:
    """A worker runs jobs, half of them to a dead letter, and its own sweeps make and
    drop partitions, while a producer enqueues and a reader lists the letters: every job
    ran once, no statement failed, and the letters that are gone are the oldest."""
    with pgjobs(DEAD_PARTITION_SPAN=1, DEAD_RETENTION=2):
        stop = threading.Event()
        failures: list[BaseException] = []
        enqueued: dict[int, str] = {}

        def produce() -> None:
            try:
                while not stop.is_set():
                    for kind in ("tests.record_then_fail", "tests.record"):
                        enqueued[Job.objects.enqueue(kind, {"label": "x"}).id] = kind
                    time.sleep(0.01)
            except BaseException as error:
                failures.append(error)
            finally:
                connections.close_all()

        def read() -> None:
            try:
                while not stop.is_set():
                    DeadJob.objects.letters(limit=50)
                    time.sleep(0.01)
            except BaseException as error:
                failures.append(error)
            finally:
                connections.close_all()

        Sweeper().run_once()
        first = next(p.name for p in DeadJob.objects.partitions() if p.upper is not None)
        threads = [threading.Thread(target=produce), threading.Thread(target=read)]
        with running_worker(concurrency=4, sweep_interval=0.3, poll_interval=0.05):
            for thread in threads:
                thread.start()
            time.sleep(5)
            stop.set()
            for thread in threads:
                thread.join(10)
            wait_until(lambda: count("pgjobs_job") == 0, timeout=30)
        assert not failures, failures
        ran = [r[0] for r in execute("SELECT job_id FROM tests_note ORDER BY job_id")]
        assert ran == sorted(enqueued)  # each job once, none lost
        failed = sorted(i for i, kind in enqueued.items() if kind == "tests.record_then_fail")
        kept = [r[0] for r in execute("SELECT id FROM pgjobs_dead ORDER BY died_at, id")]
        assert kept and len(kept) < len(failed)  # some went with their partitions
        assert set(kept) <= set(failed)
        assert failed[0] not in kept  # the first to die went with the first partitions
        # ... dropped whole by the worker's sweeps, not deleted from the default one.
        assert first not in {p.name for p in DeadJob.objects.partitions()}


#: Where a hand can put a letter: any instant PostgreSQL takes, its infinities included.
HAND_EDITED_DEATHS = st.one_of(
    st.sampled_from(["infinity", "-infinity"]),
    st.integers(min_value=-(10**11), max_value=10**11)
    # not within two minutes of the retention, where the test's clock and the sweep's differ
    .filter(lambda seconds: abs(seconds + 86_400) > 120)
    .map(lambda seconds: f"{seconds} seconds"),  # from now: three millennia either way
)


@settings(
    max_examples=30,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)
@given(deaths=st.lists(HAND_EDITED_DEATHS, min_size=1, max_size=4))
def test_s44_letters_edited_to_any_instant_are_kept_or_pruned_by_their_age(
    deaths: list[str],
) -> None:
    """However a hand moves letters in time (out of every range, into the default
    partition, or into one made ahead), the sweeper makes partitions without an error
    and keeps exactly the letters younger than the retention."""
    execute("DELETE FROM pgjobs_dead")
    with pgjobs(DEAD_PARTITION_SPAN=3600, DEAD_RETENTION=86_400):
        ids = fail_jobs(len(deaths))
        for letter, death in zip(ids, deaths, strict=True):
            if "infinity" in death:
                moved, params = "%s::timestamptz", [death, letter]
            else:
                moved, params = "now() + %s::interval", [death, letter]
            execute(f"UPDATE pgjobs_dead SET died_at = {moved} WHERE id = %s", params)
        young = {
            r[0]
            for r in execute("SELECT id FROM pgjobs_dead WHERE died_at >= now() - interval '1 day'")
        }
        result = Sweeper().run_once()
        assert {r[0] for r in execute("SELECT id FROM pgjobs_dead")} == young
        assert result.dead_pruned + len(young) == len(ids)


def test_s44_letters_written_while_their_range_is_attached_are_neither_refused_nor_lost() -> None:
    """A statement that began before its letter's range was attached routes the letter to
    the default partition; once the range is attached that insert would fail ("violates
    partition constraint") unless writers wait while a range being written to is
    attached. Here the current span's range is dropped and made again, over and over,
    while a writer adds letters of that span."""
    stop = threading.Event()
    written: list[int] = []
    failures: list[BaseException] = []

    def write() -> None:
        with other_connection() as conn:
            letter = 10**9
            while not stop.is_set():
                letter += 1
                try:
                    conn.execute(
                        "INSERT INTO pgjobs_dead (id, queue, kind, max_attempts, lease_s, "
                        "reason, category) VALUES (%s, 'w', 'k', 1, 30, 'failed', 'failed')",
                        [letter],
                    )
                except psycopg.Error as error:
                    failures.append(error)
                    return
                written.append(letter)

    writer = threading.Thread(target=write)
    writer.start()
    set_aside = []
    try:
        for round_ in range(30):
            for partition in DeadJob.objects.partitions():  # detached, letters and all
                if partition.upper is not None:
                    execute(f'ALTER TABLE pgjobs_dead DETACH PARTITION "{partition.name}"')
                    execute(f'ALTER TABLE "{partition.name}" RENAME TO "set_aside_{round_}"')
                    set_aside.append(f"set_aside_{round_}")
            assert DeadJob.objects.make_partitions(3600, ahead=0) == 1
    finally:
        stop.set()
        writer.join(10)
        kept = sum(count(table, "queue = 'w'") for table in set_aside)
        for table in set_aside:
            execute(f'DROP TABLE "{table}"')
    assert not failures, failures
    assert len(written) > 0
    assert count("pgjobs_dead", "queue = 'w'") + kept == len(written)


def test_s44_the_overview_estimates_dead_letters_from_the_partitions_statistics(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Past the cap, each queue's dead letters are estimated from what ANALYZE keeps of
    every partition, in one read of the catalog: an EXPLAIN per queue would plan over
    every partition (the console's overview at 10 M letters)."""
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    from django_pgjobs.managers import reads

    with pgjobs(DEAD_PARTITION_SPAN=3600):
        Sweeper().run_once()  # this hour's partition, and the next
        execute(
            "INSERT INTO pgjobs_dead (id, queue, kind, max_attempts, lease_s, reason, died_at)"
            " SELECT g, CASE WHEN g <= 600 THEN 'many' ELSE 'some' END, 'k', 1, 30, 'failed',"
            "        CASE WHEN g % 4 = 0 THEN now() - interval '3 days' ELSE now() END"
            " FROM generate_series(1, 900) AS g"
        )
        execute("ANALYZE pgjobs_dead_default")
        for partition in DeadJob.objects.partitions():
            execute(f'ANALYZE "{partition.name}"')
        monkeypatch.setattr(reads, "COUNT_CAP", 50)
        with CaptureQueriesContext(connection) as queries:
            overview = {q.queue: q for q in Job.objects.overview()}
        for queue, letters in (("many", 600), ("some", 300)):
            dead = overview[queue].dead
            assert dead.estimated and 0.7 * letters <= dead.value <= 1.3 * letters, dead
        planned = "EXPLAIN (FORMAT JSON)\nSELECT 1 FROM pgjobs_dead"  # ESTIMATE_DEAD's
        assert not [q for q in queries if planned in q["sql"]]
