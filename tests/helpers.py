"""Test helpers: time moved in the database, separate connections, threads."""

from __future__ import annotations

import json
import re
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any, TypeVar

import psycopg
from django.db import connection, connections, transaction

T = TypeVar("T")


def execute(statement: str, params: Any = None) -> list[tuple[Any, ...]]:
    """Run SQL on Django's connection and return its rows (an empty list if none)."""
    with connection.cursor() as cursor:
        cursor.execute(statement, params)
        return list(cursor.fetchall()) if cursor.description else []


def scalar(statement: str, params: Any = None) -> Any:
    rows = execute(statement, params)
    return rows[0][0] if rows else None


JSON_COLUMNS = frozenset({"payload", "result", "errors", "rerun_payload", "progress"})


def row(job_id: int, *columns: str, table: str = "pgjobs_job") -> tuple[Any, ...] | None:
    """Read columns of a job straight from its table, jsonb columns decoded; with no
    columns, its id (None: no such row)."""
    columns = columns or ("id",)
    rows = execute(f"SELECT {', '.join(columns)} FROM {table} WHERE id = %s", [job_id])
    if not rows:
        return None
    return tuple(
        json.loads(value) if name in JSON_COLUMNS and isinstance(value, str) else value
        for name, value in zip(columns, rows[0], strict=True)
    )


def reads_index(plan: str, index: str) -> bool:
    """Whether an EXPLAIN `plan` reads `index` or one of its partitions' indexes (the
    dead-letter table's partitions each have their own, S44): an index scan ("using
    <index> on") or a bitmap of it ("Bitmap Index Scan on <index>")."""
    names = [index, *(name for (name,) in execute(PARTITION_INDEXES, [index]))]
    alternatives = "|".join(re.escape(name) for name in names)
    return re.search(rf"(using|Bitmap Index Scan on) ({alternatives})\b", plan) is not None


def drop_dead_range_partitions() -> None:
    """Drop every range partition of the dead-letter table, letters and all (S44): the
    default partition takes what comes next until a sweep makes them again."""
    from django_pgjobs.models import DeadJob

    for partition in DeadJob.objects.partitions():
        if partition.upper is not None:
            execute(f'DROP TABLE IF EXISTS "{partition.name}"')


PARTITION_INDEXES = """
SELECT c.relname FROM pg_inherits AS i JOIN pg_class AS c ON c.oid = i.inhrelid
WHERE i.inhparent = to_regclass(%s)
"""


def dead_row(job_id: int, *columns: str) -> tuple[Any, ...] | None:
    return row(job_id, *columns, table="pgjobs_dead")


def count(table: str = "pgjobs_job", where: str = "true", params: Any = None) -> int:
    return int(scalar(f"SELECT count(*) FROM {table} WHERE {where}", params))


def record_cancel_request(job_id: int, token: Any = None, reason: str = "cancelled") -> None:
    """Write a cancel request (S38) as a cancel of a held row does, by hand: naming the
    claim `token` (None: a claim that is not the job's, a random one)."""
    execute(
        "INSERT INTO pgjobs_cancel_request (job_id, claimed_by, reason, requested_at) "
        "VALUES (%s, coalesce(%s, gen_random_uuid()), %s, now())",
        [job_id, token, reason],
    )


def lapse(job_id: int) -> None:
    """Make a claim's lease lapse, as if its worker had died a while ago."""
    execute(
        "UPDATE pgjobs_job SET claimed_until = now() - interval '1 second' WHERE id = %s",
        [job_id],
    )


def make_due(job_id: int) -> None:
    """Make a scheduled job runnable now."""
    execute("UPDATE pgjobs_job SET run_after = now() - interval '1 second' WHERE id = %s", [job_id])


def seconds_from_now(column: str, job_id: int, table: str = "pgjobs_job") -> float:
    return float(
        scalar(f"SELECT extract(epoch FROM {column} - now()) FROM {table} WHERE id = %s", [job_id])
    )


def wait_until(condition: Callable[[], bool], timeout: float = 10, interval: float = 0.02) -> None:
    """Poll `condition` until it holds; fail the test after `timeout` seconds."""
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"condition not met within {timeout} s")
        time.sleep(interval)


def conninfo() -> dict[str, Any]:
    """Connection arguments of the test database, for connections Django does not own."""
    settings = connection.settings_dict
    params = {
        "dbname": settings["NAME"],
        "user": settings["USER"] or None,
        "password": settings["PASSWORD"] or None,
        "host": settings["HOST"] or None,
        "port": settings["PORT"] or None,
    }
    return {key: value for key, value in params.items() if value is not None}


@contextmanager
def other_connection(autocommit: bool = True) -> Iterator[psycopg.Connection[Any]]:
    """A second, independent connection to the test database."""
    conn = psycopg.connect(**conninfo(), autocommit=autocommit)
    try:
        yield conn
    finally:
        conn.close()


def run_threads(count_: int, target: Callable[[int], T], timeout: float = 120) -> list[T]:
    """Run `target(i)` in `count_` threads at once (released together); return results.

    Each thread uses its own Django connection and closes it at the end. An exception
    in any thread is re-raised here.
    """
    barrier = threading.Barrier(count_)
    results: list[Any] = [None] * count_
    errors: list[BaseException] = []

    def run(index: int) -> None:
        try:
            barrier.wait(timeout=30)
            results[index] = target(index)
        except BaseException as error:
            errors.append(error)
        finally:
            connections.close_all()

    threads = [threading.Thread(target=run, args=(i,), daemon=True) for i in range(count_)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout)
        if thread.is_alive():
            raise TimeoutError(f"a test thread did not finish within {timeout} s")
    if errors:
        raise errors[0]
    return results


def drain(**options: Any) -> Any:
    """Run a burst worker in this thread until the runnable jobs are done."""
    from django_pgjobs.worker import Worker

    options.setdefault("concurrency", 4)
    worker = Worker(burst=True, sweep_interval=0, poll_interval=0.2, **options)
    assert worker.run() == 0
    return worker


@contextmanager
def running_worker(**options: Any) -> Iterator[Any]:
    """A worker running in a background thread, stopped at the end."""
    from django_pgjobs.worker import Worker

    options.setdefault("concurrency", 2)
    options.setdefault("sweep_interval", 0)
    worker = Worker(**options)
    thread = threading.Thread(target=worker.run, daemon=True)
    thread.start()
    try:
        yield worker
    finally:
        worker.stop()
        thread.join(15)
        assert not thread.is_alive()


@contextmanager
def row_held(*job_ids: int) -> Iterator[None]:
    """A request's transaction, on a thread of its own, holding the jobs' rows `FOR
    UPDATE` until the block ends; what the request raised is raised after it."""
    locked, release = threading.Event(), threading.Event()
    errors: list[BaseException] = []

    def request() -> None:
        try:
            with transaction.atomic():
                execute("SELECT 1 FROM pgjobs_job WHERE id = ANY(%s) FOR UPDATE", [list(job_ids)])
                locked.set()
                release.wait(10)
        except BaseException as error:
            errors.append(error)
        finally:
            connections.close_all()

    thread = threading.Thread(target=request, daemon=True)
    thread.start()
    assert locked.wait(5), errors
    try:
        yield
    finally:
        release.set()
        thread.join(10)
    if errors:
        raise errors[0]
