"""Jobs the tests run, discovered like any app's jobs.py."""

from __future__ import annotations

import asyncio
import os
import threading
import time
from collections import defaultdict
from typing import Any

from django_pgjobs import Fail, Retry, job
from django_pgjobs.claims import JobHandle
from tests.models import Note


def _note(ctx: JobHandle, text: str) -> None:
    Note.objects.create(
        text=text, job_id=ctx.id, token=ctx.token, attempt=ctx.attempt, worker=ctx.worker_id
    )


@job(name="tests.record")
def record(ctx: JobHandle, label: str = "", sleep: float = 0) -> str:
    """Record this execution (job id, claim token, attempt, worker), then sleep."""
    _note(ctx, label)
    if sleep:
        time.sleep(sleep)
    return label


#: Backends of this database other than the caller's waiting for a lock right now.
LOCK_WAITS = """
SELECT count(*) FROM pg_stat_activity
WHERE datname = current_database() AND wait_event_type = 'Lock' AND pid <> pg_backend_pid()
"""


@job(name="tests.note_lock_waits")
def note_lock_waits(ctx: JobHandle) -> None:
    """Record how many other backends wait for a lock as this job starts."""
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute(LOCK_WAITS)
        (waiting,) = cursor.fetchone()
    _note(ctx, f"lock waits {waiting}")


@job(name="tests.record_then_fail")
def record_then_fail(ctx: JobHandle, label: str = "") -> None:
    """Record this execution, then fail for good: a dead letter at once."""
    _note(ctx, label)
    raise Fail("recorded, then failed")


@job(name="tests.fenced_record")
def fenced_record(ctx: JobHandle, label: str = "", sleep: float = 0) -> None:
    """Sleep (the slow remote call), then write the result under the fence and ack."""
    if sleep:
        time.sleep(sleep)
    with ctx.fenced():
        _note(ctx, label)
        ctx.ack()


#: Gates a test opens to let its tests.gate jobs finish (workers running in-process).
GATES: defaultdict[str, threading.Event] = defaultdict(threading.Event)
#: Set when a tests.gate job of that name starts to wait: its thread is held.
AT_GATE: defaultdict[str, threading.Event] = defaultdict(threading.Event)


@job(name="tests.gate")
def gate(name: str) -> None:
    """Hold a handler thread until the test opens the gate `name` (30 s at most)."""
    AT_GATE[name].set()
    GATES[name].wait(30)


@job(name="tests.plain")
def plain(value: int = 0) -> int:
    """A handler that does not ask for the context."""
    return value * 2


@job(name="tests.noop")
def noop() -> None:
    return None


@job(name="tests.misbehave", max_attempts=3)
def misbehave(ctx: JobHandle, how: str) -> Any:
    if how == "retry":
        raise Retry("not yet", delay=30)
    if how == "fail":
        raise Fail("hopeless")
    if how == "error":
        raise ValueError("bad value")
    if how == "non_json":
        return {"when": object()}
    if how == "exit":
        raise SystemExit(3)
    return "fine"


@job(name="tests.atomic_write", atomic=True, max_attempts=2)
def atomic_write(ctx: JobHandle, text: str, crash: bool = False, error: bool = False) -> None:
    """Transaction mode: the note and the job's deletion commit together, or neither."""
    _note(ctx, text)
    if crash:
        os._exit(17)  # the worker dies mid-transaction: PostgreSQL rolls it back
    if error:
        raise RuntimeError("rolled back")


@job(name="tests.async_double")
async def async_double(ctx: JobHandle, value: int) -> int:
    await asyncio.sleep(0.01)
    return value * 2


@job(name="tests.crash_worker")
def crash_worker(ctx: JobHandle) -> None:
    """Kill the worker process mid-job, as an OOM kill would."""
    _note(ctx, "crashing")
    os._exit(9)


@job(name="tests.keyed", key=lambda payload: f"account:{payload['account']}")
def keyed(ctx: JobHandle, account: int, version: int) -> None:
    _note(ctx, f"{account}:{version}")


@job(name="tests.self_renewing", atomic=True, key=lambda payload: "self-renewing")
def self_renewing(ctx: JobHandle, left: int) -> None:
    """Enqueue its own next run, under its key, while it runs: a trigger on itself."""
    _note(ctx, str(left))
    if left > 0:
        self_renewing.enqueue(left=left - 1)


