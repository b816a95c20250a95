"""A queue in a database under pressure (issue 27): `python -m bench --only pressure`.

A producer offers jobs at a fixed rate through `enqueue_many` batches while one worker
drains them, through three phases: clean; pinned, where something holds the database's
xmin horizon (an idle session in a transaction that holds an XID, or REPEATABLE READ
readers scanning the job tables), so VACUUM can remove none of the rows finished jobs
leave; and recovery, after the horizon is released. Per phase: the completion rate against
the offered one, the pickup latency (commit of the enqueue to the handler's first line),
the claim statement's time and buffers (EXPLAIN (ANALYZE, BUFFERS, TIMING OFF) samples of
a claim, in a transaction rolled back), the job table's dead tuples and its size with its indexes.

Sizes: smoke (seconds, for CI) and full (`Sizes.pressure_*`: 500 jobs/s, ten minutes
pinned). PGJOBS_BENCH_RATE, PGJOBS_BENCH_CLEAN_S, PGJOBS_BENCH_PINNED_S and
PGJOBS_BENCH_AFTER_S override the rate and the phases' lengths; PGJOBS_BENCH_PINS the
pressures, of idle, readers and terminate (full size: idle; none: the clean phase
alone); PGJOBS_BENCH_HANDLERS the worker's concurrency.

Bloat: each sample also reads the job table's size with its indexes (the phase's peak is
reported), and at a phase's end the same live rows are copied into a fresh table with the
same indexes: the table against that copy is how many times its live rows' size it takes.
"""

from __future__ import annotations

import os
import statistics
import tempfile
import threading
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import psycopg

from bench.harness import (
    WORKER_APP_NAME,
    Database,
    Figure,
    WorkerProcess,
    percentile,
    stop_all,
    wait_for,
)

if TYPE_CHECKING:
    from bench.suite import Sizes

#: How many batches a second the producer sends (each of rate / TICKS jobs).
TICKS = 20


@dataclass
class Phase:
    name: str
    started: float = 0.0
    ended: float = 0.0
    #: (seconds since the run began, claim ms, claim buffers) of each sample.
    claims: list[tuple[float, float, int]] = field(default_factory=list)
    dead_tuples: int = 0
    table_mb: float = 0.0
    live_rows: int = 0
    #: The largest size of the table with its indexes in a sample, and its live rows then.
    peak_mb: float = 0.0
    peak_live_rows: int = 0
    #: The size of the phase's last live rows in a fresh table with the same indexes.
    compact_mb: float = 0.0
    terminated: int = 0
    #: The claim sample that read the most buffers, and its plan.
    costliest: tuple[int, str] = (0, "")

    @property
    def claim_ms(self) -> float:
        return statistics.mean(ms for _, ms, _ in self.claims)

    @property
    def claim_buffers(self) -> float:
        return statistics.mean(buffers for _, _, buffers in self.claims)


