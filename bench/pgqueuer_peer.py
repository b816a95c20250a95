"""PgQueuer's side of `python -m bench --peers`: runs inside PgQueuer's own venv
(bench/.peers/pgqueuer-<version>/), never in the project's. No Django here.

    python pgqueuer_peer.py install           # PgQueuer's own schema (Queries.install)
    python pgqueuer_peer.py reset             # empty its tables, VACUUM ANALYZE them
    python pgqueuer_peer.py fill N            # N no-op jobs through its bulk enqueue
    python pgqueuer_peer.py window            # the drain's first pick .. last success
    python pgqueuer_peer.py trickle N GAP_S   # N single enqueues, one every GAP_S seconds
    python pgqueuer_peer.py rates N M         # N single enqueues, then M in bulk: jobs/s
    pgq run pgqueuer_peer:factory --mode drain --batch-size B   # its worker, as users run it

The DSN comes from PGDSN (PgQueuer's own variable); stamps of the `stamp` handler go to
the file $PEER_STAMPS ("job_id wall_clock" per line), commit times of `trickle` to stdout.
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import asyncpg
from pgqueuer import PgQueuer
from pgqueuer.db import AsyncpgDriver
from pgqueuer.models import Job
from pgqueuer.queries import Queries

#: Rows of one bulk enqueue (one statement each; PgQueuer sends arrays).
FILL_CHUNK = 10_000


async def _connect() -> asyncpg.Connection:
    return await asyncpg.connect(os.environ["PGDSN"])


@asynccontextmanager
async def factory() -> AsyncIterator[PgQueuer]:
    """The worker `pgq run` starts: a no-op and a stamping entrypoint."""
    connection = await _connect()
    pgq = PgQueuer(AsyncpgDriver(connection))
    stamps_path = os.environ.get("PEER_STAMPS")
    stamps = open(stamps_path, "a", buffering=1) if stamps_path else None  # noqa: SIM115

    @pgq.entrypoint("noop")
    async def noop(job: Job) -> None:
        """Nothing at all: the queue's own cost."""

    @pgq.entrypoint("stamp")
    async def stamp(job: Job) -> None:
        started = time.time()
        if stamps is not None:
            stamps.write(f"{job.id} {started}\n")

    try:
        yield pgq
    finally:
        if stamps is not None:
            stamps.close()
        await connection.close()


async def install() -> None:
    connection = await _connect()
    try:
        queries = Queries(AsyncpgDriver(connection))
        if not await queries.schema_is_installed():
            await queries.install()
    finally:
        await connection.close()


async def reset() -> None:
    """Empty the queue and its logs and drop their planner statistics: the fresh table
    the project's own drain starts from (bench.harness.Database.forget_statistics)."""
    connection = await _connect()
    try:
        await connection.execute("TRUNCATE pgqueuer, pgqueuer_log, pgqueuer_statistics")
        await connection.execute("VACUUM ANALYZE pgqueuer")
        await connection.execute("VACUUM ANALYZE pgqueuer_log")
        await connection.execute(
            "DELETE FROM pg_statistic WHERE starelid IN ('pgqueuer'::regclass,"
            " 'pgqueuer_log'::regclass)"
        )
    finally:
        await connection.close()


async def fill(n: int) -> None:
    connection = await _connect()
    try:
        queries = Queries(AsyncpgDriver(connection))
        for first in range(0, n, FILL_CHUNK):
            size = min(FILL_CHUNK, n - first)
            await queries.enqueue(["noop"] * size, [None] * size, [0] * size)
    finally:
        await connection.close()


async def window() -> None:
    """Print {"first_pick", "last_success", "successful"}: epoch seconds on the server's
    clock, from PgQueuer's own log table."""
    connection = await _connect()
    try:
        row = await connection.fetchrow(
            "SELECT extract(epoch FROM min(created) FILTER (WHERE status = 'picked')),"
            " extract(epoch FROM max(created) FILTER (WHERE status = 'successful')),"
            " count(*) FILTER (WHERE status = 'successful')"
            " FROM pgqueuer_log WHERE entrypoint = 'noop'"
        )
        print(
            json.dumps(
                {"first_pick": float(row[0]), "last_success": float(row[1]), "successful": row[2]}
            )
        )
    finally:
        await connection.close()


async def trickle(n: int, gap_s: float) -> None:
    """Enqueue `n` stamp jobs one at a time (each its own transaction: asyncpg outside a
    transaction block autocommits); print {job id: commit wall clock}."""
    connection = await _connect()
    try:
        queries = Queries(AsyncpgDriver(connection))
        committed = {}
        for _ in range(n):
            (job_id,) = await queries.enqueue("stamp", None)
            committed[int(job_id)] = time.time()
            await asyncio.sleep(gap_s)
        print(json.dumps(committed))
    finally:
        await connection.close()


async def rates(singles: int, bulk: int) -> None:
    """Print {"single", "bulk"}: jobs per second of `singles` enqueues one at a time (each
    its own transaction, as `trickle`), then of `bulk` jobs through its bulk enqueue in
    chunks of FILL_CHUNK, as `fill`."""
    connection = await _connect()
    try:
        queries = Queries(AsyncpgDriver(connection))
        started = time.perf_counter()
        for _ in range(singles):
            await queries.enqueue("noop", None)
        single = singles / (time.perf_counter() - started)
        started = time.perf_counter()
        for first in range(0, bulk, FILL_CHUNK):
            size = min(FILL_CHUNK, bulk - first)
            await queries.enqueue(["noop"] * size, [None] * size, [0] * size)
        print(json.dumps({"single": single, "bulk": bulk / (time.perf_counter() - started)}))
    finally:
        await connection.close()


def main(argv: list[str]) -> int:
    command, *args = argv
    if command == "install":
        asyncio.run(install())
    elif command == "reset":
        asyncio.run(reset())
    elif command == "fill":
        asyncio.run(fill(int(args[0])))
    elif command == "window":
        asyncio.run(window())
    elif command == "trickle":
        asyncio.run(trickle(int(args[0]), float(args[1])))
    elif command == "rates":
        asyncio.run(rates(int(args[0]), int(args[1])))
    else:
        raise SystemExit(f"unknown command {command!r}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