@job(name="tests.failover_effect", queue="failover", atomic=True, lease=5, max_attempts=50,
     backoff=(1, 2))  # fmt: skip
def failover_effect(ctx: JobHandle, n: int, pause: float = 0.02) -> None:
    """Transaction mode: its note (text n) and its completion commit together (S36)."""
    time.sleep(pause)
    _note(ctx, str(n))


@job(name="tests.slow_first")
def slow_first(ctx: JobHandle, seconds: float) -> None:
    """Record, then take `seconds` on the first attempt only (long enough to be killed)."""
    _note(ctx, "start")
    if ctx.attempt == 1:
        time.sleep(seconds)


#: What each tests.poison job does, by job id: a callable set by the test before a worker
#: of this process runs the job (the workers of these tests run in-process).
POISON: dict[int, Any] = {}


@job(name="tests.poison", queue="poison", max_attempts=2, backoff=(1, 1))
def poison(ctx: JobHandle) -> Any:
    """Raise or return whatever the test chose for this job: the hostile handler."""
    return POISON[ctx.id](ctx)


@job(name="tests.shaped")
def shaped(a: int, b: int = 1, *, c: int) -> int:
    """A handler with a required, an optional and a keyword-only argument (S28)."""
    return a + b + c


@job(name="tests.chain")
def chain(ctx: JobHandle, left: int) -> int:
    """Enqueue the next link until `left` is 0: a job that makes work for the next round."""
    if left:
        chain.enqueue(left=left - 1)
    _note(ctx, f"chain {left}")
    return left


# Long-running jobs (S32-S35) -----------------------------------------------------------


@job(name="tests.cooperative", queue="long", lease=30)
def cooperative(ctx: JobHandle, seconds: float = 30) -> str:
    """Work in small steps until cancelled (noting when it saw the cancellation)."""
    _note(ctx, "started")
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if ctx.cancelled:
            _note(ctx, f"saw cancel: {ctx.control.reason}")
            ctx.raise_if_cancelled()
        time.sleep(0.002)
    return "ran out"


@job(name="tests.stubborn", queue="long", timeout=0.5, max_attempts=2, backoff=(1, 1))
def stubborn(ctx: JobHandle, seconds: float = 2) -> None:
    """Ignore every request to stop; then try to write its result under the fence."""
    _note(ctx, "started")
    time.sleep(seconds)
    with ctx.fenced():
        _note(ctx, "late write")
        ctx.ack()


@job(name="tests.async_sleep", queue="async")
async def async_sleep(ctx: JobHandle, seconds: float = 1) -> float:
    await asyncio.sleep(seconds)
    return seconds


@job(name="tests.async_cancellable", queue="long", timeout=30)
async def async_cancellable(ctx: JobHandle, seconds: float = 30) -> str:
    """Await a long time; note the CancelledError that a cancel or timeout brings."""
    from asgiref.sync import sync_to_async

    await sync_to_async(_note)(ctx, "started")
    try:
        await asyncio.sleep(seconds)
    except asyncio.CancelledError:
        await sync_to_async(_note)(ctx, f"cancelled: {ctx.control.reason}")
        raise
    return "slept"


@job(name="tests.async_fenced", queue="async")
async def async_fenced(ctx: JobHandle, text: str, fail: bool = False) -> None:
    """Write a note with the async ORM inside the fence, and ack with it."""
    async with ctx.afenced():
        await Note.objects.acreate(text=text, job_id=ctx.id, token=ctx.token)
        if fail:
            raise RuntimeError("rolled back with the fence")
        await ctx.aack("fenced")


@job(name="tests.progressing", queue="long")
def progressing(ctx: JobHandle, steps: int = 5, pause: float = 0.3) -> int:
    for step in range(1, steps + 1):
        ctx.progress(step / steps, f"step {step} of {steps}", step=step)
        time.sleep(pause)
    return steps


