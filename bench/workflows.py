"""Benchmarks of workflows (issue 20): what dependencies cost jobs that have none, a
chain's time per link (the wake path: each link is freed by its parent's ack), and a
fan-out of children with one fan-in job after them all."""

from __future__ import annotations

import statistics
import time
from typing import TYPE_CHECKING

from bench.harness import Database, Figure, WorkerProcess

if TYPE_CHECKING:
    from bench.suite import Sizes

#: Drains of each kind, alternated, for the with/without ratio: the best of each is
#: compared (on a shared machine the noise between rounds exceeds the difference).
DRAIN_ROUNDS = 5
#: Fan-outs and plain drains of as many jobs, alternated.
FAN_ROUNDS = 3


def _burst(
    database: Database, env: dict[str, str] | None = None, left: str = "true"
) -> tuple[float, float]:
    """Run one `runjobs --burst` to the end, which must leave no job but those `left`
    excludes; return its (first claim, last outcome)."""
    worker = WorkerProcess(database, "--burst", env=env)
    try:
        worker.wait(timeout=900)
        window = worker.drain_window()
        if window is None:
            raise RuntimeError("the worker reported no drain window:\n" + worker.output())
        remaining = database.count(where=left)
        if remaining:
            raise RuntimeError(f"{remaining} jobs were left:\n" + worker.output()[-3000:])
        return window
    finally:
        worker.cleanup()


def _independent_drain(database: Database, n: int, plain_ack: bool) -> float:
    from bench.suite import fill_runnable

    database.reset_jobs()
    fill_runnable(database, n)
    env = {"PGJOBS_BENCH_PLAIN_ACK": "1" if plain_ack else "0"}
    first, last = _burst(database, env=env)
    return n / (last - first)


def _ack_cost(database: Database, samples: int) -> tuple[list[float], list[float]]:
    """Milliseconds of one ack_batch of 100 claimed jobs without dependencies, as it is
    and without its dependency step (ACK_JOBS before S29): the same 100 claims, each
    ack rolled back to a savepoint, the two alternated `samples` times each, so that
    both share whatever else loads the machine. The ack is a part of a job's cost in a
    drain: its ratio bounds the drain's from below."""
    from django.db import transaction

    from bench.apps import ack_without_dependencies
    from bench.suite import fill_runnable
    from django_pgjobs.db import sql
    from django_pgjobs.models import Job

    with_step, without = sql.ACK_JOBS, ack_without_dependencies()
    timings: dict[str, list[float]] = {"with": [], "without": []}
    database.reset_jobs()
    fill_runnable(database, 100)
    Job.objects.tune_worker_connection()  # prepared and planned once, as a worker's
    try:
        with transaction.atomic():
            handles = Job.objects.claim_batch("default", 100, "bench-ack")
            for sample in range(2 * samples):
                # ABBA: the second ack after a rollback runs a little faster, whichever.
                variant = ("without", "with", "with", "without")[sample % 4]
                sql.ACK_JOBS = without if variant == "without" else with_step
                savepoint = transaction.savepoint()
                started = time.perf_counter()
                if Job.objects.ack_batch(handles) != len(handles):
                    raise RuntimeError("an ack of the benchmark was refused")
                timings[variant].append((time.perf_counter() - started) * 1000)
                transaction.savepoint_rollback(savepoint)
            transaction.set_rollback(True)
    finally:
        sql.ACK_JOBS = with_step
    database.reset_jobs()
    return timings["with"], timings["without"]


def _chain(database: Database, links: int) -> float:
    """Milliseconds per link of a chain of `links` no-op jobs, each after the last."""
    from django_pgjobs.workflows import workflow

    database.reset_jobs()
    with workflow() as wf:
        step = wf.add("bench.noop")
        for _ in range(links - 1):
            step = wf.add("bench.noop", after=[step])
    first, last = _burst(database)
    return (last - first) * 1000 / links


def _fresh_drain(database: Database, n: int) -> float:
    """Jobs per second of a plain drain filled as a fan-out's children are: through
    enqueue_many, straight after, statistics forgotten (what a queue has after a burst)."""
    from bench.suite import fill_as_users_do

    database.reset_jobs()
    fill_as_users_do(database, n, vacuum=False)
    first, last = _burst(database)
    return n / (last - first)


