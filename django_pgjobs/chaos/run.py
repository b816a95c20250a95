"""A chaos run: workers on a scratch queue, a stream of jobs, faults at random, a verdict.

The run starts `runjobs` processes on a queue of its own, enqueues plain jobs and keyed
jobs it re-triggers while they run, and for a set time injects faults: `kill -9` of a
worker, SIGSTOP past the lease then SIGCONT, `pg_terminate_backend` of a worker's
connections, bursts of enqueues in transactions that roll back, and (when allowed) a
PostgreSQL restart. Then it lets the queue drain, stops the workers and judges what the
database holds against what it did (`invariants.judge`).

`ChaosRun` orchestrates those phases; its parts live in `processes` (the workers), `load`
(the job stream), `faults` (injecting them), `evidence` (reading the database at the end)
and share one `state.RunState`.
"""

from __future__ import annotations

import contextlib
import time
import uuid
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from random import Random

from django.db import DatabaseError

from django_pgjobs.chaos import invariants
from django_pgjobs.chaos.config import (
    DEFAULT_FAULTS,
    FAULT_KINDS,
    ChaosAborted,
    ChaosConfig,
    ChaosReport,
    Progress,
)
from django_pgjobs.chaos.evidence import read_evidence, read_progress
from django_pgjobs.chaos.faults import Faults
from django_pgjobs.chaos.load import LOCK_WAIT_S, Load
from django_pgjobs.chaos.models import ChaosExecution
from django_pgjobs.chaos.processes import Workers
from django_pgjobs.chaos.state import RunState
from django_pgjobs.conf import pgjobs_settings

# What callers imported from here before the run was split into its parts.
__all__ = [
    "DEFAULT_FAULTS",
    "FAULT_KINDS",
    "LOCK_WAIT_S",
    "ChaosAborted",
    "ChaosConfig",
    "ChaosReport",
    "ChaosRun",
    "Progress",
]

#: Seconds between two passes of the run's loop.
TICK_S = 0.05
#: Seconds between two progress reports (each one counts the queue's rows).
PROGRESS_S = 0.5


