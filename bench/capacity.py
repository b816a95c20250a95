"""What one job costs the database server (issue 30, the capacity model): WAL bytes and
records, commits, and rows written and left dead per job, for its enqueue (in batches of
1,000 through `enqueue_many`, and one per transaction) and for its run (claim and ack by
one default worker), in lease mode with the done row deleted at the ack, with the result
kept an hour, and in transaction mode.

Read from PostgreSQL's cumulative statistics (`pg_stat_wal`, `pg_stat_database`,
`pg_stat_user_tables`) before and after each phase, and CPU from /proc: the server's
(its postmaster, the children it reaped, and every live child), the enqueuing process's
own, and the worker's (less what a worker that finds no job spends starting and
stopping). The server's CPU is read only when it runs on this machine. A backend
flushes its statistics when it exits: each phase runs on connections that close (the
enqueuing connection is closed, the worker exits at the end of its burst). `pg_stat_wal`
and the server's CPU count the whole server: figures taken while something else runs are
not figures (the load is beside each).
"""

from __future__ import annotations

import os
import resource
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from bench.harness import TICK_S, Database, Figure, WorkerProcess, proc_stat

if TYPE_CHECKING:
    from bench.suite import Sizes

#: The counters a phase is measured by, read at once.
COUNTERS = """
SELECT (SELECT wal_bytes FROM pg_stat_wal)::bigint,
       (SELECT wal_records FROM pg_stat_wal)::bigint,
       (SELECT xact_commit FROM pg_stat_database WHERE datname = current_database()),
       (SELECT coalesce(sum(n_tup_ins), 0) FROM pg_stat_user_tables WHERE relname LIKE 'pgjobs_%%'),
       (SELECT coalesce(sum(n_tup_upd), 0) FROM pg_stat_user_tables WHERE relname LIKE 'pgjobs_%%'),
       (SELECT coalesce(sum(n_tup_hot_upd), 0) FROM pg_stat_user_tables
        WHERE relname LIKE 'pgjobs_%%'),
       (SELECT coalesce(sum(n_tup_del), 0) FROM pg_stat_user_tables WHERE relname LIKE 'pgjobs_%%')
"""
#: Jobs per `enqueue_many` call, as an application's burst sends them.
BATCH = 1000
#: The cases: a name, the job's kind, its enqueue options.
CASES: tuple[tuple[str, str, dict[str, Any]], ...] = (
    ("lease mode, done row deleted at the ack", "bench.noop", {}),
    ("lease mode, result kept an hour", "bench.noop", {"result_retention": 3600}),
    ("transaction mode", "bench.noop_atomic", {}),
)


@dataclass(frozen=True)
class Counters:
    wal_bytes: int
    wal_records: int
    commits: int
    inserted: int
    updated: int
    hot_updated: int
    deleted: int

    def per_job(self, before: Counters, jobs: int) -> dict[str, float]:
        def of(name: str) -> float:
            return (getattr(self, name) - getattr(before, name)) / jobs

        return {
            "WAL bytes": of("wal_bytes"),
            "WAL records": of("wal_records"),
            # Less the one commit of the read that ended the phase.
            "commits": of("commits") - 1 / jobs,
            "rows inserted": of("inserted"),
            "rows updated": of("updated"),
            "of which HOT": of("hot_updated"),
            "rows deleted": of("deleted"),
            # Each UPDATE and DELETE leaves one dead row version for VACUUM.
            "dead rows": of("updated") + of("deleted"),
        }


def server_cpu_s(postmaster: int | None) -> float | None:
    """CPU seconds the PostgreSQL server has spent so far: its postmaster's own and its
    reaped children's, and every live child's (None: not on this machine)."""
    if postmaster is None:
        return None
    try:
        fields = proc_stat(postmaster)
    except OSError:
        return None
    ticks = sum(int(value) for value in fields[11:15])  # utime stime cutime cstime
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            child = proc_stat(int(entry.name))
        except OSError:  # gone meanwhile
            continue
        if int(child[1]) == postmaster:
            ticks += int(child[11]) + int(child[12])
    return ticks * TICK_S


