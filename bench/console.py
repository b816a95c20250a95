"""Benchmarks of the operator's console (issue 19): the dashboard's JSON and the lists
with 1 M live and 1 M dead rows in 4 queues, and what the worker registry's heartbeat
costs a drain."""

from __future__ import annotations

import os
import statistics
import time
from typing import TYPE_CHECKING

from bench.harness import Database, Figure

if TYPE_CHECKING:
    from bench.suite import Sizes

#: Samples per page (the issue's median of 20).
SAMPLES = 20
TARGET_MS = 100


def pages(database: Database, sizes: Sizes) -> list[Figure]:
    """Median time of each console page, as a logged-in superuser's browser asks for it."""
    from django.contrib.auth.models import User
    from django.db import connection
    from django.test import Client

    from bench.suite import INSERT_DEAD, INSERT_MIXED

    database.reset_jobs()
    with database.connect() as conn:
        conn.execute(INSERT_MIXED, {"n": sizes.counts_rows})
        conn.execute(INSERT_DEAD.replace("'default'", "'q' || (g %% 4)"), {"n": sizes.counts_rows})
        conn.execute("VACUUM ANALYZE pgjobs_job")
        conn.execute("VACUUM ANALYZE pgjobs_dead")
    User.objects.filter(username="bench").delete()
    client = Client()
    client.force_login(User.objects.create_superuser("bench", password="bench-bench"))
    urls = {
        "dashboard JSON": "/admin/django_pgjobs/dashboard/data/",
        "dashboard page": "/admin/django_pgjobs/dashboard/",
        "jobs list": "/admin/django_pgjobs/job/",
        "jobs list, queue q1 runnable": "/admin/django_pgjobs/job/?queue=q1&readiness=runnable",
        "jobs list, search 'bench.'": "/admin/django_pgjobs/job/?q=bench.",
        "dead letters list": "/admin/django_pgjobs/deadjob/",
        "dead letters, reason category": "/admin/django_pgjobs/deadjob/?reason=max_attempts",
        "dead letters, search 'bench.'": "/admin/django_pgjobs/deadjob/?q=bench.",
    }
    figures = []
    for name, url in urls.items():
        # Warm, as a running site is, counting the statements (each request starts
        # Django's query log afresh).
        connection.force_debug_cursor = True
        try:
            assert client.get(url).status_code == 200, url
            statements = len(connection.queries_log)
        finally:
            connection.force_debug_cursor = False
        timings = []
        load_before = os.getloadavg()[0]
        for _ in range(SAMPLES):
            started = time.perf_counter()
            response = client.get(url)
            timings.append(time.perf_counter() - started)
            assert response.status_code == 200, url
        median_ms = statistics.median(timings) * 1000
        # The machine's 1-minute load around the samples: a shared machine's figures
        # are read beside it.
        load = (round(load_before, 1), round(os.getloadavg()[0], 1))
        figures.append(
            Figure(
                "console",
                f"{name} with {sizes.counts_rows:,} live + {sizes.counts_rows:,} dead rows",
                median_ms,
                "ms",
                target=f"<= {TARGET_MS} ms",
                met=median_ms <= TARGET_MS,
                details={
                    "url": url,
                    "samples": SAMPLES,
                    "min_ms": min(timings) * 1000,
                    "max_ms": max(timings) * 1000,
                    "statements": statements,
                    "load_1min": load,
                },
            )
        )
    database.reset_jobs()
    return figures


def registry_drain(database: Database, sizes: Sizes) -> list[Figure]:
    """The drain of one default worker with the registry heartbeating every 0.1 s (50
    times the default) against every hour (one registration), alternated 3 times."""
    from bench.suite import fill_runnable, timed_drain

    n = sizes.drain
    rates: dict[str, list[float]] = {"0.1": [], "3600": []}
    for _ in range(3):
        for heartbeat in rates:
            database.reset_jobs()
            fill_runnable(database, n)
            rates[heartbeat].append(
                timed_drain(database, n, 1, (), env={"PGJOBS_BENCH_HEARTBEAT": heartbeat})
            )
    database.reset_jobs()
    busy, idle = statistics.median(rates["0.1"]), statistics.median(rates["3600"])
    return [
        Figure(
            "registry",
            "drain, 1 process, heartbeat every 0.1 s (median of 3)",
            busy,
            "jobs/s",
            ceiling=idle,
            target=">= 97 % of the drain without heartbeats",
            met=busy >= 0.97 * idle,
            details={"jobs": n, "runs": [round(r) for r in rates["0.1"]]},
        ),
        Figure(
            "registry",
            "drain, 1 process, heartbeat every hour (median of 3)",
            idle,
            "jobs/s",
            details={"jobs": n, "runs": [round(r) for r in rates["3600"]]},
        ),
    ]
