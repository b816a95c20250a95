"""Many worker hosts (issue 22): a hundred worker processes, one handler thread each, on
one database through PgBouncer in transaction mode.

The drain of `many_workers_jobs` jobs against its ceiling, the same drain by 4 processes
x concurrency 25 connected straight to PostgreSQL; the double claims (counted from the
handlers' own tally files, not from the queue's bookkeeping); the most server connections
the workers held; and what the hundred cost the server while idle (they cannot LISTEN
through the pooler, so they poll), at the default poll interval and a longer one.
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any

import psycopg

from bench.harness import (
    ROOT,
    WORKER_APP_NAME,
    Database,
    Figure,
    WorkerProcess,
    cpu_seconds,
    wait_for,
)

if TYPE_CHECKING:
    from bench.suite import Sizes

#: PgBouncer's server connections to the database (default_pool_size).
POOL_SIZE = 20
#: Client connections a worker process may hold: its loop's, its handler thread's, its
#: services' (sweeper, scheduler, registry), and the LISTEN probe at start.
CLIENT_CONNECTIONS_PER_WORKER = 7
#: The ceiling's workers: connected straight to PostgreSQL, as few processes as the grid's.
CEILING_PROCESSES, CEILING_CONCURRENCY = 4, 25
#: The longer poll interval of the idle figures (the shorter is the default).
LONG_POLL_S = 10.0

CLIENT_BACKENDS = """
SELECT count(*) FILTER (WHERE application_name = %(app)s), count(*)
FROM pg_stat_activity
WHERE datname = current_database() AND backend_type = 'client backend'
  AND pid <> pg_backend_pid()
"""
BACKEND_PIDS = """
SELECT pid FROM pg_stat_activity
WHERE datname = current_database() AND backend_type = 'client backend'
  AND pid <> pg_backend_pid()
"""
BACKGROUND_PIDS = "SELECT pid FROM pg_stat_activity WHERE backend_type <> 'client backend'"
TRANSACTIONS = (
    "SELECT xact_commit + xact_rollback FROM pg_stat_database WHERE datname = current_database()"
)


def compile_code() -> None:
    """Compile the project's code once, in place (__pycache__, as Python writes it by
    default): where PYTHONDONTWRITEBYTECODE is set, each of a hundred workers would
    compile it again at start."""
    subprocess.run(
        [sys.executable, "-m", "compileall", "-q"]
        + [str(ROOT / name) for name in ("django_pgjobs", "bench", "tests")],
        check=True,
        capture_output=True,
    )


class Fleet:
    """`processes` runjobs started at once with `args`; each tallies what it runs."""

    def __init__(
        self, database: Database, processes: int, args: tuple[str, ...], env: dict[str, str]
    ):
        self.database = database
        self.tally = Path(tempfile.mkdtemp(prefix="pgjobs-bench-tally-"))
        env = {**env, "PGJOBS_BENCH_TALLY": str(self.tally)}
        with database.connect() as conn:
            conn.execute("TRUNCATE pgjobs_worker")
        self.workers = [WorkerProcess(database, *args, env=env) for _ in range(processes)]

    def wait_registered(self) -> float:
        """Wait until every worker has written its registry row; return the seconds."""
        started = time.monotonic()

        def registered() -> bool:
            for worker in self.workers:
                if worker.process.poll() is not None:
                    raise RuntimeError(f"a worker exited at start:\n{worker.output()[-3000:]}")
            return self.database.count("pgjobs_worker", "stopped_at IS NULL") == len(self.workers)

        wait_for(registered, timeout=600, interval=0.5, what="every worker to register")
        return time.monotonic() - started

    def stop(self) -> float:
        """SIGTERM every worker; return the seconds until the last has exited (0 each)."""
        started = time.monotonic()
        for worker in self.workers:
            worker.process.send_signal(signal.SIGTERM)
        for worker in self.workers:
            if worker.wait(120) != 0:
                raise RuntimeError(f"a worker did not exit 0:\n{worker.output()[-3000:]}")
        return time.monotonic() - started

    def executions(self) -> Counter[int]:
        """How many times each job id ran, from every process's tally file."""
        counts: Counter[int] = Counter()
        for path in self.tally.glob("*.ids"):
            counts.update(int(line) for line in path.read_text().split())
        return counts

    def drain_window(self) -> tuple[float, float]:
        spans = [w for w in (worker.drain_window() for worker in self.workers) if w is not None]
        if not spans:
            raise RuntimeError("no worker reported a drain window")
        return min(start for start, _ in spans), max(end for _, end in spans)

    def claimed(self) -> list[int]:
        """Jobs each worker says it claimed (its closing log line), for the record."""
        found = (re.search(r" claimed=(\d+)", worker.output()) for worker in self.workers)
        return [int(match.group(1)) if match else 0 for match in found]

    def cpu_seconds(self) -> float:
        return sum(_cpu_seconds(worker.pid) or 0.0 for worker in self.workers)

    def cleanup(self) -> None:
        for worker in self.workers:
            worker.cleanup()
        shutil.rmtree(self.tally, ignore_errors=True)