@job(
    name="tests.tenant",
    queue="tenants",
    concurrency_key=lambda payload: f"tenant:{payload['tenant']}",
    concurrency=2,
)
def tenant(ctx: JobHandle, tenant: str, seconds: float = 0.0, n: int = 0) -> None:
    """Record its start and its end by the database's clock (each note's created_at),
    inside the time its claim holds a slot: at most 2 per tenant at once (S34)."""
    _note(ctx, f"{tenant} start")
    if seconds:
        time.sleep(seconds)
    _note(ctx, f"{tenant} end")


@job(
    name="tests.rated",
    queue="tenants",
    concurrency_key=lambda payload: payload["key"],
    rate="5/s",
)
def rated(ctx: JobHandle, key: str) -> None:
    """Record its claim time by the database's clock: at most 5 per second per key."""
    Note.objects.create(text=ctx.claimed_at.isoformat(), job_id=ctx.id, token=ctx.token, worker=key)


@job(name="tests.fenced_waiter", queue="long")
def fenced_waiter(ctx: JobHandle, seconds: float = 10) -> None:
    """Hold the job's row in a fence until cancelled: the cancel can only tell it."""
    with ctx.fenced():
        _note(ctx, "inside the fence")
        ctx.sleep(seconds)  # raises Cancelled when told; the fence rolls back


@job(name="tests.atomic_waiter", queue="long", atomic=True)
def atomic_waiter(ctx: JobHandle, seconds: float = 10) -> None:
    """Transaction mode, waiting until cancelled: its note is rolled back with it."""
    _note(ctx, "inside the transaction")
    ctx.sleep(seconds)


@job(name="tests.atomic_slow_sql", queue="long", atomic=True, timeout=0.5, max_attempts=2)
def atomic_slow_sql(ctx: JobHandle) -> None:
    """Transaction mode with a statement longer than its timeout."""
    from django.db import connection

    _note(ctx, "before the slow statement")
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_sleep(5)")


def _hostile_key(payload: dict[str, Any]) -> Any:
    """The key a property test chose, spelled as its repr (None, ints, floats, text...)."""
    import ast

    text = payload["value"]
    try:
        return ast.literal_eval(text)
    except (ValueError, SyntaxError):
        return float(text) if text in ("nan", "inf", "-inf") else text


@job(name="tests.hostile_key", concurrency_key=_hostile_key, concurrency=1)
def hostile_key(value: str) -> None:
    return None


@job(name="tests.claim_time")
def claim_time(ctx: JobHandle) -> None:
    """Record its claim time by the database's clock (a queue's rate, S35)."""
    Note.objects.create(text=ctx.claimed_at.isoformat(), job_id=ctx.id, token=ctx.token)


