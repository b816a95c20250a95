"""Read what the database holds of a chaos run.

A census of its jobs for the progress bar, and at the end the evidence the invariants
judge: the ledger of executions and every job's final row, next to what the run did.
"""

from __future__ import annotations

from collections import Counter
from typing import Any

from django_pgjobs.chaos.config import Progress
from django_pgjobs.chaos.facts import BatchEnd, Evidence, FinalJob
from django_pgjobs.chaos.models import ChaosExecution
from django_pgjobs.chaos.state import RunState


def read_progress(state: RunState, phase: str, elapsed: float, total: float) -> Progress:
    """Count the run's jobs by state, for a progress report."""
    census = state.database(
        lambda: ChaosExecution.objects.census(state.queue, using=state.alias), "counting jobs"
    )
    return Progress(
        phase=phase,
        elapsed=elapsed,
        total=total,
        enqueued=len(state.ledger.committed),
        finished=census.get("done", 0) + census.get("dead", 0),
        waiting=census.get("pending", 0) + census.get("running", 0),
        faults=Counter(fault.kind for fault in state.ledger.faults),
    )


def read_evidence(state: RunState) -> Evidence:
    """Gather the executions, the jobs' final rows and what the run did, for the judgement."""
    manager = ChaosExecution.objects
    ledger = state.ledger
    executions = state.database(
        lambda: manager.of_run(state.run_id, using=state.alias), "reading the ledger"
    )
    rows = state.database(
        lambda: manager.final_rows(state.queue, using=state.alias), "reading the jobs"
    )
    final = {row["id"]: _final_job(row) for row in rows}
    committed = {
        job_id: key for job_id, key in ledger.committed.items() if job_id not in ledger.uncertain
    }
    batch_ends = state.database(
        lambda: manager.batch_ends([b.id for b in ledger.batches], using=state.alias),
        "reading the batches",
    )
    return Evidence(
        executions=executions,
        committed=committed,
        last_triggers=dict(ledger.last_triggers),
        ghosts=set(ledger.ghosts),
        faults=list(ledger.faults),
        final=final,
        uncertain=set(ledger.uncertain),
        uncertain_keys=set(ledger.uncertain_keys),
        worker_exits=list(ledger.worker_exits),
        cancelled=dict(ledger.cancelled),
        limited=set(ledger.limited),
        chains=list(ledger.chains),
        batches=list(ledger.batches),
        batch_ends={batch_id: BatchEnd(*end) for batch_id, end in batch_ends.items()},
        pins=list(ledger.pins),
    )


def _final_job(row: dict[str, Any]) -> FinalJob:
    """A job's final state, from its row (live or dead)."""
    payload = row["payload"]
    version = payload.get("v", 0) if isinstance(payload, dict) else None
    return FinalJob(
        id=row["id"],
        key=row["key"],
        state=row["state"],
        version=version,
        result=row["result"],
        reason=row.get("reason"),
        poison=isinstance(payload, dict) and "how" in payload,
    )
