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


@job(name="tests.gate")
def gate(name: str) -> None:
    """Hold a handler thread until the test opens the gate `name` (30 s at most)."""
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
