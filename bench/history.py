"""The dead-letter history at size (issue 30, S44): `history_letters` letters spread over
30 days of daily partitions; what retention costs when it drops a day's partition and
when it deletes a day's letters row by row (as before S44, and still for the default
partition and shorter retentions); the console's dead-letter pages; and drains beside
the letters (of jobs that succeed, and of jobs that all become letters) against the
same drains with no letter at all."""

from __future__ import annotations

import os
import statistics
import sys
import time
from typing import TYPE_CHECKING, Any

from bench.harness import Database, Figure

if TYPE_CHECKING:
    from bench.suite import Sizes

DAYS = 30
DAY_S = 86_400
#: Letters written per statement while filling, so that progress shows.
FILL_CHUNK = 1_000_000
#: Dead letters' ids start far past the drains' jobs (both tables hold a job's id).
ID_BASE = 10**11
SAMPLES = 20

PAST_PARTITION = """
CREATE TABLE pgjobs_dead_bench_{day} PARTITION OF pgjobs_dead
    FOR VALUES FROM (date_trunc('day', now()) - interval '{day} days')
                 TO (date_trunc('day', now()) - interval '{later} days')
"""

FILL = """
INSERT INTO pgjobs_dead (id, queue, kind, priority, run_after, attempts, max_attempts,
                         lease_s, payload, errors, created_at, reason, category, died_at,
                         last_error)
SELECT %(base)s::bigint + g, 'q' || (g %% 8), 'app.kind' || lpad((g %% 20)::text, 2, '0'), 0,
       now(), 10, 10, 60, '{"n": 1}', '[]', now() - interval '31 days',
       CASE WHEN g %% 6 = 0 THEN 'card declined: ' || g ELSE 'max attempts exceeded' END,
       CASE WHEN g %% 6 = 0 THEN 'failed' ELSE 'max_attempts' END,
       -- spread evenly over the 30 days before today
       date_trunc('day', now()) - (g::float8 / %(total)s) * interval '30 days',
       'boom'
FROM generate_series(%(first)s::bigint, %(last)s::bigint) AS g
"""


def history(database: Database, sizes: Sizes) -> list[Figure]:
    from django_pgjobs.models import DeadJob

    n = sizes.history_letters
    database.reset_jobs()
    empty = _drains(database, sizes)
    _fill(database, n)
    figures: list[Figure] = []
    per_day = n // DAYS

    # Retention, whole: the oldest day's partition goes (its upper bound is 29 days ago).
    load = os.getloadavg()[0]
    started = time.perf_counter()
    dropped = DeadJob.objects.drop_partitions((DAYS - 1) * DAY_S + 60)
    drop_ms = (time.perf_counter() - started) * 1000
    figures.append(
        Figure(
            "history",
            f"retention: drop a day's partition ({per_day:,} letters, {n:,} in all)",
            drop_ms,
            "ms",
            details={"partitions": dropped, "load_1min": round(load, 1)},
        )
    )

    # Retention, row by row (before S44): the next day's letters, in the sweeper's batches.
    from django_pgjobs.conf import pgjobs_settings

    with database.connect() as conn:
        (into_today,) = conn.execute(
            "SELECT extract(epoch FROM now() - date_trunc('day', now()))"
        ).fetchone()
    retention_s = (DAYS - 2) * DAY_S + float(into_today)  # the letters of 29 days ago
    load = os.getloadavg()[0]
    started = time.perf_counter()
    deleted = 0
    while True:
        done = DeadJob.objects.prune_outside_queues([], retention_s, pgjobs_settings.SWEEP_BATCH)
        deleted += done
        if done < pgjobs_settings.SWEEP_BATCH:
            break
    delete_s = time.perf_counter() - started
    with database.connect() as conn:
        conn.execute("SELECT pg_stat_force_next_flush()")
        (dead_tuples,) = conn.execute(
            "SELECT coalesce(sum(n_dead_tup), 0) FROM pg_stat_user_tables "
            "WHERE relname LIKE 'pgjobs_dead%%'"
        ).fetchone()
    figures.append(
        Figure(
            "history",
            f"retention: delete a day's letters row by row ({deleted:,} letters)",
            delete_s * 1000,
            "ms",
            details={
                "letters_per_s": round(deleted / delete_s) if delete_s else None,
                "dead_tuples_left_for_vacuum": int(dead_tuples),
                "batch": pgjobs_settings.SWEEP_BATCH,
                "load_1min": round(load, 1),
            },
        )
    )

    figures += _pages(n)
    beside = _drains(database, sizes)
    for name, rate in beside.items():
        figures.append(
            Figure(
                "history",
                f"{name} beside {n - per_day * 2:,} letters in {DAYS} partitions",
                rate,
                "jobs/s",
                ceiling=empty[name],
                target=">= 95% of the same drain with no letter",
                met=rate >= 0.95 * empty[name],
                details={"with_no_letter": empty[name]},
            )
        )
    database.reset_jobs()
    with database.connect() as conn:
        for (name,) in conn.execute(
            "SELECT c.relname FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid "
            "WHERE i.inhparent = 'pgjobs_dead'::regclass AND c.relname <> 'pgjobs_dead_default'"
        ).fetchall():
            conn.execute(f'DROP TABLE "{name}"')
    return figures