@contextmanager
def fleet(
    database: Database, processes: int, args: tuple[str, ...], env: dict[str, str]
) -> Iterator[Fleet]:
    started = Fleet(database, processes, args, env)
    try:
        yield started
    finally:
        started.cleanup()


class ConnectionPeak:
    """The most client backends on the database, sampled every 50 ms from a connection of
    its own (not counted): the workers' (by application_name) and all of them."""

    def __init__(self, database: Database) -> None:
        self.database = database
        self.workers = 0
        self.all = 0
        self.samples = 0
        self._stop = threading.Event()

    def _sample(self, conn: psycopg.Connection[Any]) -> None:
        while not self._stop.wait(0.05):
            row = conn.execute(CLIENT_BACKENDS, {"app": WORKER_APP_NAME}).fetchone()
            if row:
                self.workers, self.all = max(self.workers, row[0]), max(self.all, row[1])
                self.samples += 1

    @contextmanager
    def sampling(self) -> Iterator[ConnectionPeak]:
        with self.database.connect() as conn:
            thread = threading.Thread(target=self._sample, args=(conn,), daemon=True)
            thread.start()
            try:
                yield self
            finally:
                self._stop.set()
                thread.join(10)


def _drain(fleet_: Fleet, database: Database, n: int) -> dict[str, Any]:
    """Enqueue `n` tally jobs in one transaction for the registered fleet, wait until the
    table is empty, stop the fleet; the drain's figures."""
    from django.db import transaction

    from django_pgjobs.models import Job

    peak = ConnectionPeak(database)
    with peak.sampling():
        with transaction.atomic():
            Job.objects.enqueue_many([{"kind": "bench.tally"}] * n)
        wait_for(
            lambda: database.count() == 0, timeout=max(600, n / 100), interval=0.2, what="the drain"
        )
        stop_s = fleet_.stop()
    first, last = fleet_.drain_window()
    executions = fleet_.executions()
    return {
        "rate": n / (last - first),
        "double": sum(times - 1 for times in executions.values()),
        "missing": n - len(executions),
        "peak_workers": peak.workers,
        "peak_all": peak.all,
        "samples": peak.samples,
        "stop_s": stop_s,
        "claimed": fleet_.claimed(),
    }


def _idle_cost(database: Database, fleet_: Fleet, seconds: float) -> dict[str, float]:
    """CPU seconds per second of the database's backends (and PgBouncer's, the workers',
    the server's background processes') and transactions per second, over `seconds`."""
    bouncer = _child_pids("pgbouncer")
    with database.connect() as conn:
        backends = [pid for (pid,) in conn.execute(BACKEND_PIDS).fetchall()]
        background = [pid for (pid,) in conn.execute(BACKGROUND_PIDS).fetchall()]
        before = _cpu_of([*backends, *background, *bouncer])
        workers_before = fleet_.cpu_seconds()
        xacts_before = conn.execute(TRANSACTIONS).fetchone()[0]  # type: ignore[index]
        started = time.monotonic()
        time.sleep(seconds)
        xacts_after = conn.execute(TRANSACTIONS).fetchone()[0]  # type: ignore[index]
        took = time.monotonic() - started
        workers_after = fleet_.cpu_seconds()
        backends_after = [pid for (pid,) in conn.execute(BACKEND_PIDS).fetchall()]
        after = _cpu_of([*before, *backends_after])

    def spent(pids: list[int]) -> float:
        """CPU seconds `pids` spent in the window (a new one: since it started; one gone
        before the end: not counted)."""
        return sum(after[pid] - before.get(pid, 0.0) for pid in pids if pid in after)

    new_backends = sorted(set(backends_after) - set(backends))
    return {
        "server_cpu": spent([*backends, *new_backends]) / took,
        "backends": len(set(backends) | set(new_backends)),
        "backends_gone": len(set(backends) - set(backends_after)),
        "background_cpu": spent(background) / took,
        "pgbouncer_cpu": spent(bouncer) / took,
        "workers_cpu": (workers_after - workers_before) / took,
        # The count includes the first reading's own transaction.
        "transactions": (xacts_after - xacts_before - 1) / took,
        "seconds": took,
    }


