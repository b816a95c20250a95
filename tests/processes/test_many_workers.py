"""Many worker hosts (issue 22): a hundred worker processes, one handler thread each,
claim through one PgBouncer in transaction mode. Every job runs exactly once (S6 with a
hundred claimers), the server never holds more connections than the pool, and every
worker leaves cleanly on SIGTERM."""

from __future__ import annotations

import signal
import subprocess
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import psycopg
import pytest

from django_pgjobs.models import Job, Worker
from tests.helpers import conninfo, count, execute
from tests.pgbouncer import available, pgbouncer
from tests.spawn import ROOT, WorkerProcess, Workers, wait_for

pytestmark = [
    pytest.mark.django_db(transaction=True),
    pytest.mark.slow,
    pytest.mark.skipif(not available(), reason="apt-get install pgbouncer"),
]

WORKERS = 100
JOBS = 3000
POOL_SIZE = 20
#: Client connections a worker process may hold: its loop's, its handler thread's, its
#: services' (sweeper, scheduler, registry), and the LISTEN probe at start.
CLIENT_CONNECTIONS_PER_WORKER = 7
#: They poll (no LISTEN through the pooler): a long interval keeps a hundred idle workers'
#: polls from slowing the start of the others, and delays the drain's start by one at most.
POLL_INTERVAL_S = 5
#: The test's own connections to the server besides the pool: Django's and the sampler's.
OWN_CONNECTIONS = 2

CLIENT_BACKENDS = (
    "SELECT count(*) FROM pg_stat_activity"
    " WHERE datname = current_database() AND backend_type = 'client backend'"
)


class ConnectionPeak:
    """The most client backends the server held on the test database, sampled from a
    connection of its own (counted too) every 20 ms while the block runs."""

    def __init__(self) -> None:
        self.peak = 0
        self.samples = 0
        self._stop = threading.Event()

    def _sample(self, conn: psycopg.Connection[Any]) -> None:
        while not self._stop.wait(0.02):
            row = conn.execute(CLIENT_BACKENDS).fetchone()
            self.peak = max(self.peak, int(row[0]) if row else 0)
            self.samples += 1

    @contextmanager
    def sampling(self) -> Iterator[ConnectionPeak]:
        with psycopg.connect(**conninfo(), autocommit=True) as conn:
            thread = threading.Thread(target=self._sample, args=(conn,), daemon=True)
            thread.start()
            try:
                yield self
            finally:
                self._stop.set()
                thread.join(10)


@pytest.fixture
def compiled() -> None:
    """The project's code compiled once, in place (__pycache__, as Python writes it by
    default): where PYTHONDONTWRITEBYTECODE is set (as in some CI images), each of a
    hundred workers would compile it again at start, some 0.3 s of CPU apiece."""
    subprocess.run(
        [sys.executable, "-m", "compileall", "-q"]
        + [str(ROOT / name) for name in ("django_pgjobs", "tests")],
        check=True,
        capture_output=True,
    )


def _all_registered(started: list[WorkerProcess]) -> bool:
    for worker in started:
        assert worker.process.poll() is None, worker.output()
    return Worker.objects.filter(stopped_at__isnull=True).count() == len(started)


@pytest.mark.usefixtures("compiled")
def test_a_hundred_workers_through_pgbouncer_claim_each_job_once(workers: Workers) -> None:
    """S6 with 100 claimers through a transaction pooler of 20 server connections: every
    job runs exactly once, at its first attempt; the server's connections to the database
    never exceed the pool (plus the test's own); every worker exits 0 on SIGTERM."""
    peak = ConnectionPeak()
    with (
        pgbouncer(
            pool_size=POOL_SIZE, max_client_conn=WORKERS * CLIENT_CONNECTIONS_PER_WORKER
        ) as pooled,
        peak.sampling(),
    ):
        env = {"DATABASE_URL": pooled, "PGJOBS_PREPARE": "0"}
        started = [
            workers.start(
                "--concurrency", "1", "--poll-interval", str(POLL_INTERVAL_S), extra_env=env
            )
            for _ in range(WORKERS)
        ]
        # All of them idle and polling before the jobs come, so that they race for them.
        wait_for(
            lambda: _all_registered(started),
            timeout=300,
            interval=0.5,
            what=f"{WORKERS} workers to register",
        )
        enqueued = {
            handle.id
            for handle in Job.objects.enqueue_many(
                [{"kind": "tests.record", "payload": {"label": f"many {i}"}} for i in range(JOBS)]
            )
        }
        wait_for(lambda: count() == 0, timeout=300, interval=0.2, what="the jobs to drain")
        for worker in started:
            worker.signal(signal.SIGTERM)
        codes = [worker.wait(60) for worker in started]

    assert codes == [0] * WORKERS, [w.output()[-2000:] for w in started if w.process.returncode]
    executions = execute("SELECT job_id, count(*), max(attempt) FROM tests_note GROUP BY job_id")
    assert {job_id for job_id, _, _ in executions} == enqueued
    assert [row for row in executions if row[1] != 1] == []  # no job ran twice
    assert {attempt for _, _, attempt in executions} == {1}  # nor was claimed again
    assert count("pgjobs_dead") == 0
    assert execute("SELECT count(DISTINCT worker) FROM tests_note")[0][0] > 1
    assert peak.samples > 0
    assert peak.peak <= POOL_SIZE + OWN_CONNECTIONS, peak.peak
