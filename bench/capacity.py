"""What one job costs the database server (issue 30, the capacity model): WAL bytes and
records, commits, and rows written and left dead per job, for its enqueue (in batches of
1,000 through `enqueue_many`, and one per transaction) and for its run (claim and ack by
one default worker), in lease mode with the done row deleted at the ack, with the result
kept an hour, and in transaction mode.

Read from PostgreSQL's cumulative statistics (`pg_stat_wal`, `pg_stat_database`,
`pg_stat_user_tables`) before and after each phase. A backend flushes its statistics when
it exits: each phase runs on connections that close (the enqueuing connection is closed,
the worker exits at the end of its burst). `pg_stat_wal` counts the whole server:
figures taken while something else writes are not figures (the load is beside each).
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from bench.harness import Database, Figure, WorkerProcess

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
    for case, kind, options in CASES:
        database.reset_jobs()
        load = round(os.getloadavg()[0], 1)
        before = read(database)
        for start in range(0, n, BATCH):
            rows = [{"kind": kind, "payload": {}, **options} for _ in range(min(BATCH, n - start))]
            Job.objects.enqueue_many(rows)
        connection.close()  # its statistics flushed
        enqueued = read(database)
        worker = WorkerProcess(database, "--burst")
        worker.wait(timeout=max(600, n / 200))
        ran = read(database)
        phases = {
            f"enqueue_many ({BATCH} a call)": enqueued.per_job(before, n),
            "claim, run and ack (one default worker)": ran.per_job(enqueued, n),
        }
        if not options and kind == "bench.noop":
            singles = max(n // 5, 1)
            database.reset_jobs()
            start_single = read(database)
            for _ in range(singles):
                with transaction.atomic():
                    Job.objects.enqueue(kind, {})
            connection.close()
            phases["enqueue, one per transaction"] = read(database).per_job(start_single, singles)
        for phase, figures_of in phases.items():
            for measure, unit in (("WAL bytes", "B/job"), ("commits", "commits/job"),
                                  ("dead rows", "rows/job")):  # fmt: skip
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
