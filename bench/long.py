"""Benchmarks of long-running jobs (issue 21): a cancellation reaching its handler (S32),
many async handlers on one event loop, and the keyed claim's cost (S34)."""

from __future__ import annotations

import time
from pathlib import Path
from typing import TYPE_CHECKING

from bench.harness import Database, Figure, WorkerProcess, percentile, wait_for

if TYPE_CHECKING:
    from bench.suite import Sizes


def _cancel_latencies(database: Database, rounds: int, per_round: int, notify: bool) -> list[float]:
    """Milliseconds from a cancel's commit to its handler seeing it, per cancel."""
    from bench.models import Stamp
    from django_pgjobs.models import Job

    database.reset_jobs()
    env = {"PGJOBS_BENCH_NOTIFY": "1" if notify else "0"}
    worker = WorkerProcess(database, "--queue", "long", "--concurrency", str(per_round), env=env)
    cancelled: dict[int, float] = {}
    try:
        for _ in range(rounds):
            ids = [
                r.id
                for r in Job.objects.enqueue_many([{"kind": "bench.until_cancelled"}] * per_round)
            ]
            wait_for(
                lambda: database.count(where="state = 'running'") == per_round,
                timeout=60,
                what="every job running",
            )
            time.sleep(0.2)
            for job_id in ids:
                Job.objects.cancel_many([job_id])
                cancelled[job_id] = time.time()
                time.sleep(0.02 if notify else 0.1)
            wait_for(
                lambda ids=ids: Stamp.objects.filter(job_id__in=ids).count() == per_round,
                timeout=30,
                what="every handler to see its cancel",
            )
        seen = dict(Stamp.objects.values_list("job_id", "started"))
    finally:
        worker.terminate()
        worker.cleanup()
    database.reset_jobs()
    return [(seen[job_id] - at) * 1000 for job_id, at in cancelled.items()]


def cancel(database: Database, sizes: Sizes) -> list[Figure]:
    """S32: cancel -> the handler observes it, with NOTIFY and with heartbeats only
    (lease 3 s: a heartbeat every second)."""
    rounds, per_round = sizes.cancel_rounds, sizes.cancel_per_round
    figures = []
    for notify, label, bound_ms in ((True, "NOTIFY", 100.0), (False, "heartbeat only", 1000.0)):
        latencies = _cancel_latencies(database, rounds, per_round, notify)
        details = {"cancels": len(latencies), "lease_s": 3}
        p50, p99 = percentile(latencies, 0.5), percentile(latencies, 0.99)
        target = f"p99 <= {bound_ms:g} ms"
        figures += [
            Figure("cancel", f"{label}: p50", p50, "ms", details=details),
            Figure(
                "cancel",
                f"{label}: p99",
                p99,
                "ms",
                target=target,
                met=p99 <= bound_ms,
                details=details,
            ),
        ]
    return figures


def async_handlers(database: Database, sizes: Sizes) -> list[Figure]:
    """1,000 async jobs that each await asyncio.sleep(1), in one worker process."""
    from django_pgjobs.models import Job

    n = sizes.async_jobs
    database.reset_jobs()
    worker = WorkerProcess(database, "--queue", "async", "--async-concurrency", str(n))
    peak_kb = 0
    try:
        wait_for(lambda: _rss_kb(worker.pid) > 0, timeout=30, what="the worker")
        time.sleep(3)  # started and idle: its startup is not measured
        started = time.monotonic()
        Job.objects.enqueue_many([{"kind": "bench.async_sleep", "payload": {"seconds": 1}}] * n)
        while database.count() and time.monotonic() - started < 60:
            peak_kb = max(peak_kb, _rss_kb(worker.pid))
            time.sleep(0.02)
        elapsed = time.monotonic() - started
        peak_kb = max(peak_kb, _rss_kb(worker.pid))
    finally:
        worker.terminate()
        worker.cleanup()
    details = {"jobs": n, "sleep_s": 1}
    return [
        Figure(
            "async",
            f"{n} x sleep(1) done in",
            elapsed,
            "s",
            target="<= 2.5 s",
            met=elapsed <= 2.5,
            details=details,
        ),
        Figure(
            "async",
            "peak RSS",
            peak_kb / 1024,
            "MB",
            target="<= 120 MB",
            met=peak_kb / 1024 <= 120,
            details=details,
        ),
    ]


def keyed(database: Database, sizes: Sizes) -> list[Figure]:
    """S34's cost: 1 process at its defaults drains jobs of 200 keys whose limit (50)
    never binds, against as many unkeyed no-ops in the same run."""
    from django_pgjobs.models import Job

    n = sizes.keyed_jobs
    rates = {}
    for label, job in (
        ("unkeyed", {"kind": "bench.noop"}),
        ("keyed", None),
    ):
        database.reset_jobs()
        if job is None:
            Job.objects.enqueue_many(
                [{"kind": "bench.keyed", "payload": {"tenant": i % 200}} for i in range(n)]
            )
        else:
            Job.objects.enqueue_many([job] * n)
        worker = WorkerProcess(database, "--burst")
        try:
            worker.wait(300)
            window = worker.drain_window()
        finally:
            worker.cleanup()
        assert window is not None
        rates[label] = n / (window[1] - window[0])
    database.reset_jobs()
    return [
        Figure("keyed", "unkeyed drain, 1 process", rates["unkeyed"], "jobs/s"),
        Figure(
            "keyed",
            "keyed drain (200 keys), 1 process",
            rates["keyed"],
            "jobs/s",
            ceiling=rates["unkeyed"],
            details={"jobs": n, "keys": 200},
        ),
    ]


def _rss_kb(pid: int) -> int:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    except FileNotFoundError:
        return 0
    return 0