def many_workers(database: Database, sizes: Sizes) -> list[Figure]:
    """100 workers x concurrency 1 through PgBouncer: idle cost at the default poll, the
    drain, then the idle cost at a longer poll; the drain's ceiling, 4 x 25 direct."""
    from django_pgjobs.conf import pgjobs_settings
    from tests.pgbouncer import pgbouncer

    n, processes = sizes.many_workers_jobs, sizes.many_workers
    default_poll = pgjobs_settings.POLL_INTERVAL
    idle: dict[float, dict[str, float]] = {}
    database.reset_jobs()
    compile_code()
    with pgbouncer(
        pool_size=POOL_SIZE, max_client_conn=processes * CLIENT_CONNECTIONS_PER_WORKER
    ) as pooled:
        env = {"DATABASE_URL": pooled, "PGJOBS_BENCH_PREPARE": "0"}
        with fleet(database, processes, ("--concurrency", "1"), env) as pooled_fleet:
            start_s = pooled_fleet.wait_registered()
            # The start's own statements are done.
            time.sleep(_settle_s(sizes, default_poll))
            idle[default_poll] = _idle_cost(database, pooled_fleet, sizes.many_workers_idle_s)
            drained = _drain(pooled_fleet, database, n)
        database.reset_jobs()
        args = ("--concurrency", "1", "--poll-interval", f"{LONG_POLL_S:g}")
        with fleet(database, processes, args, env) as slow_fleet:
            slow_fleet.wait_registered()
            time.sleep(_settle_s(sizes, LONG_POLL_S))
            idle[LONG_POLL_S] = _idle_cost(database, slow_fleet, sizes.many_workers_idle_s)
            slow_fleet.stop()
    database.reset_jobs()
    with fleet(
        database, CEILING_PROCESSES, ("--concurrency", str(CEILING_CONCURRENCY)), {}
    ) as direct:
        direct.wait_registered()
        ceiling = _drain(direct, database, n)
    database.reset_jobs()

    topology = f"{processes} x concurrency 1 through PgBouncer (transaction mode, pool {POOL_SIZE})"
    details = {
        "jobs": n,
        "workers": processes,
        "pool_size": POOL_SIZE,
        "seconds until every worker registered": round(start_s, 1),
        "seconds from SIGTERM until every worker exited": round(drained["stop_s"], 1),
        "workers that claimed jobs": sum(1 for c in drained["claimed"] if c),
        "most jobs one worker claimed": max(drained["claimed"]),
    }
    figures = [
        Figure(
            "many_workers",
            f"drain, {topology}",
            drained["rate"],
            "jobs/s",
            ceiling=ceiling["rate"],
            details={
                **details,
                "ceiling": f"the same drain, {CEILING_PROCESSES} x concurrency "
                f"{CEILING_CONCURRENCY} straight to PostgreSQL (LISTEN, prepared statements)",
                "handler": "bench.tally: one O_APPEND write of the job id",
            },
        ),
        Figure(
            "many_workers",
            f"double claims over {n:,} jobs",
            drained["double"] + ceiling["double"],
            "jobs",
            target="0",
            met=drained["double"] == ceiling["double"] == 0
            and drained["missing"] == ceiling["missing"] == 0,
            details={
                "through PgBouncer": drained["double"],
                "direct (ceiling run)": ceiling["double"],
                "jobs never run": drained["missing"] + ceiling["missing"],
            },
        ),
        Figure(
            "many_workers",
            "most server connections of the workers during the drain",
            drained["peak_workers"],
            "connections",
            target=f"<= {POOL_SIZE} (the pool)",
            met=drained["peak_workers"] <= POOL_SIZE,
            details={
                "samples": drained["samples"],
                "every client backend on the database but the sampler's": drained["peak_all"],
                "direct ceiling's workers (4 x 25)": ceiling["peak_workers"],
            },
        ),
    ]
    for poll, cost in idle.items():
        label = f"{processes} idle workers, poll {poll:g} s" + (
            " (default)" if poll == default_poll else ""
        )
        facts = {
            "seconds measured": round(cost["seconds"], 1),
            "server backends measured": cost["backends"],
            "backends gone during the window": cost["backends_gone"],
            "PgBouncer CPU s/s": round(cost["pgbouncer_cpu"], 4),
            "the workers' own CPU s/s (all of them)": round(cost["workers_cpu"], 4),
            "server background processes CPU s/s (shared with every database)": round(
                cost["background_cpu"], 4
            ),
            "heartbeat_s": pgjobs_settings.WORKER_HEARTBEAT,
        }
        figures += [
            Figure(
                "many_workers",
                f"server CPU, {label}",
                cost["server_cpu"],
                "CPU s/s",
                details={**facts, "what": "utime + stime of the database's backends, /proc"},
            ),
            Figure(
                "many_workers",
                f"server transactions, {label}",
                cost["transactions"],
                "tx/s",
                details={**facts, "what": "xact_commit + xact_rollback, pg_stat_database"},
            ),
        ]
    return figures


