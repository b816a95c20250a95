"""The dead-letter history at size (issue 30, S44): `history_letters` letters spread over
30 days, in partitions of PGJOBS["DEAD_PARTITION_SPAN"] as a month of sweeps leaves
them; what retention costs when it drops a partition and when it deletes a partition's
letters row by row (as before S44, and still for the default partition and shorter
retentions); the console's dead-letter pages; and drains beside the letters (of jobs
that succeed, and of jobs that all become letters) against the same drains with no
letter, taken before the letters were written and after they were gone."""

from __future__ import annotations

import math
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

#: A partition `k` spans back from the start of the current span (as the sweeper aligns
#: them: on the epoch), `span` seconds each.
PAST_PARTITION = """
CREATE TABLE pgjobs_dead_bench_{k} PARTITION OF pgjobs_dead
    FOR VALUES FROM (to_timestamp((floor(extract(epoch FROM now()) / {span}) - {k}) * {span}))
                 TO (to_timestamp((floor(extract(epoch FROM now()) / {span}) - {k} + 1) * {span}))
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
    empty_before = _drains(database, sizes)
    _fill(database, n)
    figures: list[Figure] = []
    ranges = [p for p in DeadJob.objects.partitions() if p.upper is not None]
    # The oldest partition that holds letters (those before it, if any, go with it).
    at = next(
        i for i, p in enumerate(ranges) if DeadJob.objects.filter(died_at__lt=p.upper).exists()
    )
    oldest, following = ranges[at], ranges[at + 1]
    in_oldest = DeadJob.objects.filter(died_at__lt=oldest.upper).count()

    # Retention, whole (S44): the oldest partition goes, and nothing else.
    load = os.getloadavg()[0]
    started = time.perf_counter()
    dropped = DeadJob.objects.drop_partitions(_seconds_since(database, oldest.upper))
    drop_ms = (time.perf_counter() - started) * 1000
    figures.append(
        Figure(
            "history",
            f"retention: drop a partition ({in_oldest:,} letters; {n:,} in "
            f"{len(ranges)} partitions)",
            drop_ms,
            "ms",
            details={"partitions": dropped, "load_1min": round(load, 1)},
        )
    )

    # Retention, row by row (before S44): the next partition's letters, in the sweeper's
    # batches, and the dead rows they leave for VACUUM.
    from django_pgjobs.conf import pgjobs_settings

    retention_s = _seconds_since(database, following.upper)
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
            f"retention: delete a partition's letters row by row ({deleted:,} letters)",
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
    left = n - in_oldest - deleted
    partitions = len(ranges) - dropped

    figures += _pages(left, partitions, sizes.page_samples)
    beside = _drains(database, sizes)
    database.reset_jobs()  # no letter: the same drains again, after
    empty_after = _drains(database, sizes)
    for name, rate in beside.items():
        empty = (empty_before[name] + empty_after[name]) / 2
        figures.append(
            Figure(
                "history",
                f"{name} beside {left:,} letters in {partitions} partitions",
                rate,
                "jobs/s",
                ceiling=empty,
                target=">= 95% of the same drain with no letter",
                met=rate >= 0.95 * empty,
                details={
                    "with_no_letter_before_and_after": [empty_before[name], empty_after[name]]
                },
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
    """Partitions for the last 30 days (what a month of sweeps leaves), the sweeper's for
    this span and the next, and `n` letters spread over the 30 days before today."""
    from django_pgjobs.conf import pgjobs_settings, seconds
    from django_pgjobs.models import DeadJob

    span = int(seconds(pgjobs_settings.DEAD_PARTITION_SPAN, "DEAD_PARTITION_SPAN"))
    with database.connect() as conn:
        for k in range(math.ceil(DAYS * DAY_S / span), 0, -1):
            conn.execute(PAST_PARTITION.format(k=k, span=span))
    DeadJob.objects.make_partitions(span)
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


def _seconds_since(database: Database, instant: Any) -> float:
    """Seconds from `instant` to the database's now()."""
    with database.connect() as conn:
        (since,) = conn.execute("SELECT extract(epoch FROM now() - %s)", [instant]).fetchone()
    return float(since)


def _pages(n: int, partitions: int, samples: int) -> list[Figure]:
    """The console's dead-letter pages, as a logged-in superuser's browser asks for
    them: median of `samples` after a warm-up."""
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
        for _ in range(samples):
            started = time.perf_counter()
            assert client.get(url).status_code == 200, url
            timings.append(time.perf_counter() - started)
        median_ms = statistics.median(timings) * 1000
        figures.append(
            Figure(
                "history",
                f"console: {name} ({n:,} letters in {partitions} partitions)",
                median_ms,
                "ms",
                target="<= 100 ms",
                met=median_ms <= 100,
                details={"url": url, "samples": samples, "load_1min": round(load, 1)},
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