class Producer(threading.Thread):
    """Offers `rate` jobs a second in TICKS batches a second through enqueue_many and
    records the moment each batch committed (autocommit: when enqueue_many returned).

    A batch that fails (its connection terminated: the "terminate" pressure) is counted
    by its exception's class and message, and the next goes on a new connection; an
    error that is not a database error is what callers do not expect, and is reported."""

    def __init__(self, rate: int) -> None:
        super().__init__(daemon=True)
        self.rate = rate
        self.committed: dict[int, float] = {}
        self.behind_s = 0.0
        self.failed: Counter[str] = Counter()
        #: Failures that were not the OperationalError (or InterfaceError) callers expect.
        self.unexpected: Counter[str] = Counter()
        self.error: BaseException | None = None
        self.pid: int | None = None
        self._stop = threading.Event()

    def run(self) -> None:
        from django.db import InterfaceError, OperationalError, connection

        from django_pgjobs.models import Job

        per_tick = max(1, self.rate // TICKS)
        interval = per_tick / self.rate
        next_at = time.monotonic()
        try:
            while not self._stop.is_set():
                try:
                    connection.ensure_connection()
                    self.pid = connection.connection.info.backend_pid
                    results = Job.objects.enqueue_many([{"kind": "bench.pressure"}] * per_tick)
                except Exception as error:
                    name = f"{type(error).__module__}.{type(error).__name__}"
                    self.failed[f"{name}: {str(error).strip()[:120]}"] += 1
                    if not isinstance(error, (OperationalError, InterfaceError)):
                        self.unexpected[name] += 1
                    connection.close()
                    results = []
                now = time.time()
                for result in results:
                    self.committed[int(result.id)] = now
                next_at += interval
                lag = next_at - time.monotonic()
                if lag > 0:
                    self._stop.wait(lag)
                else:
                    self.behind_s = max(self.behind_s, -lag)
        except BaseException as error:  # reported by the benchmark, not lost in a thread
            self.error = error
        finally:
            connection.close()

    def stop(self) -> None:
        self._stop.set()
        self.join(30)


class Pin:
    """The pressure of a phase: 'idle' (a session idle in a transaction holding an XID, the
    horizon held), 'readers' (sessions in REPEATABLE READ scanning the job tables every
    second, the horizon held) or 'terminate' (the worker's and the producer's connections
    ended by pg_terminate_backend twice a second)."""

    READERS = 4
    TERMINATE_EVERY_S = 0.5

    def __init__(self, database: Database, how: str, producer: Producer) -> None:
        self.database, self.how, self.producer = database, how, producer
        self.terminated = 0
        self._stop = threading.Event()
        self._connections: list[psycopg.Connection[Any]] = []
        self._threads: list[threading.Thread] = []

    def __enter__(self) -> Pin:
        if self.how == "idle":
            conn = psycopg.connect(self.database.url)  # not autocommit: BEGIN is implicit
            conn.execute("SELECT txid_current()")  # an XID, held while the session idles
            self._connections.append(conn)
        elif self.how == "terminate":
            conn = psycopg.connect(self.database.url, autocommit=True)
            self._connections.append(conn)
            thread = threading.Thread(target=self._terminate, args=(conn,), daemon=True)
            thread.start()
            self._threads.append(thread)
        else:
            for _ in range(self.READERS):
                conn = psycopg.connect(self.database.url)
                conn.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ")
                self._connections.append(conn)
                thread = threading.Thread(target=self._read, args=(conn,), daemon=True)
                thread.start()
                self._threads.append(thread)
        return self

    def _read(self, conn: psycopg.Connection[Any]) -> None:
        while not self._stop.is_set():
            conn.execute(
                "SELECT count(*), count(DISTINCT kind), max(run_after) FROM pgjobs_job"
            ).fetchone()
            conn.execute("SELECT count(*) FROM pgjobs_dead").fetchone()
            self._stop.wait(1.0)

    def _terminate(self, conn: psycopg.Connection[Any]) -> None:
        while not self._stop.wait(self.TERMINATE_EVERY_S):
            row = conn.execute(
                "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity"
                " WHERE datname = current_database()"
                " AND (application_name = %s OR pid = %s)",
                [WORKER_APP_NAME, self.producer.pid or 0],
            ).fetchone()
            self.terminated += int(row[0]) if row else 0

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        for thread in self._threads:
            thread.join(30)
        for conn in self._connections:
            conn.rollback()
            conn.close()


def _claim_sample(worker: WorkerProcess, floors: Any) -> tuple[float, int, str]:
    """One claim's execution time (ms), shared buffers and plan (Job.objects.claim_cost):
    the claim the worker sends now, from its queues' floors while it says it reads from
    them, planned as the worker's tuned connection plans it (a generic plan)."""
    from django_pgjobs.maintenance import FLOORS_OFF, FLOORS_ON
    from django_pgjobs.models import Job

    output = worker.output()
    floors.engage(output.rfind(FLOORS_ON) > output.rfind(FLOORS_OFF))
    cost = Job.objects.claim_cost(["default"], floors=floors)
    return cost.ms, cost.buffers, cost.plan


def _table_state(database: Database) -> tuple[int, int, float]:
    """The job table's dead tuples and live rows, as the statistics have them (no scan of
    a table that the pressure bloats), and its size with its indexes (MB)."""
    with database.connect() as conn:
        row = conn.execute(
            "SELECT n_dead_tup, n_live_tup, pg_total_relation_size('pgjobs_job') / 1048576.0"
            " FROM pg_stat_user_tables WHERE relname = 'pgjobs_job'"
        ).fetchone()
    assert row is not None
    return int(row[0]), int(row[1]), float(row[2])


def _compact_mb(database: Database) -> float:
    """The size (MB) the job table's live rows take in a fresh table with its indexes."""
    with database.connect() as conn, conn.transaction():
        conn.execute(
            "CREATE TEMP TABLE pressure_compact (LIKE pgjobs_job INCLUDING INDEXES) ON COMMIT DROP"
        )
        conn.execute("INSERT INTO pressure_compact SELECT * FROM pgjobs_job")
        row = conn.execute(
            "SELECT pg_total_relation_size('pressure_compact') / 1048576.0"
        ).fetchone()
    assert row is not None
    return float(row[0])


def _read_pickups(directory: Path) -> dict[int, float]:
    started: dict[int, float] = {}
    for path in directory.glob("*.starts"):
        for line in path.read_text().splitlines():
            job_id, at = line.split()
            started.setdefault(int(job_id), float(at))
    return started


def pressure(database: Database, sizes: Sizes) -> list[Figure]:
    rate = int(os.environ.get("PGJOBS_BENCH_RATE", sizes.pressure_rate))
    pinned_s = float(os.environ.get("PGJOBS_BENCH_PINNED_S", sizes.pressure_pinned_s))
    clean_s = float(os.environ.get("PGJOBS_BENCH_CLEAN_S", sizes.pressure_clean_s))
    after_s = float(os.environ.get("PGJOBS_BENCH_AFTER_S", sizes.pressure_recovery_s))
    plan = [("clean", clean_s, None)]
    for how in sizes.pressure_pins:
        plan += [(f"pinned ({how})", pinned_s, how), (f"after {how}", after_s, None)]
    database.reset_jobs()
    print(
        f"   pressure: {rate} jobs/s through {' → '.join(f'{n} {s:.0f} s' for n, s, _ in plan)}",
        flush=True,
    )
    with tempfile.TemporaryDirectory(prefix="pgjobs-pressure-") as tally:
        worker = WorkerProcess(
            database,
            "--concurrency",
            os.environ.get("PGJOBS_BENCH_HANDLERS", str(sizes.pressure_handlers)),
            env={"PGJOBS_BENCH_PICKUP": tally},
        )
        from django_pgjobs.managers.floors import ClaimFloors

        producer = Producer(rate)
        floors = ClaimFloors("default")
        phases: list[Phase] = []
        began = time.monotonic()
        try:
            wait_for(lambda: "worker started" in worker.output(), 60, what="the worker to start")
            producer.start()
            for name, seconds, how in plan:
                phase = Phase(name, started=time.time())
                pin = Pin(database, how, producer) if how else None
                if pin:
                    pin.__enter__()
                try:
                    deadline = time.monotonic() + seconds
                    said_at, said_to = time.monotonic(), 0
                    while time.monotonic() < deadline:
                        if time.monotonic() - said_at >= PROGRESS_S:
                            recent = phase.claims[said_to:]
                            said_at, said_to = time.monotonic(), len(phase.claims)
                            _say_progress(phase, seconds, recent, producer, Path(tally))
                        ms, buffers, explained = _claim_sample(worker, floors)
                        phase.claims.append((time.monotonic() - began, ms, buffers))
                        if buffers > phase.costliest[0]:
                            phase.costliest = (buffers, explained)
                        _, live, mb = _table_state(database)
                        if mb > phase.peak_mb:
                            phase.peak_mb, phase.peak_live_rows = mb, live
                        time.sleep(
                            min(sizes.pressure_sample_s, max(0, deadline - time.monotonic()))
                        )
                        if producer.error:
                            raise producer.error
                    phase.dead_tuples, _, phase.table_mb = _table_state(database)
                    phase.live_rows = database.count()
                    phase.compact_mb = _compact_mb(database)
                finally:
                    if pin:
                        pin.__exit__()
                        phase.terminated = pin.terminated
                phase.ended = time.time()
                phases.append(phase)
                _say(phase, rate)
            producer.stop()
            if producer.error:
                raise producer.error
            offered = len(producer.committed)
            wait_for(
                lambda: len(_read_pickups(Path(tally))) >= offered,
                timeout=600,  # a backlog a long pin left drains at 1,000-2,500 jobs/s
                interval=0.5,
                what=f"the worker to start all {offered} jobs",
            )
            wait_for(lambda: database.count() == 0, timeout=60, what="the table to empty")
        finally:
            producer.stop()
            stop_all([worker])
        started = _read_pickups(Path(tally))
    lost = [job_id for job_id in producer.committed if job_id not in started]
    figures = _figures(phases, producer.committed, started, rate, lost, producer.behind_s)
    unexpected = sum(producer.unexpected.values())
    figures.append(
        Figure(
            "pressure",
            "enqueue_many failures other than OperationalError",
            unexpected,
            "batches",
            target="0",
            met=not unexpected,
            details={"failures": dict(producer.failed)},
        )
    )
    return figures


#: Seconds between two progress lines of a phase.
PROGRESS_S = 60.0


def _say_progress(
    phase: Phase,
    seconds: float,
    recent: list[tuple[float, float, int]],
    producer: Producer,
    tally: Path,
) -> None:
    """A line for the minute gone by of a long phase: its claim samples (`recent`), how
    many jobs have started of those committed, and the table's size."""
    if not recent:
        return
    print(
        f"   {phase.name:>20}: {(time.time() - phase.started) / 60:.0f} of"
        f" {seconds / 60:.0f} min; claims {statistics.mean(ms for _, ms, _ in recent):.2f} ms,"
        f" {statistics.mean(b for _, _, b in recent):.0f} buffers, at most"
        f" {max(b for _, _, b in recent)}; {len(_read_pickups(tally))} of"
        f" {len(producer.committed)} jobs started; {phase.peak_mb:.0f} MB at most",
        flush=True,
    )


def _say(phase: Phase, rate: int) -> None:
    print(
        f"   {phase.name:>20}: claim {phase.claim_ms:.2f} ms,"
        f" {phase.claim_buffers:.0f} buffers; {phase.dead_tuples} dead tuples,"
        f" {phase.table_mb:.1f} MB for {phase.live_rows} rows"
        f" ({phase.compact_mb:.2f} MB in a fresh table), at most {phase.peak_mb:.1f} MB"
        + (f"; {phase.terminated} connections terminated" if phase.terminated else ""),
        flush=True,
    )


def _against_clean(name: str, value: float, clean: float, unit: str) -> Figure:
    """A figure of a phase as a multiple of the clean phase's, which it must stay within 2x
    of."""
    return Figure(
        "pressure",
        name,
        value,
        unit,
        ceiling=clean,
        target="<= 2x clean",
        met=value <= 2 * clean,
        ratio_style="times",
    )


def _figures(
    phases: list[Phase],
    committed: dict[int, float],
    started: dict[int, float],
    rate: int,
    lost: list[int],
    behind_s: float,
) -> list[Figure]:
    figures: list[Figure] = []
    clean = phases[0]
    for phase in phases:
        span = phase.ended - phase.started
        enqueued = [i for i, at in committed.items() if phase.started <= at < phase.ended]
        done = sum(1 for at in started.values() if phase.started <= at < phase.ended)
        # A phase in which no job started reads 0 ms.
        pickups = [(started[i] - committed[i]) * 1000 for i in enqueued if i in started] or [0.0]
        details = {
            "seconds": round(span, 1),
            "offered": len(enqueued),
            "connections terminated": phase.terminated,
            "costliest claim's plan": phase.costliest[1],
            "claim samples": [(round(t, 1), round(m, 3), b) for t, m, b in phase.claims],
        }
        p99 = percentile(pickups, 0.99)
        figures += [
            Figure(
                "pressure",
                f"{phase.name}: completed",
                done / span,
                "jobs/s",
                ceiling=len(enqueued) / span,
                target=">= 99 % of offered",
                met=done >= 0.99 * len(enqueued),
                details=details,
            ),
            Figure("pressure", f"{phase.name}: pickup p50", percentile(pickups, 0.5), "ms"),
            Figure("pressure", f"{phase.name}: pickup p95", percentile(pickups, 0.95), "ms"),
            Figure(
                "pressure", f"{phase.name}: pickup p99", p99, "ms", target="<= 50 ms", met=p99 <= 50
            ),
            _against_clean(f"{phase.name}: claim time", phase.claim_ms, clean.claim_ms, "ms"),
            _against_clean(
                f"{phase.name}: claim buffers", phase.claim_buffers, clean.claim_buffers, "buffers"
            ),
            Figure(
                "pressure", f"{phase.name}: dead tuples at the end", phase.dead_tuples, "tuples"
            ),
            Figure(
                "pressure",
                f"{phase.name}: job table with indexes",
                phase.table_mb,
                "MB",
                details={"live rows": phase.live_rows},
            ),
            Figure(
                "pressure",
                f"{phase.name}: job table with indexes, at most",
                phase.peak_mb,
                "MB",
                details={"live rows then": phase.peak_live_rows},
            ),
            Figure(
                "pressure",
                f"{phase.name}: job table against its live rows in a fresh table",
                phase.table_mb / phase.compact_mb if phase.compact_mb else 0.0,
                "x",
                target="<= 10x",
                met=phase.table_mb <= 10 * phase.compact_mb,
                details={"fresh table MB": phase.compact_mb, "live rows": phase.live_rows},
            ),
        ]
        if phase.name.startswith("after"):
            back = next((t for t, _, b in phase.claims if b <= 2 * clean.claim_buffers), None)
            since = back - (phase.claims[0][0]) if back is not None else float("inf")
            figures.append(
                Figure(
                    "pressure",
                    f"{phase.name}: claim back within 2x clean after",
                    since,
                    "s",
                    target="<= 60 s",
                    met=since <= 60,
                )
            )
    figures.append(
        Figure(
            "pressure",
            "jobs lost",
            len(lost),
            "jobs",
            target="0",
            met=not lost,
            details={
                "offered": len(committed),
                "producer behind at most s": behind_s,
                "rate": rate,
            },
        )
    )
    return figures
