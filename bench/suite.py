"""The benchmarks. Each returns Figures; the ceilings are measured in the same run."""

from __future__ import annotations

import os
import signal
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import psycopg

from bench import capacity, console, history, long, many_workers, plans, pressure, wake, workflows
from bench.harness import (
    WORKER_APP_NAME,
    Database,
    Figure,
    WorkerProcess,
    cpu_seconds,
    stop_all,
    wait_for,
)


@dataclass(frozen=True)
class Sizes:
    enqueue_singles: int = 3000
    enqueue_many: int = 100_000
    drain: int = 50_000
    drain_trickle: int = 10_000
    drain_grid: tuple[tuple[int, int], ...] = (
        (1, 32),
        (1, 64),
        (1, 128),
        (2, 64),
        (2, 128),
        (4, 64),
    )
    wake_jobs: int = 500
    wake_gap_s: float = 0.02
    wake_slow_jobs: int = 10
    wake_slow_gap_s: float = 1.5
    scale_extra: int = 1_000_000
    scale_backlog: int = 1_000_000
    claim_samples: int = 300
    recovery_jobs: int = 100
    recovery_lease_s: int = 5
    idle_seconds: float = 30.0
    counts_rows: int = 1_000_000
    counts_samples: int = 50
    console_rows: int = 10_000_000
    history_letters: int = 10_000_000
    history_drain: int = 50_000
    console_batch: int = 100_000
    #: Timed loads of each console page (after one warm-up), of which the median.
    page_samples: int = 20
    capacity_jobs: int = 20_000
    poison_ordinary: int = 10_000
    tasks: int = 20_000
    cancel_rounds: int = 5
    cancel_per_round: int = 20
    async_jobs: int = 1000
    keyed_jobs: int = 20_000
    workflow_chain: int = 1000
    workflow_fan_out: int = 10_000
    workflow_ack_samples: int = 500
    many_workers: int = 100
    many_workers_jobs: int = 100_000
    many_workers_idle_s: float = 30.0
    #: How long a fleet settles before its idle cost is taken (None: two polls, >= 5 s).
    many_workers_settle_s: float | None = None
    #: The fleets of the pooled sweep (worker processes through one PgBouncer), and the
    #: jobs each drains.
    sweep_fleets: tuple[int, ...] = (1, 10, 30, 100)
    sweep_jobs: int = 20_000
    pressure_rate: int = 500
    pressure_handlers: int = 16
    pressure_clean_s: float = 60.0
    pressure_pinned_s: float = 600.0
    pressure_recovery_s: float = 90.0
    # "none": the clean phase alone (a steady rate, the table's bloat with nothing pinned).
    pressure_pins: tuple[str, ...] = tuple(
        pin for pin in os.environ.get("PGJOBS_BENCH_PINS", "idle").split(",") if pin != "none"
    )
    pressure_sample_s: float = 2.0


SMOKE = Sizes(
    enqueue_singles=100,
    enqueue_many=2_000,
    drain=1_000,
    drain_trickle=200,
    drain_grid=((2, 10),),
    wake_jobs=20,
    wake_slow_jobs=2,
    scale_extra=5_000,
    scale_backlog=3_000,
    claim_samples=20,
    recovery_jobs=5,
    recovery_lease_s=2,
    idle_seconds=1.0,
    counts_rows=5_000,
    counts_samples=5,
    console_rows=5_000,
    history_letters=5_000,
    history_drain=200,
    console_batch=500,
    page_samples=3,
    capacity_jobs=500,
    poison_ordinary=500,
    tasks=500,
    cancel_rounds=1,
    cancel_per_round=5,
    async_jobs=100,
    keyed_jobs=1000,
    workflow_chain=100,
    workflow_fan_out=500,
    workflow_ack_samples=100,
    many_workers=5,
    many_workers_jobs=1000,
    many_workers_idle_s=2.0,
    many_workers_settle_s=0.5,
    sweep_fleets=(1, 3),
    sweep_jobs=200,
    pressure_rate=100,
    pressure_clean_s=2.0,
    pressure_pinned_s=4.0,
    pressure_recovery_s=2.0,
    pressure_pins=("idle", "readers", "terminate"),
    pressure_sample_s=0.5,
)

