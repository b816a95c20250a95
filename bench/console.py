"""Benchmarks of the operator's console (issues 19 and 29): every page of it, as a
logged-in superuser's browser asks for it, with `console_rows` live and as many dead rows
in 8 queues (10 M + 10 M at full size), a batch of `console_batch` members, and a week of
the workers' per-minute and per-hour counts; and what the worker registry's heartbeat
costs a drain."""

from __future__ import annotations

import os
import statistics
import sys
import time
from typing import TYPE_CHECKING

from bench.harness import Database, Figure

if TYPE_CHECKING:
    from bench.suite import Sizes

#: Samples per page (the issue's median of 20).
TARGET_MS = 100
#: Queues and kinds the rows spread over.
QUEUES = 8
KINDS = 20
#: Rows written per statement while filling, so that progress shows.
FILL_CHUNK = 1_000_000
#: Dead letters' ids start past the live ones' (both tables hold a job's id).
DEAD_ID_BASE = 10**11

FILL_LIVE = """
INSERT INTO pgjobs_job (queue, kind, state, priority, run_after, attempts, max_attempts,
                        lease_s, payload, errors, created_at, claimed_by, claimed_at,
                        claimed_until, worker_id, finished_at, started_at)
SELECT 'q' || (g %% 8), 'app.kind' || lpad((g %% 20)::text, 2, '0'), s.state, 0,
       now() + CASE WHEN s.state = 'pending' AND g %% 3 = 0 THEN interval '1 day'
                    ELSE interval '0' END,
       CASE WHEN s.state = 'pending' AND g %% 7 = 0 THEN 1
            WHEN s.state = 'pending' THEN 0 ELSE 1 END, 10, 60,
       '{"n": 1}', '[]', now() - interval '1 hour',
       CASE WHEN s.state = 'running' THEN gen_random_uuid() END,
       CASE WHEN s.state <> 'pending' THEN now() - interval '1 minute' END,
       CASE WHEN s.state = 'running' THEN now() + interval '1 hour' END,
       CASE WHEN s.state <> 'pending' THEN 'bench:1:console' END,
       CASE WHEN s.state = 'done' THEN now() END,
       CASE WHEN s.state <> 'pending' THEN now() - interval '1 minute' END
FROM generate_series(%(first)s::bigint, %(last)s::bigint) AS g
CROSS JOIN LATERAL (
    SELECT CASE WHEN g %% 100 = 0 THEN 'running' WHEN g %% 100 = 1 THEN 'done'
                ELSE 'pending' END AS state
) AS s
"""

FILL_DEAD = """
INSERT INTO pgjobs_dead (id, queue, kind, priority, run_after, attempts, max_attempts,
                         lease_s, payload, errors, created_at, reason, category, died_at,
                         last_error)
SELECT %(base)s::bigint + g, 'q' || (g %% 8), 'app.kind' || lpad((g %% 20)::text, 2, '0'), 0,
       now(), 10, 10, 60, '{"n": 1}', '[]', now() - interval '2 days',
       CASE c.category WHEN 'failed' THEN 'card declined: ' || g
                       WHEN 'max_attempts' THEN 'max attempts exceeded'
                       WHEN 'expired' THEN 'expired'
                       ELSE c.category END,
       c.category, now() - g * interval '50 ms', 'boom'
FROM generate_series(%(first)s::bigint, %(last)s::bigint) AS g
CROSS JOIN LATERAL (
    SELECT (ARRAY['failed', 'max_attempts', 'max_attempts', 'expired', 'cancelled',
                  'unknown_kind'])[1 + g %% 6] AS category
) AS c
"""

FILL_BATCH = """
WITH batch AS (
    INSERT INTO pgjobs_batch (state, members) VALUES ('sealed', %(members)s) RETURNING id
),
callback AS (
    INSERT INTO pgjobs_job (queue, kind, state, max_attempts, lease_s, payload, errors,
                            has_parents, parents_left)
    VALUES ('q0', 'app.batch_done', 'waiting', 10, 60, '{}', '[]', true, %(members)s)
    RETURNING id
),
registered AS (
    INSERT INTO pgjobs_batch_callback (job_id, batch_id, fires_on)
    SELECT callback.id, batch.id, 'complete' FROM callback, batch
),
members AS (
    INSERT INTO pgjobs_job (queue, kind, state, max_attempts, lease_s, payload, errors,
                            has_children)
    SELECT 'q' || (g %% 8), 'app.member', 'pending', 10, 60, '{}', '[]', true
    FROM generate_series(1, %(members)s::int) AS g
    RETURNING id
)
INSERT INTO pgjobs_dependency (child_id, parent_id, on_failure)
SELECT callback.id, members.id, 'run' FROM callback, members
RETURNING (SELECT id FROM batch), parent_id
"""