def _fill(database: Database, n: int) -> None:
    """Daily partitions for the last 30 days (what a month of sweeps leaves), the
    sweeper's for today and a week ahead, and `n` letters spread over the 30 days."""
    from django_pgjobs.models import DeadJob

    with database.connect() as conn:
        for day in range(DAYS, 0, -1):
            conn.execute(PAST_PARTITION.format(day=day, later=day - 1))
    DeadJob.objects.make_partitions(DAY_S)
    started = time.perf_counter()
    with database.connect() as conn:
        for first in range(1, n + 1, FILL_CHUNK):
            last = min(first + FILL_CHUNK - 1, n)
            params = {"base": ID_BASE, "first": first, "last": last, "total": n}
            conn.execute(FILL, params)
            print(
                f"   ... history: {last:,} of {n:,} letters "
                f"({time.perf_counter() - started:.0f} s)",
                file=sys.stderr,
                flush=True,
            )
        conn.execute("VACUUM ANALYZE pgjobs_dead")


def _pages(n: int) -> list[Figure]:
    """The console's dead-letter pages, as a logged-in superuser's browser asks for
    them: median of SAMPLES after a warm-up."""
    from django.contrib.auth.models import User
    from django.test import Client

    User.objects.filter(username="bench").delete()
    client = Client()
    client.force_login(User.objects.create_superuser("bench", password="bench-bench"))
    admin = "/admin/django_pgjobs/deadjob"
    some = ID_BASE + n // 2
    urls = {
        "dead letters list": f"{admin}/",
        "dead letters, reason failed": f"{admin}/?reason=failed",
        "dead letters, queue q2": f"{admin}/?queue=q2",
        "dead letters, kind app.kind03": f"{admin}/?kind=app.kind03",
        "dead letters, search an id": f"{admin}/?q={some}",
        "a dead letter's page": f"{admin}/{some}/change/",
    }
    figures = []
    for name, url in urls.items():
        assert client.get(url).status_code == 200, url
        load = os.getloadavg()[0]
        timings = []
        for _ in range(SAMPLES):
            started = time.perf_counter()
            assert client.get(url).status_code == 200, url
            timings.append(time.perf_counter() - started)
        median_ms = statistics.median(timings) * 1000
        figures.append(
            Figure(
                "history",
                f"console: {name} ({n:,} letters in {DAYS} partitions)",
                median_ms,
                "ms",
                target="<= 100 ms",
                met=median_ms <= 100,
                details={"url": url, "samples": SAMPLES, "load_1min": round(load, 1)},
            )
        )
    return figures


def _drains(database: Database, sizes: Sizes) -> dict[str, float]:
    """A drain of jobs that succeed, and one of jobs that all become dead letters."""
    from bench.suite import timed_drain
    from django_pgjobs.models import Job

    rates: dict[str, Any] = {}
    for name, kind in (
        ("drain of no-op jobs", "bench.noop"),
        ("drain to dead letters", "bench.fail"),
    ):
        with database.connect() as conn:
            conn.execute("TRUNCATE pgjobs_job")
            conn.execute("VACUUM ANALYZE pgjobs_job")
        Job.objects.enqueue_many([{"kind": kind}] * sizes.history_drain)
        rates[name] = timed_drain(database, sizes.history_drain, 1, ())
    with database.connect() as conn:
        conn.execute(f"DELETE FROM pgjobs_dead WHERE id < {ID_BASE}")  # the drain's letters
    return rates