@job(name="tests.bad_key", concurrency_key=lambda payload: 1 // payload["n"], concurrency=1)
def bad_key(n: int) -> None:
    return None


@job(name="tests.fan_out")
def fan_out(ctx: JobHandle, depth: int, width: int = 2) -> int:
    """A batch's member that adds `width` siblings one level shallower while it runs
    (dynamic fan-out, S31), down to depth 0."""
    from django_pgjobs.batches import add_to_batch

    _note(ctx, f"member depth={depth}")
    if depth > 0:
        found = ctx.batch()
        assert found is not None
        for _ in range(width):
            add_to_batch(found.id, "tests.fan_out", depth=depth - 1, width=width)
    return depth


@job(name="tests.batch_report")
def batch_report(ctx: JobHandle, label: str) -> None:
    """A batch's callback: notes how its batch ended, as it reads it, and how many of its
    members' results it can read."""
    found = ctx.batch()
    assert found is not None
    results = ctx.parent_results()
    _note(
        ctx,
        f"{label} batch={found.id} state={found.state} members={found.members} "
        f"done={found.done} failed={found.failed} results={len(results)}",
    )


@job(name="tests.fenced_acker", queue="long", lease=2)
def fenced_acker(ctx: JobHandle, seconds: float = 1.0) -> None:
    """Write and ack inside a fence after a sleep that no cancel cuts short (S38)."""
    with ctx.fenced():
        _note(ctx, "inside the fence")
        time.sleep(seconds)
        _note(ctx, "committed with the ack")
        ctx.ack()


@job(name="tests.atomic_sleeper", queue="long", atomic=True, lease=2)
def atomic_sleeper(ctx: JobHandle, seconds: float = 1.0) -> None:
    """Transaction mode, sleeping through any cancel, then writing (S38, S39)."""
    time.sleep(seconds)
    _note(ctx, "committed with the ack")


@job(name="tests.patient", queue="long", lease=3)
def patient(ctx: JobHandle, seconds: float = 30.0) -> None:
    """Wait until cancelled (S32), noting that it was told."""
    _note(ctx, "started")
    try:
        ctx.sleep(seconds)
    except Exception:
        _note(ctx, f"told: {ctx.control.reason}")
        raise


@job(
    name="tests.locked_tenant",
    queue="long",
    lease=2,
    concurrency_key=lambda payload: f"locked:{payload['tenant']}",
    concurrency=1,
)
def locked_tenant(ctx: JobHandle, tenant: str, seconds: float = 0.0, how: str = "fence") -> None:
    """Hold its row longer than its lease, in a fence or as a plain sleep (S39)."""
    _note(ctx, f"{tenant} start")
    if how == "fence":
        with ctx.fenced():
            time.sleep(seconds)
            ctx.ack()
    else:
        time.sleep(seconds)
    _note(ctx, f"{tenant} end")


@job(
    name="tests.atomic_tenant",
    queue="long",
    atomic=True,
    lease=2,
    concurrency_key=lambda payload: f"locked:{payload['tenant']}",
    concurrency=1,
)
def atomic_tenant(ctx: JobHandle, tenant: str, seconds: float = 0.0) -> None:
    """Transaction mode longer than its lease (S39): one note, committed with the job,
    holding its start and end by the database's clock."""
    from django.db import connection

    def clock() -> str:
        with connection.cursor() as cursor:
            cursor.execute("SELECT clock_timestamp()")
            (moment,) = cursor.fetchone()
        return str(moment.isoformat())

    started = clock()
    time.sleep(seconds)
    Note.objects.create(
        text=f"{tenant} {started} {clock()}", job_id=ctx.id, token=ctx.token, attempt=ctx.attempt
    )


@job(name="tests.atomic_three_statements", queue="long", atomic=True, timeout=2, max_attempts=1)
def atomic_three_statements(ctx: JobHandle) -> None:
    """Transaction mode: three 1.5 s statements under a 2 s timeout (S39)."""
    from django.db import connection

    for n in range(3):
        with connection.cursor() as cursor:
            cursor.execute("SELECT pg_sleep(1.5)")
        _note(ctx, f"statement {n} done")


@job(name="tests.atomic_python_hang", queue="long", atomic=True, timeout=1, max_attempts=1)
def atomic_python_hang(ctx: JobHandle, seconds: float = 6.0) -> None:
    """Transaction mode, holding its transaction in Python code past its timeout."""
    _note(ctx, "before the hang")
    time.sleep(seconds)


@job(name="tests.atomic_connection_lost", queue="long", atomic=True, max_attempts=1)
def atomic_connection_lost(ctx: JobHandle) -> None:
    """Transaction mode, whose own connection is ended under it (S27, S39)."""
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_terminate_backend(pg_backend_pid())")


@job(
    name="tests.async_tenant",
    queue="mixed",
    concurrency_key=lambda payload: f"async:{payload['tenant']}",
    concurrency=1,
)
async def async_tenant(ctx: JobHandle, tenant: str) -> None:
    """An async job with a concurrency key (S34): claimed into the event loop's places."""
    from asgiref.sync import sync_to_async

    await asyncio.sleep(0.05)
    await sync_to_async(_note)(ctx, f"{tenant} async")


# The dead letters' categories (tests/combinations/test_dead_categories.py).
@job(name="tests.categories.fail_with_message", queue="categories")
def fail_with_message(ctx: JobHandle) -> None:
    raise Fail("the customer closed their account")


@job(name="tests.categories.fail_bare", queue="categories")
def fail_bare(ctx: JobHandle) -> None:
    raise Fail()


@job(name="tests.categories.always_broken", queue="categories", max_attempts=1)
def always_broken(ctx: JobHandle) -> None:
    raise ValueError("remote said no")


@job(name="tests.categories.not_json", queue="categories")
def not_json(ctx: JobHandle) -> Any:
    return {"when": object()}


@job(name="tests.categories.needs_x", queue="categories")
def needs_x(x: int) -> None:
    return None