def pooled_sweep(database: Database, sizes: Sizes) -> list[Figure]:
    """Worker processes (concurrency 1) from one to a hundred through one PgBouncer in
    transaction mode (pool POOL_SIZE): each fleet's drain of `sweep_jobs` jobs, the most
    server connections it held, and the server's CPU per job over the drain (issue 30's
    capacity model)."""
    from bench.capacity import postmaster_of, server_cpu_s
    from tests.pgbouncer import pgbouncer

    n = sizes.sweep_jobs
    compile_code()
    postmaster = postmaster_of(database)
    figures = []
    max_clients = max(sizes.sweep_fleets) * CLIENT_CONNECTIONS_PER_WORKER
    with pgbouncer(pool_size=POOL_SIZE, max_client_conn=max_clients) as pooled:
        env = {"DATABASE_URL": pooled, "PGJOBS_BENCH_PREPARE": "0"}
        for processes in sizes.sweep_fleets:
            database.reset_jobs()
            with fleet(database, processes, ("--concurrency", "1"), env) as workers:
                workers.wait_registered()
                time.sleep(_settle_s(sizes, 2.0))
                load = round(os.getloadavg()[0], 1)
                cpu_before = server_cpu_s(postmaster)
                drained = _drain(workers, database, n)
                cpu_after = server_cpu_s(postmaster)
            server_cpu = (
                None
                if cpu_before is None or cpu_after is None
                else round((cpu_after - cpu_before) / n * 1e6, 1)
            )
            figures.append(
                Figure(
                    "pooled_sweep",
                    f"drain, {processes} worker(s) x concurrency 1 through PgBouncer "
                    f"(pool {POOL_SIZE})",
                    drained["rate"],
                    "jobs/s",
                    details={
                        "jobs": n,
                        "load_1min": load,
                        "server CPU µs/job (the drain and the fleet's stop)": server_cpu,
                        "most server connections of the workers": drained["peak_workers"],
                        "jobs run twice": drained["double"],
                        "jobs never run": drained["missing"],
                        "workers that claimed jobs": sum(1 for c in drained["claimed"] if c),
                    },
                    met=drained["double"] == drained["missing"] == 0,
                    target="every job once",
                )
            )
    database.reset_jobs()
    return figures


def _settle_s(sizes: Sizes, poll_s: float) -> float:
    """How long a fleet polling every `poll_s` settles before its idle cost is taken."""
    if sizes.many_workers_settle_s is not None:
        return sizes.many_workers_settle_s
    return max(5.0, 2 * poll_s)


def _cpu_seconds(pid: int) -> float | None:
    """utime + stime of `pid` (None once it is gone)."""
    try:
        return cpu_seconds(pid)
    except OSError:
        return None


def _cpu_of(pids: list[int]) -> dict[int, float]:
    """The CPU seconds of each of `pids` still running."""
    return {pid: cpu for pid in set(pids) if (cpu := _cpu_seconds(pid)) is not None}


def _child_pids(command: str) -> list[int]:
    """The pids of this process's children named `command` (the PgBouncer it started)."""
    found = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            name, rest = stat.read_text().split(") ", 1)
        except (FileNotFoundError, ProcessLookupError, ValueError):
            continue
        if name.split("(", 1)[1] == command and int(rest.split()[1]) == os.getpid():
            found.append(int(stat.parent.name))
    return found