def _fan_in(database: Database, children: int) -> tuple[float, float]:
    """(children per second, ms from the last child's ack to the fan-in job's start).

    Two runs: the rate with the children deleted at ack, as independent jobs are, filled
    as _fresh_drain fills (enqueue_many, no VACUUM, statistics forgotten); the latency
    with their results retained, for the time of each ack (`finished_at`).
    """
    from bench.models import Stamp
    from django_pgjobs.models import Job

    database.reset_jobs()
    database.forget_statistics()
    database.forget_statistics("pgjobs_dependency")
    fanned = Job.objects.enqueue_many([{"kind": "bench.noop"}] * children)
    Job.objects.enqueue("bench.noop", after=fanned)
    first, last = _burst(database)
    rate = children / (last - first)
    database.reset_jobs()
    kept = Job.objects.enqueue_many([{"kind": "bench.noop", "result_retention": 3600}] * children)
    fan_in = Job.objects.enqueue("bench.stamp", after=kept)
    _burst(database, left="state <> 'done'")
    with database.connect() as conn:
        found = conn.execute(
            "SELECT extract(epoch FROM max(finished_at))::float8 FROM pgjobs_job"
            " WHERE state = 'done'"
        ).fetchone()
    assert found is not None
    started = Stamp.objects.get(job_id=fan_in.id).started
    database.reset_jobs()
    return rate, (started - float(found[0])) * 1000


def workflows(database: Database, sizes: Sizes) -> list[Figure]:
    """Independent jobs with and without the dependency code path in the ack statement;
    a chain's ms per link; a fan-out's drain rate and its fan-in's start latency."""
    n = sizes.drain
    with_rates, without_rates = [], []
    for _ in range(DRAIN_ROUNDS):
        without_rates.append(_independent_drain(database, n, plain_ack=True))
        with_rates.append(_independent_drain(database, n, plain_ack=False))
    with_rate, without_rate = max(with_rates), max(without_rates)
    acked_with, acked_without = _ack_cost(database, sizes.workflow_ack_samples)
    ack_with, ack_without = statistics.median(acked_with), statistics.median(acked_without)
    links = sizes.workflow_chain
    per_link = _chain(database, links)
    children = sizes.workflow_fan_out
    fresh_rates, child_rates = [], []
    for _ in range(FAN_ROUNDS):  # alternated, best of each, as the drains above
        fresh_rates.append(_fresh_drain(database, children))
        rate, fan_in_ms = _fan_in(database, children)
        child_rates.append(rate)
    child_rate, fresh_rate = max(child_rates), max(fresh_rates)
    ratio = with_rate / without_rate
    details = {
        "jobs": n,
        "rounds": DRAIN_ROUNDS,
        "compared": "best of each",
        "median ratio": round(statistics.median(with_rates) / statistics.median(without_rates), 3),
        "with": [round(rate) for rate in with_rates],
        "without": [round(rate) for rate in without_rates],
    }
    return [
        Figure(
            "workflows",
            "ack_batch of 100 plain jobs, with the dependency step",
            ack_with,
            "ms",
            target="<= 103 % of without (drain >= 97 %)",
            met=ack_with <= 1.03 * ack_without,
            details={
                "samples each way, alternated": len(acked_with),
                "compared": "medians",
                "without (ms, median)": round(ack_without, 4),
                "with / without": round(ack_with / ack_without, 4),
                "min with / min without": round(min(acked_with) / min(acked_without), 4),
                "ceiling": "the same ack, ACK_JOBS without its dependency step",
            },
        ),
        Figure(
            "workflows",
            "independent drain (runjobs), with the dependency path",
            with_rate,
            "jobs/s",
            ceiling=without_rate,
            target=">= 97 % of without",
            met=ratio >= 0.97,
            details={**details, "ceiling": "the same drain, ACK_JOBS without dependencies"},
        ),
        Figure(
            "workflows",
            f"chain of {links} links",
            per_link,
            "ms/link",
            target="<= 2 ms per link",
            met=per_link <= 2.0,
            details={"links": links, "worker": "1 process, default settings"},
        ),
        Figure(
            "workflows",
            f"fan-out of {children}: children drained",
            child_rate,
            "jobs/s",
            ceiling=fresh_rate,
            target=">= 80 % of the independent drain",
            met=child_rate >= 0.8 * fresh_rate,
            details={
                "children": children,
                "rounds": FAN_ROUNDS,
                "compared": "best of each",
                "ceiling": "the same number of plain jobs, filled the same way: "
                "enqueue_many, no VACUUM, statistics forgotten",
                "fan-outs (jobs/s)": [round(rate) for rate in child_rates],
                "plain drains (jobs/s)": [round(rate) for rate in fresh_rates],
                "of the vacuumed independent drain": round(child_rate / with_rate, 3),
            },
        ),
        Figure(
            "workflows",
            f"fan-in after {children}: last child's ack to its start",
            fan_in_ms,
            "ms",
            target="<= 50 ms",
            met=fan_in_ms <= 50.0,
            details={
                "children": children,
                "measured": "database clock at the last ack's transaction start to the"
                " handler's first line (time.time(), same machine)",
            },
        ),
    ]