class ChaosRun:
    """One run; `run()` does it all and returns the report."""

    def __init__(
        self,
        config: ChaosConfig,
        *,
        on_progress: Callable[[Progress], None] | None = None,
        on_event: Callable[[str], None] | None = None,
    ) -> None:
        if "pin" in config.faults and not pgjobs_settings.VACUUM_INTERVAL:
            raise ChaosAborted(
                "A pin judges the claim floors that the workers' table care engages, and "
                "PGJOBS['VACUUM_INTERVAL'] = 0 turns it off: set it above 0, or leave 'pin' "
                "out of --faults."
            )
        self.config = config
        self.run_id = uuid.uuid4().hex[:8]
        self.queue = f"chaos.{self.run_id}"
        self.on_progress = on_progress or (lambda progress: None)
        self.state = RunState(
            config=config,
            run_id=self.run_id,
            queue=self.queue,
            alias=pgjobs_settings.DATABASE,
            random=Random(config.seed),
            on_event=on_event or (lambda message: None),
        )
        self.ledger = self.state.ledger
        self.workers = Workers(self.state)
        self.log_dir = self.workers.log_dir
        self.load = Load(self.state)
        self.faults = Faults(self.state, self.workers, self.load)

    def run(self) -> ChaosReport:
        """Start the workers, load and fault them, drain, stop them, and judge the evidence."""
        started = time.monotonic()
        self._check_database()
        passed = False
        try:
            for worker in self.workers.slots:
                self.workers.start(worker)
            self.load.enqueue_plain(self.config.jobs)
            self._inject_faults()
            drain_s = self._drain()
            self.workers.stop()
            self.on_progress(read_progress(self.state, "check", 0, 0))
            evidence = read_evidence(self.state)
            verdicts = invariants.judge(evidence)
            passed = all(verdict.holds for verdict in verdicts)
            return ChaosReport(
                run_id=self.run_id,
                queue=self.queue,
                config=self.config,
                verdicts=verdicts,
                jobs=len(self.ledger.committed),
                triggers=self.ledger.triggers,
                chains=len(self.ledger.chains),
                batches=Counter(end.state for end in evidence.batch_ends.values()),
                busy_triggers=self.ledger.skipped_busy,
                ghosts=len(self.ledger.ghosts),
                executions=len(evidence.executions),
                reruns=invariants.count_reruns(evidence),
                faults=Counter(fault.kind for fault in self.ledger.faults),
                missed_faults=self.ledger.missed,
                dead=Counter(
                    job.reason or "?" for job in evidence.final.values() if job.state == "dead"
                ),
                drain_s=drain_s,
                seconds=time.monotonic() - started,
                log_dir=None if passed and not self.config.keep else self.log_dir,
                pins=list(evidence.pins),
            )
        finally:
            self.faults.drop_pin()
            self.workers.kill()
            if not self.config.keep:
                self._forget()
            if passed and not self.config.keep:
                _remove_tree(self.log_dir)

    # The tests enqueue keyed triggers through these, one at a time.
    def _key(self, index: int) -> str:
        return self.load.key(index)

    def _trigger(self, index: int) -> None:
        self.load.trigger(index)

    def _forget(self) -> None:
        """Delete the run's rows: its ledger and its jobs, live and dead."""
        for _ in range(2):
            try:
                batches = [written.id for written in self.state.ledger.batches]
                ChaosExecution.objects.forget_run(
                    self.run_id, self.queue, batches, using=self.state.alias
                )
                return
            except DatabaseError:
                self.state.reconnect()
        self.state.on_event(
            f"could not delete the run's rows: delete the jobs of queue {self.queue} and the "
            f"pgjobs_chaos_execution rows of run {self.run_id} by hand"
        )

    def _check_database(self) -> None:
        """Fail early, with what to do, when the run's tables are missing."""
        alias = self.state.alias
        try:
            ChaosExecution.objects.census(self.queue, using=alias)
            ChaosExecution.objects.of_run(self.run_id, using=alias)
        except DatabaseError as error:
            raise ChaosAborted(
                f"The jobs database '{alias}' is not ready: "
                f"{str(error).strip().splitlines()[0]}. "
                "Run: python manage.py migrate django_pgjobs"
            ) from None

    def _inject_faults(self) -> None:
        """For the run's duration, enqueue at the set rates and inject faults at random."""
        config = self.config
        began = time.monotonic()
        deadline = began + config.duration
        next_fault = began + self.faults.gap()
        next_progress = began
        owed_plain = owed_triggers = owed_limited = owed_workflows = 0.0
        last = began
        while (now := time.monotonic()) < deadline:
            owed_plain += (now - last) * config.rate
            owed_triggers += (now - last) * config.triggers if config.keys else 0.0
            owed_limited += (now - last) * config.limited
            owed_workflows += (now - last) * config.workflows
            last = now
            while owed_workflows >= 1:
                self.load.enqueue_workflow()
                owed_workflows -= 1
            if owed_limited >= 1:
                self.load.enqueue_limited(int(owed_limited))
                owed_limited -= int(owed_limited)
            if owed_plain >= 1:
                self.load.enqueue_plain(int(owed_plain))
                owed_plain -= int(owed_plain)
            while owed_triggers >= 1:
                self.load.trigger(self.state.random.randrange(config.keys))
                owed_triggers -= 1
            self.faults.resume_due()
            self.faults.release_due()
            self.workers.watch()
            if now >= next_fault and config.faults:
                self.faults.inject()
                next_fault = time.monotonic() + self.faults.gap()
            if now >= next_progress:
                progress = read_progress(self.state, "faults", now - began, config.duration)
                self.on_progress(progress)
                next_progress = now + PROGRESS_S
            time.sleep(TICK_S)
        self.faults.resume_all()
        self.faults.release_all()

    def _drain(self) -> float | None:
        """Wait until nothing of the run is pending or running.

        Return the seconds that took after the last fault (None: it never drained within
        the timeout).
        """
        began = time.monotonic()
        deadline = began + self.config.drain_timeout
        while True:
            self.workers.watch()
            now = time.monotonic()
            progress = read_progress(self.state, "drain", now - began, self.config.drain_timeout)
            self.on_progress(progress)
            if progress.waiting == 0:
                return time.monotonic() - (self.faults.last_fault or began)
            if now > deadline:
                self.state.on_event(
                    f"{progress.waiting} jobs still pending or running after "
                    f"{self.config.drain_timeout:g} s of drain"
                )
                return None
            time.sleep(0.2)


def _remove_tree(path: Path) -> None:
    """Delete the run's log directory (the workers' logs, no subdirectories)."""
    for child in path.iterdir():
        child.unlink(missing_ok=True)
    with contextlib.suppress(OSError):
        path.rmdir()
