"""Through a real PgBouncer in transaction mode: enqueue, claim, ack, fences, transaction
mode, limits and the operators' commands work with PREPARE off; LISTEN cannot
work through it, so a worker detects that and polls, or listens on LISTEN_DSN."""

from __future__ import annotations

import time
from collections.abc import Iterator

import pytest

from django_pgjobs.models import QueueControl
from tests import jobs
from tests.helpers import count, execute
from tests.pgbouncer import available, pgbouncer
from tests.spawn import (
    Workers,
    database_url_for_workers,
    listening_workers,
    manage_py,
    suite_env,
    wait_for,
)

pytestmark = [
    pytest.mark.django_db(transaction=True),
    pytest.mark.slow,
    pytest.mark.skipif(not available(), reason="apt-get install pgbouncer"),
]

POOL_SIZE = 6


@pytest.fixture
def pooled() -> Iterator[str]:
    """The test database's URL through PgBouncer (a pool smaller than the clients)."""
    with pgbouncer(pool_size=POOL_SIZE) as url:
        yield url


def through(url: str, listen_dsn: str | None = None) -> dict[str, str]:
    env = {"DATABASE_URL": url, "PGJOBS_PREPARE": "0"}
    if listen_dsn:
        env["PGJOBS_LISTEN_DSN"] = listen_dsn
    return env


ENQUEUE = """
from django.db import transaction
from django_pgjobs.models import Job
from tests import jobs

with transaction.atomic():
    for i in range(300):
        jobs.record.enqueue(label=f"plain {i}")
    for i in range(100):
        jobs.fenced_record.enqueue(label=f"fenced {i}")
    for i in range(50):
        jobs.atomic_write.enqueue(text=f"atomic {i}")
    for version in range(20):
        jobs.keyed.enqueue(account=1, version=version)
with transaction.atomic():
    jobs.record.enqueue(label="rolled back")
    transaction.set_rollback(True)
print("enqueued", Job.objects.count())
"""


def manage(url: str, *args: str) -> str:
    return manage_py(suite_env(**through(url)), *args, timeout=120)


def test_workers_drain_every_kind_of_job_through_pgbouncer(pooled: str, workers: Workers) -> None:
    assert "enqueued" in manage(pooled, "shell", "-c", ENQUEUE)
    started = [
        workers.start("--concurrency", "4", "--poll-interval", "0.2", extra_env=through(pooled))
        for _ in range(2)
    ]
    wait_for(lambda: count() == 0, timeout=120, what="the jobs to drain through PgBouncer")
    texts = [text for (text,) in execute("SELECT text FROM tests_note")]
    plain = [t for t in texts if t.startswith("plain")]
    assert len(plain) == len(set(plain)) == 300
    assert len({t for t in texts if t.startswith("fenced")}) == 100
    assert len({t for t in texts if t.startswith("atomic")}) == 50
    assert "rolled back" not in texts
    assert count("pgjobs_dead") == 0
    for process in started:
        assert process.process.poll() is None, process.output()
        # LISTEN through a transaction pooler hears nothing: the worker noticed, polls.
        assert "LISTEN receives no notifications" in process.output()
        assert "prepared statement" not in process.output()


BULK = """
from django.db import transaction
from django_pgjobs.exceptions import InvalidPriority
from django_pgjobs.models import Job

Job.objects.enqueue_many([{"kind": "tests.noop"}] * 4500)
with transaction.atomic():
    Job.objects.enqueue("tests.noop")
    try:
        Job.objects.enqueue_many([{"kind": "tests.noop"}] * 2500 + [{"kind": "x", "priority": 500}])
    except InvalidPriority as error:
        print("refused", error)
    Job.objects.enqueue_many([{"kind": "tests.noop"}] * 2100)
print("enqueued", Job.objects.count())
"""


def test_enqueue_many_in_several_documents_through_pgbouncer(pooled: str) -> None:
    """A batch of more than ENQUEUE_CHUNK jobs is pipelined inside a transaction (a
    savepoint in the caller's), which a transaction pooler carries as one."""
    output = manage(pooled, "shell", "-c", BULK)
    assert "refused jobs[2500]" in output
    assert "enqueued 6601" in output and count() == 6601


def test_with_a_direct_listen_dsn_an_idle_worker_wakes_at_once(
    pooled: str, workers: Workers
) -> None:
    process = workers.start(
        "--poll-interval", "30", extra_env=through(pooled, database_url_for_workers())
    )
    wait_for(lambda: listening_workers() == 1, what="the direct LISTEN connection")
    time.sleep(0.5)
    manage(pooled, "shell", "-c", "from tests import jobs; jobs.record.enqueue(label='woken')")
    # Timed from the enqueue's commit: the shell that enqueues took 6 s to start and
    # exit in a loaded CI run.
    committed = time.monotonic()
    wait_for(lambda: count("tests_note") == 1, timeout=10, what="the woken job")
    assert time.monotonic() - committed < 5  # a poll would take 30 s
    assert "LISTEN receives no notifications" not in process.output()


def test_limits_and_jobsctl_through_pgbouncer(pooled: str, workers: Workers) -> None:
    QueueControl.objects.set_limit("capped", 2)
    for i in range(12):
        jobs.record.using(queue="capped").enqueue(label=f"capped {i}", sleep=0.1)
    for _ in range(2):
        workers.start(
            "--queue",
            "capped",
            "--concurrency",
            "4",
            "--poll-interval",
            "0.1",
            extra_env=through(pooled),
        )
    peak = 0
    deadline = time.monotonic() + 60
    while count(where="queue = 'capped'") and time.monotonic() < deadline:
        peak = max(peak, count(where="queue = 'capped' AND state = 'running'"))
        time.sleep(0.01)
    assert count(where="queue = 'capped'") == 0 and peak == 2
    manage(pooled, "jobsctl", "pause", "capped")
    assert QueueControl.objects.get(name="capped").paused
    status = manage(pooled, "jobsctl", "status")
    assert "capped" in status and "yes" in status
    manage(pooled, "jobsctl", "resume", "capped")
    assert not QueueControl.objects.get(name="capped").paused


def test_a_failed_listen_probe_leaves_no_listener_on_the_pooled_connection(
    workers: Workers,
) -> None:
    """With one server connection in the pool, the worker's LISTEN lands on it and stays
    there (transaction mode resets nothing) unless the worker takes it back: the next
    client of that connection would be sent the queue's notifications."""
    import psycopg

    with pgbouncer(pool_size=1) as url:
        worker = workers.start(
            "--concurrency", "1", "--poll-interval", "0.5", extra_env=through(url)
        )
        wait_for(
            lambda: "LISTEN receives no notifications" in worker.output(),
            timeout=60,
            what="the worker to find that LISTEN hears nothing through the pooler",
        )
        with psycopg.connect(url, autocommit=True, prepare_threshold=None) as client:
            (channels,) = client.execute("SELECT array(SELECT pg_listening_channels())").fetchone()
        assert channels == []
