"""The jobs the benchmarks run."""

import os
import threading
import time
from typing import Any

from bench.models import Stamp
from django_pgjobs import Fail, job
from django_pgjobs.chaos.poison import act
from django_pgjobs.claims import JobHandle


@job(name="bench.noop")
def noop(**payload: Any) -> None:
    """Nothing at all: the queue's own cost (whatever payload the benchmark sends)."""


#: This process's tally file (opened at its first tally) and the lock that opens it once.
_tally: list[int] = []
_tally_lock = threading.Lock()


@job(name="bench.tally")
def tally(ctx: JobHandle) -> None:
    """Append this execution's job id to the process's file in $PGJOBS_BENCH_TALLY (a
    directory): the many_workers benchmark counts double claims from these lines, not
    from the queue's own bookkeeping, and without a connection per handler thread."""
    if not _tally:
        with _tally_lock:
            if not _tally:
                path = os.path.join(os.environ["PGJOBS_BENCH_TALLY"], f"{os.getpid()}.ids")
                _tally.append(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644))
    os.write(_tally[0], b"%d\n" % ctx.id)  # one small O_APPEND write: whole lines


#: This process's pickup file (the pressure benchmark), opened at its first line.
_pickups: list[int] = []


@job(name="bench.pressure")
def pressure(ctx: JobHandle) -> None:
    """A 1 ms job that first appends "id start" to the process's file in
    $PGJOBS_BENCH_PICKUP (a directory): the pressure benchmark's pickup latency, measured
    without a write to the database under pressure."""
    started = time.time()
    if not _pickups:
        with _tally_lock:
            if not _pickups:
                path = os.path.join(os.environ["PGJOBS_BENCH_PICKUP"], f"{os.getpid()}.starts")
                _pickups.append(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644))
    os.write(_pickups[0], b"%d %.6f\n" % (ctx.id, started))
    time.sleep(0.001)


@job(name="bench.stamp")
def stamp(ctx: JobHandle) -> None:
    started = time.time()
    Stamp.objects.create(job_id=ctx.id, started=started)


@job(name="bench.hold")
def hold(ctx: JobHandle, seconds: float) -> None:
    """Hold the first attempt for `seconds` (long enough to be killed); later ones return."""
    if ctx.attempt == 1:
        time.sleep(seconds)


@job(name="bench.poison", max_attempts=3, backoff=(1, 1))
def poison(how: str) -> Any:
    """A hostile handler (django_pgjobs.chaos.poison): it must end dead, the rest flow."""
    return act(how)


@job(name="bench.until_cancelled", queue="long", lease=3)
def until_cancelled(ctx: JobHandle) -> None:
    """Run until cancelled; stamp the moment the cancellation is seen (S32)."""
    while not ctx.control.wait(0.5):
        pass
    Stamp.objects.create(job_id=ctx.id, started=time.time())


@job(name="bench.async_sleep", queue="async")
async def async_sleep(seconds: float) -> None:
    """Wait on the event loop, as a remote call does."""
    import asyncio

    await asyncio.sleep(seconds)


@job(
    name="bench.keyed",
    concurrency_key=lambda payload: f"tenant:{payload['tenant']}",
    concurrency=50,
)
def keyed(tenant: int) -> None:
    """A no-op whose key's limit never binds: the keyed claim's own cost (S34)."""


@job(name="bench.noop_atomic", atomic=True)
def noop_atomic(**payload: Any) -> None:
    """Nothing, in transaction mode (S21): the handler runs inside the claim's
    transaction, which its ack commits (the capacity benchmark's third case)."""


@job(name="bench.fail")
def fail(**payload: Any) -> None:
    """Fail for good at once: a dead letter (the history benchmark's drain)."""
    raise Fail("a dead letter for the history benchmark")
