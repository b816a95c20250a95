"""What commit -> handler is made of (issue 17): the bare NOTIFY hop to a listening
psycopg connection, a round trip on a backend that slept against one kept busy, and a
probed worker (bench/probes.py) whose steps are timed per job: the notification read,
the loop's step to its claim, the claim statement, the hand-off to the pool, a handler
thread taking the job, and the executor up to the handler's first line."""

from __future__ import annotations

import json
import statistics
import threading
import time
import uuid
from collections import Counter
from pathlib import Path
from typing import TYPE_CHECKING

import psycopg

from bench.harness import Database, Figure, WorkerProcess, wait_for

if TYPE_CHECKING:
    from bench.suite import Sizes

#: The segments of one job's wake-up, in order, each from the previous event.
SEGMENTS = (
    ("notify", "commit -> the worker's wait returns (NOTIFY hop, select wake-up)"),
    ("loop", "-> the claim starts (the loop's bookkeeping)"),
    ("claim", "-> the claim returns (claim_for_worker: the statement's round trip + handles)"),
    ("hand_off", "-> the pool has it (pacing, submit)"),
    ("thread", "-> a handler thread's executor starts (queue hand-off, thread wake-up)"),
    ("executor", "-> the handler's first line (executor: definition, payload, context)"),
)


#: How long before its job's commit a notification read may be and still be its wake-up.
STALE_WAKE_S = 0.005


def _pct(values: list[float], p: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(p * (len(ordered) - 1)))]


def bare_notify_ms(database: Database, n: int, gap_s: float) -> list[float]:
    """NOTIFY committed on one connection -> read on another blocked in notifies()."""
    channel = f"bench_bare_{uuid.uuid4().hex[:8]}"
    received: list[float] = []
    sent: list[float] = []
    with (
        psycopg.connect(database.url, autocommit=True) as listener,
        psycopg.connect(database.url, autocommit=True) as sender,
    ):
        listener.execute(f"LISTEN {channel}")

        def listen() -> None:
            for _ in listener.notifies(timeout=n * (gap_s + 0.5) + 10, stop_after=n):
                received.append(time.time())

        thread = threading.Thread(target=listen, daemon=True)
        thread.start()
        time.sleep(0.3)
        for _ in range(n):
            sender.execute(f"NOTIFY {channel}")
            sent.append(time.time())
            time.sleep(gap_s)
        thread.join(timeout=30)
    return [(got - at) * 1000 for at, got in zip(sent, received, strict=True)]


def round_trips_ms(database: Database, n: int, gap_s: float) -> dict[str, float]:
    """Median `SELECT 1`, and claim_batch of one job (then its ack), back to back and
    after `gap_s` of sleep: what a backend (and a client) that slept costs."""
    from django.db import connection

    from django_pgjobs.models import Job

    medians = {}
    with psycopg.connect(database.url, autocommit=True) as conn:
        for label, gap in (("busy", 0.0), ("idle", gap_s)):
            timings = []
            for _ in range(n):
                if gap:
                    time.sleep(gap)
                started = time.perf_counter()
                conn.execute("SELECT 1").fetchone()
                timings.append(time.perf_counter() - started)
            medians[f"SELECT 1, {label}"] = statistics.median(timings) * 1000
    database.reset_jobs()
    connection.ensure_connection()
    for label, gap in (("busy", 0.0), ("idle", gap_s)):
        Job.objects.enqueue_many([{"kind": "bench.noop"}] * n)
        timings = []
        for _ in range(n):
            if gap:
                time.sleep(gap)
            started = time.perf_counter()
            handles = Job.objects.claim_batch("default", 1, "bench-claimer")
            timings.append(time.perf_counter() - started)
            for handle in handles:
                handle.ack()
        medians[f"claim_batch of 1, {label}"] = statistics.median(timings) * 1000
    database.reset_jobs()
    return medians


def probed_worker(
    database: Database, n: int, gap_s: float
) -> tuple[dict[str, list[float]], dict[str, int]]:
    """An idle probed worker; `n` single enqueues; each job's segments in ms."""
    from django.db import transaction

    from bench.models import Stamp
    from django_pgjobs.models import Job

    database.reset_jobs()
    probes = Path(f"/tmp/pgjobs-bench-probes-{uuid.uuid4().hex[:8]}.jsonl")
    worker = WorkerProcess(database, env={"PGJOBS_BENCH_PROBES": str(probes)})
    try:
        with transaction.atomic():  # one job first, not measured: the worker is up
            Job.objects.enqueue("bench.stamp")
        wait_for(lambda: Stamp.objects.count() >= 1, timeout=60, what="the worker")
        time.sleep(0.5)
        committed: dict[int, float] = {}
        for _ in range(n):
            with transaction.atomic():
                job_id = Job.objects.enqueue("bench.stamp").id
            committed[job_id] = time.time()
            time.sleep(gap_s)
        wait_for(lambda: Stamp.objects.count() >= n + 1, timeout=60, what="every stamp")
        started = dict(Stamp.objects.values_list("job_id", "started"))
    finally:
        worker.terminate()
        worker.cleanup()
    events = [json.loads(line) for line in probes.read_text().splitlines()]
    probes.unlink(missing_ok=True)
    database.reset_jobs()
    return segments(events, committed, started), claim_statements(events)


