"""The job kinds of a chaos run. Only the run's workers import this module.

Every execution commits a ledger row (`ChaosExecution`) as it starts, at the database's
clock, then writes its result inside `ctx.fenced()` together with the ledger's "committed"
mark. Afterwards the run can tell which claims ran, which of them took effect, and when.
"""

from __future__ import annotations

from typing import Any

from django_pgjobs.chaos import poison as poisons
from django_pgjobs.chaos.invariants import LIMITED_CONCURRENCY, LIMITED_RATE, RATE_WINDOW
from django_pgjobs.chaos.models import ChaosExecution
from django_pgjobs.claims import JobHandle
from django_pgjobs.decorators import job
from django_pgjobs.exceptions import Cancelled, Fail, LeaseLost, Retry
from django_pgjobs.limits import Rate

WORK_KIND = "pgjobs.chaos.work"
KEYED_KIND = "pgjobs.chaos.keyed"
POISON_KIND = "pgjobs.chaos.poison"
LIMITED_KIND = "pgjobs.chaos.limited"
#: Short retries, so that a run drains soon after its last fault.
BACKOFF = (1, 2)
#: How soon a deliberately flaky job asks to run again.
FLAKY_RETRY_DELAY = 0.5


@job(name=WORK_KIND, backoff=BACKOFF)
def work(
    ctx: JobHandle,
    run: str,
    v: int = 0,
    sleep: float = 0.0,
    flaky: bool = False,
    doomed: bool = False,
    ghost: bool = False,
) -> dict[str, Any]:
    """A job of no key: fails its first attempt when `flaky`, every attempt when `doomed`."""
    return _execute(ctx, run=run, version=v, sleep=sleep, flaky=flaky, doomed=doomed, ghost=ghost)


@job(name=KEYED_KIND, backoff=BACKOFF)
def keyed(
    ctx: JobHandle, run: str, v: int, sleep: float = 0.0, ghost: bool = False
) -> dict[str, Any]:
    """A keyed job, re-triggered while it runs: `v` is the trigger's number."""
    return _execute(ctx, run=run, version=v, sleep=sleep, ghost=ghost)


@job(
    name=LIMITED_KIND,
    backoff=BACKOFF,
    concurrency_key=lambda payload: f"chaos-limited:{payload['run']}",
    concurrency=LIMITED_CONCURRENCY,
    rate=Rate(LIMITED_RATE, RATE_WINDOW.total_seconds()),
)
def limited(ctx: JobHandle, run: str, sleep: float = 0.0, ghost: bool = False) -> dict[str, Any]:
    """A job of the run's one concurrency key: at most LIMITED_CONCURRENCY of them run at
    once, and LIMITED_RATE of them are claimed per second, over every worker."""
    return _execute(ctx, run=run, version=0, sleep=sleep, ghost=ghost)


@job(name=POISON_KIND, backoff=BACKOFF)
def poison(ctx: JobHandle, run: str, how: str, ghost: bool = False) -> Any:
    """A hostile handler (S27): records its start, then raises or returns the poison
    `how` (chaos.poison.BEHAVIOURS). It must end dead; the workers must go on."""
    ledger = ChaosExecution.objects
    execution = ledger.record_start(ctx, run_id=run, version=0, ghost=ghost)
    ledger.record_outcome(execution, "poison", wrote=False)
    return poisons.act(how)


def _execute(
    ctx: JobHandle,
    *,
    run: str,
    version: int,
    sleep: float,
    flaky: bool = False,
    doomed: bool = False,
    ghost: bool = False,
) -> dict[str, Any]:
    ledger = ChaosExecution.objects
    execution = ledger.record_start(ctx, run_id=run, version=version, ghost=ghost)
    try:
        ctx.sleep(sleep)  # the job's work: a cancel cuts it short (S32)
    except Cancelled:
        ledger.record_outcome(execution, "cancelled", wrote=False)
        raise
    if doomed:
        ledger.record_outcome(execution, "failed", wrote=False)
        raise Fail("chaos: a doomed job")
    if flaky and ctx.attempt == 1:
        ledger.record_outcome(execution, "retried", wrote=False)
        raise Retry("chaos: a flaky first attempt", delay=FLAKY_RETRY_DELAY)
    result = {"token": str(ctx.token), "v": version}
    try:
        with ctx.fenced():
            ledger.record_outcome(execution, "committed", wrote=True)
            ctx.ack(result)
    except LeaseLost:
        ledger.record_outcome(execution, "fenced", wrote=False)
        raise
    return result