INSERT_NOOPS = """
INSERT INTO pgjobs_job (queue, kind, state, priority, run_after, attempts, max_attempts,
                        lease_s, payload, errors, created_at)
SELECT 'default', 'bench.noop', 'pending', 0, now() + %(offset)s::interval, 0, 10, 60,
       '{}', '[]', now()
FROM generate_series(1, %(n)s)
"""
INSERT_DEAD = """
INSERT INTO pgjobs_dead (id, queue, kind, priority, run_after, attempts, max_attempts,
                         lease_s, payload, errors, created_at, reason, died_at, last_error)
SELECT -g, 'default', 'bench.noop', 0, now(), 10, 10, 60, '{}', '[]', now(),
       'max attempts exceeded', now() - g * interval '1 s', 'boom'
FROM generate_series(1, %(n)s) AS g
"""


#: The request-path enqueue and its ceiling run in this many alternating blocks.
ENQUEUE_BLOCKS = 5
PLAIN_INSERT = (
    "INSERT INTO pgjobs_job (queue, kind, state, max_attempts, lease_s, payload) "
    "VALUES ('default', 'bench.noop', 'pending', 10, 60, %s::jsonb)"
)


def enqueue(database: Database, sizes: Sizes) -> list[Figure]:
    """The request path: one enqueue per transaction.atomic(), against plain psycopg
    INSERT + commit; and enqueue_many of many jobs."""
    from django.db import connection, transaction

    from django_pgjobs.models import Job

    n = sizes.enqueue_singles
    block = max(1, n // ENQUEUE_BLOCKS)
    connection.ensure_connection()
    with psycopg.connect(database.url) as conn:  # not autocommit: INSERT, then commit

        def plain(i: int) -> None:
            conn.execute(PLAIN_INSERT, [f'{{"i": {i}}}'])
            conn.commit()

        def in_django(i: int) -> None:  # what Django's transaction itself costs
            with transaction.atomic(), connection.cursor() as cursor:
                cursor.execute(PLAIN_INSERT, [f'{{"i": {i}}}'])

        def ours(i: int) -> None:
            with transaction.atomic():
                Job.objects.enqueue("bench.noop", {"i": i})

        def autocommit(i: int) -> None:  # outside any transaction: one statement each
            Job.objects.enqueue("bench.noop", {"i": i})

        arms = (plain, in_django, ours, autocommit)
        seconds = dict.fromkeys(arms, 0.0)
        # Blocks of each in turn, so that a drift of the machine weighs on all alike.
        for _ in range(ENQUEUE_BLOCKS):
            for arm in arms:
                database.reset_jobs()
                started = time.perf_counter()
                for i in range(block):
                    arm(i)
                seconds[arm] += time.perf_counter() - started
    ceiling, django_rate, rate, autocommit_rate = (
        block * ENQUEUE_BLOCKS / seconds[arm] for arm in arms
    )
    database.reset_jobs()
    many = [{"kind": "bench.noop", "payload": {"i": i}} for i in range(sizes.enqueue_many)]
    started = time.perf_counter()
    with transaction.atomic():
        Job.objects.enqueue_many(many)
    bulk_rate = sizes.enqueue_many / (time.perf_counter() - started)
    database.reset_jobs()
    return [
        Figure(
            "enqueue",
            "enqueue in transaction.atomic()",
            rate,
            "jobs/s",
            ceiling=ceiling,
            target=">= 80% of ceiling",
            met=rate >= 0.8 * ceiling,
            details={
                "jobs": block * ENQUEUE_BLOCKS,
                "blocks": ENQUEUE_BLOCKS,
                "ceiling": "psycopg: one INSERT and a commit per job, in alternating blocks",
                "the same INSERT in transaction.atomic() (jobs/s)": round(django_rate),
                "the same INSERT in transaction.atomic() (% of ceiling)": round(
                    100 * django_rate / ceiling
                ),
            },
        ),
        Figure(
            "enqueue",
            "enqueue, one per transaction (autocommit)",
            autocommit_rate,
            "jobs/s",
            ceiling=ceiling,
            details={
                "jobs": block * ENQUEUE_BLOCKS,
                "blocks": ENQUEUE_BLOCKS,
                "how": "Job.objects.enqueue outside any transaction: its INSERT commits alone"
                " (as PgQueuer's single enqueue, which --peers sets beside it)",
            },
        ),
        Figure(
            "enqueue",
            "enqueue_many",
            bulk_rate,
            "jobs/s",
            target=">= 100,000 jobs/s",
            met=bulk_rate >= 100_000,
            details={"jobs": sizes.enqueue_many},
        ),
    ]


def drain_ceiling(database: Database, n: int, *, vacuum: bool) -> float:
    """Plain psycopg: DELETE ... WHERE id IN (SELECT ... FOR UPDATE SKIP LOCKED LIMIT 100),
    on the table `fill_as_users_do` leaves (vacuumed or not, as the figure it bounds)."""
    database.reset_jobs()
    fill_as_users_do(database, n, vacuum=vacuum)
    with database.connect() as conn:
        started = time.perf_counter()
        drained = 0
        while True:
            deleted = conn.execute(
                "DELETE FROM pgjobs_job WHERE id IN (SELECT id FROM pgjobs_job "
                "WHERE state = 'pending' AND queue = 'default' AND run_after <= now() "
                "ORDER BY priority DESC, run_after, id LIMIT 100 FOR UPDATE SKIP LOCKED)"
            ).rowcount
            if not deleted:
                break
            drained += deleted
        return drained / (time.perf_counter() - started)


def timed_drain(
    database: Database,
    n: int,
    processes: int,
    args: tuple[str, ...],
    remaining: int = 0,
    env: dict[str, str] | None = None,
) -> float:
    """Run `n` runnable no-op jobs (already in the table) with `runjobs --burst` (or
    `--max-jobs`, leaving `remaining` behind); return jobs per second."""
    flags = () if "--max-jobs" in args else ("--burst",)
    workers = [WorkerProcess(database, *flags, *args, env=env) for _ in range(processes)]
    try:
        for worker in workers:
            worker.wait(timeout=max(600, n / 500))
        windows = [w.drain_window() for w in workers]
        spans = [window for window in windows if window is not None]
        if not spans:
            raise RuntimeError("no worker reported a drain window:\n" + workers[0].output())
        left = database.count(where="run_after <= now()")
        if left != remaining:
            raise RuntimeError(f"{left} runnable jobs were left, not {remaining}")
        return n / (max(end for _, end in spans) - min(start for start, _ in spans))
    finally:
        for worker in workers:
            worker.cleanup()


def fill_runnable(database: Database, n: int, *, vacuum: bool = True) -> None:
    """Put `n` runnable no-op jobs in the table with a raw INSERT (the scale benchmarks'
    backlogs); `vacuum`: then VACUUM ANALYZE it."""
    with database.connect() as conn:
        conn.execute(INSERT_NOOPS, {"n": n, "offset": "0 s"})
        if vacuum:
            conn.execute("VACUUM ANALYZE pgjobs_job")


def fill_as_users_do(database: Database, n: int, *, vacuum: bool) -> None:
    """Put `n` runnable no-op jobs in the (just reset) table through
    `Job.objects.enqueue_many`, as an application's burst does; `vacuum`: then VACUUM
    ANALYZE it (the flattering case).

    Without it the table is what a queue has straight after a burst, before autovacuum
    comes by (up to autovacuum_naptime, 1 min by default, and longer while it is busy
    elsewhere): no statistics (a table never analyzed while it held jobs), no
    visibility map, no hint bits set yet."""
    from django_pgjobs.models import Job

    if not vacuum:
        database.forget_statistics()
    Job.objects.enqueue_many([{"kind": "bench.noop"}] * n)
    if vacuum:
        with database.connect() as conn:
            conn.execute("VACUUM ANALYZE pgjobs_job")


def fill_by_trickle(database: Database, n: int) -> float:
    """Put `n` runnable no-op jobs in the table with one `Job.objects.enqueue` each, in
    autocommit (one transaction per job, as requests enqueue); return enqueues per second."""
    from django_pgjobs.models import Job

    database.forget_statistics()
    started = time.perf_counter()
    for _ in range(n):
        Job.objects.enqueue("bench.noop")
    return n / (time.perf_counter() - started)


def _autovacuum_runs(database: Database) -> int:
    """How many times autovacuum and autoanalyze have processed pgjobs_job so far."""
    with database.connect() as conn:
        row = conn.execute(
            "SELECT autovacuum_count + autoanalyze_count FROM pg_stat_user_tables "
            "WHERE relname = 'pgjobs_job'"
        ).fetchone()
    return int(row[0]) if row else 0


#: The tables a drain figure is measured on, and how each figure names it.
TABLES = {False: "fresh table", True: "after VACUUM ANALYZE"}  # fresh: no statistics


def drain(database: Database, sizes: Sizes) -> list[Figure]:
    """Drain `sizes.drain` no-op jobs filled through enqueue_many, straight after the fill
    (the headline: what users meet) and after VACUUM ANALYZE (labelled: the figure older
    runs published); a trickle-filled table; the grid of processes x concurrency on both."""
    n = sizes.drain
    ceilings = {vacuum: drain_ceiling(database, n, vacuum=vacuum) for vacuum in TABLES}
    figures = []
    autovacuum_before = _autovacuum_runs(database)
    for vacuum, table in TABLES.items():
        database.reset_jobs()
        fill_as_users_do(database, n, vacuum=vacuum)
        rate = timed_drain(database, n, 1, ())
        fresh = not vacuum
        figures.append(
            Figure(
                "drain",
                f"1 process, default settings, {table}",
                rate,
                "jobs/s",
                ceiling=ceilings[vacuum],
                target=">= 15,000 jobs/s" if fresh else "",
                met=rate >= 15_000 if fresh else None,
                details={
                    "jobs": n,
                    "fill": "Job.objects.enqueue_many",
                    "table": table,
                    "ceiling": f"psycopg DELETE ... SKIP LOCKED LIMIT 100 loop, {table}",
                },
            )
        )
    trickle_n = sizes.drain_trickle
    database.reset_jobs()
    enqueue_rate = fill_by_trickle(database, trickle_n)
    trickle_rate = timed_drain(database, trickle_n, 1, ())
    figures.append(
        Figure(
            "drain",
            f"1 process, default settings, {trickle_n:,} jobs filled by single enqueues",
            trickle_rate,
            "jobs/s",
            details={
                "jobs": trickle_n,
                "fill": "Job.objects.enqueue, one per transaction (autocommit)",
                "fill rate (jobs/s)": round(enqueue_rate),
                "table": TABLES[False],
            },
        )
    )
    for vacuum, table in TABLES.items():
        best: tuple[float, int, int] | None = None
        grid = {}
        for processes, concurrency in sizes.drain_grid:
            database.reset_jobs()
            fill_as_users_do(database, n, vacuum=vacuum)
            rate = timed_drain(database, n, processes, ("--concurrency", str(concurrency)))
            grid[f"{processes}x{concurrency}"] = round(rate)
            if best is None or rate > best[0]:
                best = (rate, processes, concurrency)
        assert best is not None
        fresh = not vacuum
        figures.append(
            Figure(
                "drain",
                f"best of grid, {table}: {best[1]} process(es) x concurrency {best[2]}",
                best[0],
                "jobs/s",
                ceiling=ceilings[vacuum],
                target=">= 20,000 jobs/s" if fresh else "",
                met=best[0] >= 20_000 if fresh else None,
                details={
                    "jobs": n,
                    "table": table,
                    "grid (processes x concurrency)": grid,
                    "best": {"processes": best[1], "concurrency": best[2]},
                },
            )
        )
    autovacuum_runs = _autovacuum_runs(database) - autovacuum_before
    for figure in figures:
        figure.details["autovacuum runs on pgjobs_job during the drains"] = autovacuum_runs
    database.reset_jobs()
    return figures


def wake_latency(database: Database, sizes: Sizes) -> list[Figure]:
    """An idle worker; jobs enqueued one at a time; commit to the handler's first line."""
    from django.db import transaction

    from bench.models import Stamp
    from django_pgjobs.models import Job

    database.reset_jobs()
    worker = WorkerProcess(database)
    try:
        wait_for(lambda: _listeners(database) >= 1, timeout=30, what="the worker to LISTEN")
        time.sleep(0.5)
        committed: dict[int, float] = {}
        for _ in range(sizes.wake_jobs):
            with transaction.atomic():
                job_id = Job.objects.enqueue("bench.stamp").id
            committed[job_id] = time.time()
            time.sleep(sizes.wake_gap_s)
        wait_for(lambda: Stamp.objects.count() >= sizes.wake_jobs, timeout=60, what="every stamp")
        started = dict(Stamp.objects.values_list("job_id", "started"))
    finally:
        worker.terminate()
        worker.cleanup()
    latencies = sorted((started[i] - committed[i]) * 1000 for i in committed)
    database.reset_jobs()

    def percentile(p: float) -> float:
        return latencies[min(len(latencies) - 1, round(p * (len(latencies) - 1)))]

    p50, p95, p99 = percentile(0.50), percentile(0.95), percentile(0.99)
    details = {"jobs": sizes.wake_jobs, "gap_ms": sizes.wake_gap_s * 1000}
    return [
        Figure("wake", "p50", p50, "ms", target="<= 1 ms", met=p50 <= 1, details=details),
        Figure("wake", "p95", p95, "ms", details=details),
        Figure("wake", "p99", p99, "ms", target="<= 3 ms", met=p99 <= 3, details=details),
        Figure("wake", "max", latencies[-1], "ms", details=details),
    ]


def _claim_latency_ms(samples: int) -> float:
    from django.db import connection

    from django_pgjobs.models import Job

    connection.ensure_connection()
    timings = []
    for _ in range(samples):
        started = time.perf_counter()
        handle = Job.objects.claim_one("default", "bench-claimer")
        timings.append(time.perf_counter() - started)
        if handle is None:
            break
        handle.ack()
    return statistics.median(timings) * 1000


def scale(database: Database, sizes: Sizes) -> list[Figure]:
    n = sizes.drain
    database.reset_jobs()
    fill_runnable(database, n)
    empty_claim_ms = _claim_latency_ms(sizes.claim_samples)
    database.reset_jobs()
    fill_runnable(database, n)
    empty_rate = timed_drain(database, n, 1, ())

    database.reset_jobs()
    with database.connect() as conn:
        conn.execute(INSERT_NOOPS, {"n": sizes.scale_extra, "offset": "1 day"})
        conn.execute(INSERT_DEAD, {"n": sizes.scale_extra})
        conn.execute(INSERT_NOOPS, {"n": n, "offset": "0 s"})
        conn.execute("VACUUM ANALYZE pgjobs_job")
        conn.execute("VACUUM ANALYZE pgjobs_dead")
    crowded_claim_ms = _claim_latency_ms(sizes.claim_samples)
    with database.connect() as conn:
        conn.execute("DELETE FROM pgjobs_job WHERE run_after <= now()")
        conn.execute(INSERT_NOOPS, {"n": n, "offset": "0 s"})
        conn.execute("VACUUM ANALYZE pgjobs_job")
    crowded_rate = timed_drain(database, n, 1, ())

    # The backlog: drain the first `n` jobs of it (draining all of it would take as long
    # as the rest of the suite; the rate is what a backlog of this size allows).
    database.reset_jobs()
    fill_runnable(database, sizes.scale_backlog)
    backlog_rate = timed_drain(
        database, n, 1, ("--max-jobs", str(n)), remaining=sizes.scale_backlog - n
    )
    database.reset_jobs()
    extra = f"{sizes.scale_extra:,} scheduled + {sizes.scale_extra:,} dead rows"
    return [
        Figure(
            "scale",
            f"drain with {extra}",
            crowded_rate,
            "jobs/s",
            ceiling=empty_rate,
            target=">= 90% of empty-table drain",
            met=crowded_rate >= 0.9 * empty_rate,
            details={"jobs": n, "ceiling": "the same drain on empty tables"},
        ),
        Figure(
            "scale",
            f"claim_one latency with {extra}",
            crowded_claim_ms,
            "ms",
            ceiling=empty_claim_ms,
            details={"samples": sizes.claim_samples, "ceiling": "claim_one on empty tables"},
        ),
        Figure(
            "scale",
            f"drain of {n:,} jobs from a {sizes.scale_backlog:,}-job backlog",
            backlog_rate,
            "jobs/s",
            ceiling=empty_rate,
            target=">= 80% of empty-table drain",
            met=backlog_rate >= 0.8 * empty_rate,
            details={"ceiling": f"the same drain of {n:,} jobs"},
        ),
    ]


INSERT_MIXED = """
INSERT INTO pgjobs_job (queue, kind, state, priority, run_after, attempts, max_attempts,
                        lease_s, payload, errors, created_at, claimed_by, claimed_at,
                        claimed_until, worker_id)
SELECT 'q' || (g %% 4), 'bench.noop', s.state, 0,
       now() + CASE WHEN s.state = 'pending' AND g %% 3 = 0 THEN interval '1 day'
                    ELSE interval '0' END,
       CASE WHEN s.state = 'running' THEN 1 ELSE 0 END, 10, 60, '{}', '[]', now(),
       CASE WHEN s.state = 'running' THEN gen_random_uuid() END,
       CASE WHEN s.state = 'running' THEN now() END,
       CASE WHEN s.state = 'running' THEN now() + interval '1 hour' END,
       CASE WHEN s.state = 'running' THEN 'bench' END
FROM generate_series(1, %(n)s) AS g
CROSS JOIN LATERAL (
    SELECT CASE WHEN g %% 100 = 0 THEN 'running' ELSE 'pending' END AS state
) AS s
"""


def counts(database: Database, sizes: Sizes) -> list[Figure]:
    """The per-queue state counts the admin's glance and the metrics' gauges read, with
    `counts_rows` rows in the live table (two thirds runnable, one third scheduled, 1 %
    running: as many as a large fleet's slots) and as many dead letters, over four
    queues."""
    from django_pgjobs.models import Job, QueueControl

    database.reset_jobs()
    with database.connect() as conn:
        conn.execute(INSERT_MIXED, {"n": sizes.counts_rows})
        conn.execute(INSERT_DEAD.replace("'default'", "'q' || (g %% 4)"), {"n": sizes.counts_rows})
        conn.execute("VACUUM ANALYZE pgjobs_job")
        conn.execute("VACUUM ANALYZE pgjobs_dead")
    figures = []
    for name, read in (
        ("Job.objects.overview() (metrics gauges)", Job.objects.overview),
        ("QueueControl.objects.status() (admin glance, jobsctl)", QueueControl.objects.status),
    ):
        read()  # connect, and warm the caches as a running process has them
        timings = []
        for _ in range(sizes.counts_samples):
            started = time.perf_counter()
            read()
            timings.append(time.perf_counter() - started)
        timings.sort()
        median_ms = statistics.median(timings) * 1000
        figures.append(
            Figure(
                "counts",
                f"{name} with {sizes.counts_rows:,} live + {sizes.counts_rows:,} dead rows",
                median_ms,
                "ms",
                target="<= 50 ms",
                met=median_ms <= 50,
                details={
                    "samples": sizes.counts_samples,
                    "max_ms": timings[-1] * 1000,
                    "p95_ms": timings[int(0.95 * (len(timings) - 1))] * 1000,
                },
            )
        )
    database.reset_jobs()
    return figures


def recovery(database: Database, sizes: Sizes) -> list[Figure]:
    """kill -9 a worker holding jobs; time until another worker has done them all."""
    from django_pgjobs.models import Job

    database.reset_jobs()
    n, lease = sizes.recovery_jobs, sizes.recovery_lease_s
    doomed = WorkerProcess(database, "--concurrency", str(n))
    rescuer = None
    try:
        Job.objects.enqueue_many(
            [{"kind": "bench.hold", "payload": {"seconds": 600}, "lease": lease}] * n
        )
        wait_for(
            lambda: database.count(where="state = 'running'") == n, 60, what="every job to run"
        )
        rescuer = WorkerProcess(database, "--concurrency", str(n))
        wait_for(lambda: _listeners(database) >= 2, 30, what="the rescuer to LISTEN")
        killed = time.monotonic()
        os.kill(doomed.pid, signal.SIGKILL)
        wait_for(lambda: database.count() == 0, 120, interval=0.02, what="the jobs to be redone")
        took = time.monotonic() - killed
    finally:
        doomed.kill()
        doomed.cleanup()
        if rescuer is not None:
            rescuer.terminate()
            rescuer.cleanup()
    database.reset_jobs()
    return [
        Figure(
            "recovery",
            f"{n} jobs after kill -9 (lease {lease} s)",
            took,
            "s",
            target=f"<= {lease + 1} s",
            met=took <= lease + 1,
        )
    ]


def _listeners(database: Database) -> int:
    with database.connect() as conn:
        row = conn.execute(
            "SELECT count(*) FROM pg_stat_activity WHERE query LIKE '%%LISTEN %%' "
            "AND datname = current_database() AND application_name = %s",
            [WORKER_APP_NAME],
        ).fetchone()
    return int(row[0]) if row else 0


def footprint(database: Database, sizes: Sizes) -> list[Figure]:
    from django_pgjobs.models import Job

    database.reset_jobs()
    worker = WorkerProcess(database, "--concurrency", "8")
    try:
        Job.objects.enqueue_many([{"kind": "bench.noop"}] * 2000)
        wait_for(lambda: database.count() == 0, 60, what="the warm-up jobs")
        time.sleep(1)
        rss_mb = _rss_kb(worker.pid) / 1024
        before = cpu_seconds(worker.pid)
        time.sleep(sizes.idle_seconds)
        idle_cpu = (cpu_seconds(worker.pid) - before) / sizes.idle_seconds * 100
    finally:
        worker.terminate()
        worker.cleanup()
    return [
        Figure(
            "footprint", "RSS at concurrency 8", rss_mb, "MB", target="<= 80 MB", met=rss_mb <= 80
        ),
        Figure(
            "footprint",
            f"idle CPU over {sizes.idle_seconds:g} s",
            idle_cpu,
            "%",
            target="< 1 %",
            met=idle_cpu < 1,
        ),
    ]


def _rss_kb(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    raise RuntimeError(f"no VmRSS for pid {pid}")


#: Worker processes of the poison benchmark, and one poison job per this many ordinary ones.
POISON_WORKERS = 3
POISON_EVERY = 100


def poison(database: Database, sizes: Sizes) -> list[Figure]:
    """S27 under load: POISON_WORKERS workers take a stream of no-op jobs with 1 % of
    hostile handlers mixed in (django_pgjobs.chaos.poison: NUL and lone surrogates in
    errors, unprintable exceptions, bad Retry delays, unstorable results, SystemExit).
    How long after the last enqueue every ordinary job is done, and whether every poison
    job is dead with a readable reason; the same stream without poison is the ceiling."""
    from django_pgjobs.chaos.poison import BEHAVIOURS

    names = sorted(BEHAVIOURS)
    n = sizes.poison_ordinary

    def stream(poisoned: bool) -> tuple[float, float, float]:
        """(seconds to drain after the last enqueue, ordinary jobs/s, seconds until every
        poison job is dead) of one stream."""
        from django_pgjobs.models import Job

        database.reset_jobs()
        workers = [WorkerProcess(database) for _ in range(POISON_WORKERS)]
        try:
            wait_for(lambda: _listeners(database) >= POISON_WORKERS, 30, what="the workers")
            started = time.perf_counter()
            for first in range(0, n, 500):  # a stream: blocks of 500 jobs
                block: list[dict[str, object]] = [{"kind": "bench.noop"}] * min(500, n - first)
                if poisoned:
                    block = [
                        *block,
                        *(
                            {"kind": "bench.poison", "payload": {"how": names[i % len(names)]}}
                            for i in range(
                                (first // POISON_EVERY), (first + len(block)) // POISON_EVERY
                            )
                        ),
                    ]
                Job.objects.enqueue_many(block)
            enqueued = time.perf_counter()
            wait_for(
                lambda: database.count(where="kind = 'bench.noop'") == 0,
                120,
                interval=0.01,
                what="the ordinary jobs",
            )
            drained = time.perf_counter()
            if poisoned:
                wait_for(
                    lambda: database.count(where="kind = 'bench.poison'") == 0,
                    120,
                    interval=0.05,
                    what="the poison jobs to die",
                )
            buried = time.perf_counter()
        finally:
            stop_all(workers)
        return drained - enqueued, n / (drained - started), buried - enqueued

    _, clean_rate, _ = stream(False)
    after_s, poisoned_rate, dead_after_s = stream(True)
    poisoned_count = n // POISON_EVERY
    dead = database.count("pgjobs_dead", where="kind = 'bench.poison'")
    readable = database.count("pgjobs_dead", where="kind = 'bench.poison' AND btrim(reason) <> ''")
    database.reset_jobs()
    details = {"ordinary": n, "poison": poisoned_count, "workers": POISON_WORKERS}
    return [
        Figure(
            "poison",
            f"ordinary jobs done after the last enqueue, {poisoned_count} poison among {n:,}",
            after_s,
            "s",
            target="<= 10 s",
            met=after_s <= 10,
            details=details,
        ),
        Figure(
            "poison",
            "ordinary jobs/s with 1 % poison",
            poisoned_rate,
            "jobs/s",
            ceiling=clean_rate,
            details={**details, "ceiling": "the same stream without poison"},
        ),
        Figure(
            "poison",
            "poison jobs dead-lettered with a readable reason",
            readable,
            "jobs",
            ceiling=poisoned_count,
            target=f"all {poisoned_count}",
            met=readable == poisoned_count == dead,
            details={**details, "dead": dead, "seconds until all dead": round(dead_after_s, 2)},
        ),
    ]


def tasks(database: Database, sizes: Sizes) -> list[Figure]:
    """django.tasks on the queue: N no-op tasks enqueued with Task.enqueue() in one
    transaction, then drained by one runjobs process at its default settings. The
    ceilings are N plain no-op jobs, enqueued with Job.objects.enqueue() in one
    transaction and drained the same way, in the same run: what a task costs beside a
    job (its payload, its variant rebuilt, its signals, its result read back once saved
    for task_finished, its row kept for the result retention)."""
    from django.db import transaction

    from bench import tasks as bench_tasks
    from django_pgjobs.models import Job

    n = sizes.tasks

    def enqueued(enqueue_one: Callable[[], object]) -> float:
        database.reset_jobs()
        started = time.perf_counter()
        with transaction.atomic():
            for _ in range(n):
                enqueue_one()
        rate = n / (time.perf_counter() - started)
        with database.connect() as conn:
            conn.execute("VACUUM ANALYZE pgjobs_job")
        return rate

    job_enqueue = enqueued(lambda: Job.objects.enqueue("bench.noop"))
    job_drain = _drained(database, n)
    task_enqueue = enqueued(bench_tasks.noop.enqueue)
    task_drain = _drained(database, n)
    done = database.count(where="state = 'done' AND kind = 'bench.tasks.noop'")
    database.reset_jobs()
    details = {"tasks": n, "kept as done (result retention)": done}
    return [
        Figure(
            "tasks",
            "Task.enqueue() in one transaction",
            task_enqueue,
            "tasks/s",
            ceiling=job_enqueue,
            details={**details, "ceiling": "Job.objects.enqueue() of a plain job, the same way"},
        ),
        Figure(
            "tasks",
            "drain, 1 process, default settings",
            task_drain,
            "tasks/s",
            ceiling=job_drain,
            details={**details, "ceiling": "plain no-op jobs drained the same way"},
        ),
    ]


def _drained(database: Database, n: int) -> float:
    """Run the `n` jobs in the table with one `runjobs --burst`; return jobs per second
    from its first claim to its last recorded outcome. Every job must end done or gone."""
    worker = WorkerProcess(database, "--burst")
    try:
        worker.wait(timeout=max(600, n / 500))
        window = worker.drain_window()
        if window is None:
            raise RuntimeError("the worker reported no drain window:\n" + worker.output())
        left = database.count(where="state <> 'done'")
        if left:
            raise RuntimeError(f"{left} jobs were not done:\n" + worker.output()[-3000:])
        return n / (window[1] - window[0])
    finally:
        worker.cleanup()


BENCHMARKS: dict[str, Callable[[Database, Sizes], list[Figure]]] = {
    "enqueue": enqueue,
    "drain": drain,
    "wake": wake_latency,
    "wakeparts": wake.wake_parts,
    "plans": plans.plans,
    "scale": scale,
    "recovery": recovery,
    "footprint": footprint,
    "counts": counts,
    "poison": poison,
    "tasks": tasks,
    "cancel": long.cancel,
    "async": long.async_handlers,
    "keyed": long.keyed,
    "workflows": workflows.workflows,
    "console": console.pages,
    "registry": console.registry_drain,
    "many_workers": many_workers.many_workers,
    "pooled_sweep": many_workers.pooled_sweep,
    "pressure": pressure.pressure,
    "capacity": capacity.capacity,
    "history": history.history,
}
