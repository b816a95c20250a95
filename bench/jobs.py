"""The jobs the benchmarks run."""

import time
from typing import Any

from bench.models import Stamp
from django_pgjobs import job
from django_pgjobs.chaos.poison import act
from django_pgjobs.claims import JobHandle


@job(name="bench.noop")
def noop(**payload: Any) -> None:
    """Nothing at all: the queue's own cost (whatever payload the benchmark sends)."""


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