FILL_STATS = """
-- A day of per-minute histograms for every queue and kind, as the workers write them.
WITH pairs AS (  -- each pair, and the sums per queue, per kind and over all ('*')
    SELECT coalesce('q' || q, '*') AS queue,
           coalesce('app.kind' || lpad(k::text, 2, '0'), '*') AS kind
    FROM (SELECT generate_series(0, 7) UNION ALL SELECT NULL) AS qs(q),
         (SELECT generate_series(0, 19) UNION ALL SELECT NULL) AS ks(k)
),
hist AS (SELECT '[5, 9, 20, 30, 20, 9, 4, 2, 1, 0, 0, 0, 0, 0, 0, 0, 0]'::jsonb AS h)
INSERT INTO pgjobs_kind_stats (minute, queue, kind, runs, wait_hist, run_hist)
SELECT date_trunc('minute', now()) - m * interval '1 minute', p.queue, p.kind, 100, h, h
FROM pairs AS p, hist, generate_series(0, 24 * 60 - 1) AS m
"""

FILL_STATS_HOURS = """
WITH pairs AS (  -- each pair, and the sums per queue, per kind and over all ('*')
    SELECT coalesce('q' || q, '*') AS queue,
           coalesce('app.kind' || lpad(k::text, 2, '0'), '*') AS kind
    FROM (SELECT generate_series(0, 7) UNION ALL SELECT NULL) AS qs(q),
         (SELECT generate_series(0, 19) UNION ALL SELECT NULL) AS ks(k)
),
hist AS (SELECT '[300, 540, 1200, 1800, 1200, 540, 240, 120, 60, 0, 0, 0, 0, 0, 0, 0, 0]'::jsonb
                AS h)
INSERT INTO pgjobs_kind_stats_hour (hour, queue, kind, runs, wait_hist, run_hist)
SELECT date_trunc('hour', now()) - (h0 + 1) * interval '1 hour', p.queue, p.kind, 6000, h, h
FROM pairs AS p, hist, generate_series(0, 7 * 24) AS h0
"""

FILL_THROUGHPUT = """
INSERT INTO pgjobs_stats (minute, queue, succeeded, retried, dead, cancelled)
SELECT date_trunc('minute', now()) - m * interval '1 minute', 'q' || q, 2000, 30, 5, 1
FROM generate_series(0, 24 * 60 - 1) AS m, generate_series(0, 7) AS q
"""

FILL_THROUGHPUT_HOURS = """
INSERT INTO pgjobs_stats_hour (hour, queue, succeeded, retried, dead, cancelled)
SELECT date_trunc('hour', now()) - (h + 1) * interval '1 hour', 'q' || q, 120000, 1800, 300, 60
FROM generate_series(0, 7 * 24) AS h, generate_series(0, 7) AS q
"""


def fill(database: Database, sizes: Sizes) -> dict[str, int]:
    """The console's tables at their size, with progress on stderr; returns the ids
    the pages are asked about."""
    n = sizes.console_rows
    started = time.monotonic()

    def say(text: str) -> None:
        print(f"  console: {text} ({time.monotonic() - started:.0f} s)", file=sys.stderr)

    database.reset_jobs()
    with database.connect() as conn:
        conn.execute(
            "TRUNCATE pgjobs_batch, pgjobs_batch_callback, pgjobs_kind_stats, "
            "pgjobs_kind_stats_hour, pgjobs_stats, pgjobs_stats_hour, pgjobs_worker"
        )
        conn.execute("SET synchronous_commit = off")
        conn.execute("SET maintenance_work_mem = '1GB'")
        for table, statement, extra in (
            ("live", FILL_LIVE, {}),
            ("dead", FILL_DEAD, {"base": DEAD_ID_BASE}),
        ):
            for first in range(1, n + 1, FILL_CHUNK):
                last = min(first + FILL_CHUNK - 1, n)
                conn.execute(statement, {"first": first, "last": last, **extra})
                say(f"{last:,} of {n:,} {table} rows")
        rows = conn.execute(FILL_BATCH, {"members": sizes.console_batch}).fetchall()
        batch_id = rows[0][0]
        members = sorted(member for _, member in rows)
        say(f"a batch of {len(members):,} members")
        for statement in (FILL_STATS, FILL_STATS_HOURS, FILL_THROUGHPUT, FILL_THROUGHPUT_HOURS):
            conn.execute(statement)
        # As autovacuum leaves tables that grew: analyzed, their visibility maps set.
        for table in (
            "pgjobs_job", "pgjobs_dead", "pgjobs_dependency", "pgjobs_batch",
            "pgjobs_kind_stats", "pgjobs_kind_stats_hour", "pgjobs_stats", "pgjobs_stats_hour",
        ):  # fmt: skip
            conn.execute(f"VACUUM ANALYZE {table}")
        say("vacuumed and analyzed")
        running = conn.execute(
            "SELECT id FROM pgjobs_job WHERE state = 'running' ORDER BY id DESC LIMIT 1"
        ).fetchone()
    return {
        "batch": batch_id,
        "deep_member": members[-51],
        "running": running[0] if running else 1,
        "dead": DEAD_ID_BASE + n // 2,
    }