def segments(
    events: list[list[object]], committed: dict[int, float], started: dict[int, float]
) -> dict[str, list[float]]:
    """Per segment name, each job's milliseconds; jobs not woken by a notification read
    after their commit (claimed by a loop that was awake anyway) are left out."""
    found: dict[str, list[float]] = {name: [] for name, _ in SEGMENTS}
    found["total"] = []
    found["statements"] = []
    for job_id, commit_at in committed.items():
        at: dict[str, float] = {}
        claim_sql: list[object] = []
        for index, (kind, moment, ids) in enumerate(events):
            if kind == "claim_end" and job_id in ids:  # type: ignore[operator]
                at["claim_end"] = moment  # type: ignore[assignment]
                before = events[:index]
                claim_sql = [
                    e[0]
                    for e in before[_last_index(before, "claim_start") :]
                    if str(e[0]).startswith("sql ")
                ]
                starts = [e for e in before if e[0] == "claim_start"]
                wakes = [e for e in before if e[0] == "woke" and e[2]]
                if starts:
                    at["claim_start"] = starts[-1][1]  # type: ignore[assignment]
                if wakes:
                    at["woke"] = wakes[-1][1]  # type: ignore[assignment]
            elif kind in ("submit", "executor_start") and job_id in ids:  # type: ignore[operator]
                at.setdefault(str(kind), moment)  # type: ignore[arg-type]
        at["handler"] = started.get(job_id, 0.0)
        order = ["woke", "claim_start", "claim_end", "submit", "executor_start", "handler"]
        # The notification can reach the worker before the enqueuer has its COMMIT's
        # reply (commit_at is taken then): a negative first segment is real. A wake-up
        # read well before the commit belongs to another job: that claim came from a
        # loop that was awake anyway.
        if any(name not in at for name in order) or at["woke"] < commit_at - STALE_WAKE_S:
            continue
        previous = commit_at
        for (name, _), event in zip(SEGMENTS, order, strict=True):
            found[name].append((at[event] - previous) * 1000)
            previous = at[event]
        found["total"].append((at["handler"] - commit_at) * 1000)
        found["statements"].append(float(len(claim_sql)))
    return found


def claim_statements(events: list[list[object]]) -> dict[str, int]:
    """How often each sequence of statements ran inside one claim of the loop."""
    counts: Counter[str] = Counter()
    inside: list[str] | None = None
    for kind, _, _ in events:
        if kind == "claim_start":
            inside = []
        elif kind == "claim_end" and inside is not None:
            counts[" + ".join(inside) or "(none)"] += 1
            inside = None
        elif inside is not None and str(kind).startswith("sql "):
            inside.append(str(kind)[4:])
    return dict(counts.most_common())


def _last_index(events: list[list[object]], kind: str) -> int:
    for index in range(len(events) - 1, -1, -1):
        if events[index][0] == kind:
            return index
    return 0


def wake_parts(database: Database, sizes: Sizes) -> list[Figure]:
    n, gap = sizes.wake_jobs, sizes.wake_gap_s
    figures = []
    details = {"samples": n, "gap_ms": gap * 1000}
    for jobs, gap_s, when in (
        (n, gap, ""),
        (sizes.wake_slow_jobs, sizes.wake_slow_gap_s, f"{sizes.wake_slow_gap_s:g} s apart, "),
    ):
        bare = bare_notify_ms(database, jobs, gap_s)
        figures.append(
            Figure(
                "wake parts",
                f"{when}bare NOTIFY -> a listening psycopg connection, p50",
                _pct(bare, 0.5),
                "ms",
                details={"samples": jobs, "gap_ms": gap_s * 1000, "p99": _pct(bare, 0.99)},
            )
        )
    for name, value in round_trips_ms(database, n, gap).items():
        figures.append(Figure("wake parts", f"{name}, median", value, "ms", details=details))
    for jobs, gap_s, when in (
        (n, gap, ""),
        (sizes.wake_slow_jobs, sizes.wake_slow_gap_s, f"{sizes.wake_slow_gap_s:g} s apart, "),
    ):
        parts, statements = probed_worker(database, jobs, gap_s)
        woken = len(parts["total"])
        if not woken:
            raise RuntimeError(
                "the probed worker's events matched no job woken by a notification: do "
                "bench/probes.py's wrapped methods still exist under those names?"
            )
        run = {"jobs": jobs, "gap_ms": gap_s * 1000, "jobs woken by a notification": woken}
        for name, label in (*SEGMENTS, ("total", "commit -> handler, probed worker")):
            values = parts[name]
            figures.append(
                Figure(
                    "wake parts",
                    f"{when}{name}: {label}, p50",
                    _pct(values, 0.5),
                    "ms",
                    details={**run, "p99": round(_pct(values, 0.99), 3)},
                )
            )
        values = parts["statements"]
        figures.append(
            Figure(
                "wake parts",
                f"{when}statements per wake-up claim, mean",
                statistics.mean(values),
                "statements",
                details={**run, "statements inside the claim": statements},
            )
        )
    return figures