def postmaster_of(database: Database) -> int | None:
    """The pid of the server's postmaster, when it runs on this machine: the parent of
    this connection's backend, if that pid here is a postgres process at all (a server
    elsewhere has pids of its own)."""
    with database.connect() as conn:
        row = conn.execute("SELECT pg_backend_pid()").fetchone()
    try:
        backend = int(row[0]) if row else 0
        if Path(f"/proc/{backend}/comm").read_text().strip() != "postgres":
            return None
        return int(proc_stat(backend)[1])
    except OSError:
        return None


def children_cpu_s() -> float:
    """CPU seconds of this process's children that have exited (the workers)."""
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def idle_worker_cpu_s(database: Database) -> float:
    """CPU seconds a burst worker spends when it finds nothing: Django's start, the
    worker's setup and stop, which the per-job figures leave out."""
    database.reset_jobs()
    before = children_cpu_s()
    WorkerProcess(database, "--burst").wait(timeout=120)
    return children_cpu_s() - before


def read(database: Database) -> Counters:
    time.sleep(0.5)  # the closed backends' last statistics reach shared memory
    with database.connect() as conn:
        conn.execute("SELECT pg_stat_clear_snapshot()")
        row = conn.execute(COUNTERS).fetchone()
    assert row is not None
    return Counters(*(int(value) for value in row))


def capacity(database: Database, sizes: Sizes) -> list[Figure]:
    """Per job: WAL, commits and dead rows of its enqueue and of its run, in each case."""
    from django.db import connection, transaction

    from django_pgjobs.models import Job

    n = sizes.capacity_jobs
    figures = []
    postmaster = postmaster_of(database)
    idle_worker = idle_worker_cpu_s(database)

    def cpu(figures_of: dict[str, float], server: tuple[float | None, float | None],
            client_s: float, jobs: int) -> dict[str, float]:  # fmt: skip
        """`figures_of` with the CPU per job of the server and of the client, in µs."""
        started, ended = server
        if started is not None and ended is not None:
            figures_of["server CPU"] = (ended - started) / jobs * 1e6
        figures_of["client CPU"] = max(client_s, 0.0) / jobs * 1e6
        return figures_of

    for case, kind, options in CASES:
        database.reset_jobs()
        load = round(os.getloadavg()[0], 1)
        before = read(database)
        cpu_before, own_before = server_cpu_s(postmaster), time.process_time()
        for start in range(0, n, BATCH):
            rows = [{"kind": kind, "payload": {}, **options} for _ in range(min(BATCH, n - start))]
            Job.objects.enqueue_many(rows)
        connection.close()  # its statistics flushed
        own_enqueue = time.process_time() - own_before
        enqueued = read(database)
        cpu_enqueued, workers_before = server_cpu_s(postmaster), children_cpu_s()
        worker = WorkerProcess(database, "--burst")
        worker.wait(timeout=max(600, n / 200))
        worker_s = children_cpu_s() - workers_before - idle_worker
        ran = read(database)
        cpu_ran = server_cpu_s(postmaster)
        phases = {
            f"enqueue_many ({BATCH} a call)": cpu(
                enqueued.per_job(before, n), (cpu_before, cpu_enqueued), own_enqueue, n
            ),
            "claim, run and ack (one default worker)": cpu(
                ran.per_job(enqueued, n), (cpu_enqueued, cpu_ran), worker_s, n
            ),
        }
        if not options and kind == "bench.noop":
            singles = max(n // 5, 1)
            database.reset_jobs()
            start_single = read(database)
            cpu_single, own_single = server_cpu_s(postmaster), time.process_time()
            for _ in range(singles):
                with transaction.atomic():
                    Job.objects.enqueue(kind, {})
            connection.close()
            own_single = time.process_time() - own_single
            phases["enqueue, one per transaction"] = cpu(
                read(database).per_job(start_single, singles),
                (cpu_single, server_cpu_s(postmaster)),
                own_single,
                singles,
            )
        for phase, figures_of in phases.items():
            measures = [("WAL bytes", "B/job"), ("commits", "commits/job"),
                        ("dead rows", "rows/job"), ("client CPU", "µs/job")]  # fmt: skip
            if "server CPU" in figures_of:
                measures.append(("server CPU", "µs/job"))
            for measure, unit in measures:
                figures.append(
                    Figure(
                        "capacity",
                        f"{measure}: {phase}, {case}",
                        figures_of[measure],
                        unit,
                        details={
                            "jobs": n,
                            "load_1min": load,
                            **{key: round(value, 3) for key, value in figures_of.items()},
                        },
                    )
                )
    database.reset_jobs()
    return figures