def pages(database: Database, sizes: Sizes) -> list[Figure]:
    """Median time of each console page, as a logged-in superuser's browser asks for it."""
    from django.contrib.auth.models import User
    from django.db import connection
    from django.test import Client

    ids = fill(database, sizes)
    User.objects.filter(username="bench").delete()
    client = Client()
    client.force_login(User.objects.create_superuser("bench", password="bench-bench"))
    admin = "/admin/django_pgjobs"
    urls = {
        "dashboard JSON": f"{admin}/dashboard/data/",
        "dashboard page, last hour": f"{admin}/dashboard/",
        "dashboard page, last day": f"{admin}/dashboard/?span=day",
        "dashboard page, last week": f"{admin}/dashboard/?span=week",
        "dashboard JSON, week of one queue and kind": (
            f"{admin}/dashboard/data/?span=week&queue=q3&kind=app.kind07"
        ),
        "jobs list": f"{admin}/job/",
        "jobs list, running": f"{admin}/job/?state__exact=running",
        "jobs list, done (kept)": f"{admin}/job/?state__exact=done",
        "jobs list, queue q1 runnable": f"{admin}/job/?queue=q1&readiness=runnable",
        "jobs list, retrying": f"{admin}/job/?readiness=retrying",
        "jobs list, kind app.kind07": f"{admin}/job/?kind=app.kind07",
        "jobs list, a kind with no job": f"{admin}/job/?kind=app.none",
        "jobs list, search 'app.kind07'": f"{admin}/job/?q=app.kind07",
        "jobs list, search an id": f"{admin}/job/?q={ids['running']}",
        "dead letters list": f"{admin}/deadjob/",
        "dead letters, reason failed": f"{admin}/deadjob/?reason=failed",
        "dead letters, reason expired, queue q2": f"{admin}/deadjob/?reason=expired&queue=q2",
        "dead letters, kind app.kind03": f"{admin}/deadjob/?kind=app.kind03",
        "dead letters, a kind with none": f"{admin}/deadjob/?kind=app.none",
        "dead letters, search 'app.kind03'": f"{admin}/deadjob/?q=app.kind03",
        "a running job's page": f"{admin}/job/{ids['running']}/change/",
        "a dead letter's page": f"{admin}/deadjob/{ids['dead']}/change/",
        "the batch's page": f"{admin}/batch/{ids['batch']}/change/",
        "the batch's last page of members": (
            f"{admin}/batch/{ids['batch']}/change/?after={ids['deep_member']}"
        ),
        "batches list": f"{admin}/batch/",
        "queues list": f"{admin}/queuecontrol/",
        "workers list": f"{admin}/worker/",
    }
    figures = []
    for name, url in urls.items():
        # Warm, as a running site is, counting the statements (each request starts
        # Django's query log afresh).
        connection.force_debug_cursor = True
        try:
            started = time.perf_counter()
            assert client.get(url).status_code == 200, url
            first_ms = (time.perf_counter() - started) * 1000  # cold: what it keeps, unkept
            statements = len(connection.queries_log)
        finally:
            connection.force_debug_cursor = False
        timings = []
        load_before = os.getloadavg()[0]
        for _ in range(sizes.page_samples):
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
                f"{name} ({sizes.console_rows:,} live + {sizes.console_rows:,} dead rows)",
                median_ms,
                "ms",
                target=f"<= {TARGET_MS} ms",
                met=median_ms <= TARGET_MS,
                details={
                    "url": url,
                    "samples": sizes.page_samples,
                    "first_ms": first_ms,
                    "min_ms": min(timings) * 1000,
                    "max_ms": max(timings) * 1000,
                    "statements": statements,
                    "load_1min": load,
                    "batch_members": sizes.console_batch,
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
