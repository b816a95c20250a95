"""A chaos run: workers on a scratch queue, a stream of jobs, faults at random, a verdict.

The run starts `runjobs` processes on a queue of its own, enqueues plain jobs and keyed
jobs it re-triggers while they run, and for a set time injects faults: `kill -9` of a
worker, SIGSTOP past the lease then SIGCONT, `pg_terminate_backend` of a worker's
connections, bursts of enqueues in transactions that roll back, and (when allowed) a
PostgreSQL restart. Then it lets the queue drain, stops the workers and judges what the
database holds against what it did (`invariants.judge`).
"""

from __future__ import annotations

import contextlib
import os
import random
import shlex
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

from django.conf import settings
from django.db import DatabaseError, InterfaceError, OperationalError, connections, transaction

from django_pgjobs.chaos import invariants, poison
from django_pgjobs.chaos.invariants import Evidence, Fault, FinalJob, Verdict
from django_pgjobs.chaos.jobs import KEYED_KIND, POISON_KIND, WORK_KIND
from django_pgjobs.chaos.models import ChaosExecution
from django_pgjobs.conf import pgjobs_settings
from django_pgjobs.models import Job

FAULT_KINDS = ("kill", "stop", "terminate", "ghost", "poison", "restart")
DEFAULT_FAULTS = ("kill", "stop", "terminate", "ghost", "poison")
#: The module the run's workers import to know its job kinds.
JOBS_MODULE = "django_pgjobs.chaos.jobs"
#: Seconds between two passes of the run's loop.
TICK_S = 0.05
#: Seconds between two progress reports (each one counts the queue's rows).
PROGRESS_S = 0.5
#: How long the run waits for its database to come back before it gives up.
DATABASE_PATIENCE_S = 120.0
#: A worker that exits by itself this many times stops the run: it cannot start at all.
MAX_SELF_EXITS = 3
#: Longest wait of the run's own enqueues for a row lock (a keyed trigger waits for its
#: job's fenced run, whose worker this run may have stopped).
LOCK_WAIT_S = 2.0
#: SQLSTATE of a lock wait that gave up (lock_timeout).
LOCK_NOT_AVAILABLE = "55P03"


class ChaosAborted(Exception):
    """The run could not go on (a worker cannot start, the database is gone)."""


@dataclass(frozen=True, slots=True)
class ChaosConfig:
    """What a run does. Every duration is in seconds."""

    duration: float = 60.0
    workers: int = 3
    concurrency: int = 4
    jobs: int = 200  # enqueued before the first fault
    rate: float = 20.0  # plain jobs enqueued per second while faults go on
    keys: int = 8
    triggers: float = 4.0  # keyed triggers per second
    lease: int = 4
    max_attempts: int = 6
    faults: tuple[str, ...] = DEFAULT_FAULTS
    fault_every: float = 2.0  # mean time between two faults
    restart_command: str | None = None
    restart_every: float = 30.0  # least time between two database restarts
    drain_timeout: float = 120.0
    seed: int | None = None
    keep: bool = False

    def __post_init__(self) -> None:
        problems = []
        if self.duration <= 0:
            problems.append("the duration must be more than 0 seconds")
        if self.workers < 1 or self.concurrency < 1:
            problems.append("there must be at least one worker of at least one thread")
        if self.jobs < 0 or self.rate < 0 or self.keys < 0 or self.triggers < 0:
            problems.append("jobs, rate, keys and triggers must not be negative")
        if self.lease < 1 or self.max_attempts < 1:
            problems.append("the lease and max attempts must be at least 1")
        if self.fault_every <= 0 or self.drain_timeout <= 0:
            problems.append("the fault interval and the drain timeout must be positive")
        unknown = sorted(set(self.faults) - set(FAULT_KINDS))
        if unknown:
            problems.append(
                f"unknown faults {', '.join(unknown)} (known: {', '.join(FAULT_KINDS)})"
            )
        if "restart" in self.faults and not self.restart_command:
            problems.append(
                "a database restart needs the command that restarts it (--allow-db-restart CMD)"
            )
        if problems:
            raise ValueError("; ".join(problems) + ".")


@dataclass(frozen=True, slots=True)
class Progress:
    """Where a run is, for the progress bar."""

    phase: str  # "faults", "drain" or "check"
    elapsed: float
    total: float
    enqueued: int
    finished: int
    waiting: int  # pending or running
    faults: Counter[str]


@dataclass(slots=True)
class ChaosReport:
    """What a run did and what it found."""

    run_id: str
    queue: str
    config: ChaosConfig
    verdicts: list[Verdict]
    jobs: int
    triggers: int
    busy_triggers: int
    ghosts: int
    executions: int
    reruns: invariants.Reruns
    faults: Counter[str]
    missed_faults: Counter[str]
    dead: Counter[str]
    drain_s: float | None
    seconds: float
    log_dir: Path | None

    @property
    def passed(self) -> bool:
        return all(verdict.holds for verdict in self.verdicts)


@dataclass(slots=True)
class _Worker:
    """One worker slot: its current process and how many it has had."""

    index: int
    run_id: str
    log_dir: Path
    generation: int = 0
    process: subprocess.Popen[bytes] | None = None
    log_path: Path | None = None
    stopped_at: datetime | None = None  # the database's clock when SIGSTOP was sent
    resume_at: float = 0.0  # monotonic time of its SIGCONT
    self_exits: int = 0

    @property
    def name(self) -> str:
        """The worker id, and the application name of its connections."""
        return f"chaos-{self.run_id}-w{self.index}g{self.generation}"

    @property
    def alive(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def tail(self, lines: int = 15) -> str:
        if self.log_path is None or not self.log_path.exists():
            return "(no output)"
        text = self.log_path.read_text(errors="replace").strip().splitlines()
        return "\n".join(text[-lines:]) or "(no output)"


@dataclass(slots=True)
class _Ledger:
    """What the run did, for the judgement."""

    committed: dict[int, str | None] = field(default_factory=dict)
    uncertain: set[int] = field(default_factory=set)
    ghosts: set[int] = field(default_factory=set)
    versions: dict[str, int] = field(default_factory=dict)  # the last trigger number given
    last_triggers: dict[str, int] = field(default_factory=dict)  # ... and committed
    uncertain_keys: set[str] = field(default_factory=set)
    triggers: int = 0
    skipped_busy: int = 0  # triggers given up: their key's job was locked too long
    faults: list[Fault] = field(default_factory=list)
    missed: Counter[str] = field(default_factory=Counter)
    worker_exits: list[str] = field(default_factory=list)


class ChaosRun:
    """One run; `execute()` does it all and returns the report."""

    def __init__(
        self,
        config: ChaosConfig,
        *,
        on_progress: Callable[[Progress], None] | None = None,
        on_event: Callable[[str], None] | None = None,
    ) -> None:
        self.config = config
        self.run_id = uuid.uuid4().hex[:8]
        self.queue = f"chaos.{self.run_id}"
        self.alias = pgjobs_settings.DATABASE
        self.random = random.Random(config.seed)
        self.on_progress = on_progress or (lambda progress: None)
        self.on_event = on_event or (lambda message: None)
        self.ledger = _Ledger()
        self._settings_module = _settings_module()
        self.log_dir = Path(tempfile.mkdtemp(prefix=f"pgjobs-chaos-{self.run_id}-"))
        self.workers = [
            _Worker(index=index, run_id=self.run_id, log_dir=self.log_dir)
            for index in range(config.workers)
        ]
        self._last_fault = 0.0
        self._last_restart = float("-inf")

    # -- the run ----------------------------------------------------------------------

    def execute(self) -> ChaosReport:
        started = time.monotonic()
        self._check_database()
        passed = False
        try:
            for worker in self.workers:
                self._start(worker)
            self._enqueue_plain(self.config.jobs)
            self._inject_faults()
            drain_s = self._drain()
            self._stop_workers()
            self.on_progress(self._progress("check", 0, 0))
            evidence = self._evidence()
            verdicts = invariants.judge(evidence)
            passed = all(verdict.holds for verdict in verdicts)
            return ChaosReport(
                run_id=self.run_id,
                queue=self.queue,
                config=self.config,
                verdicts=verdicts,
                jobs=len(self.ledger.committed),
                triggers=self.ledger.triggers,
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
            )
        finally:
            self._kill_workers()
            if not self.config.keep:
                self._forget()
            if passed and not self.config.keep:
                _remove_tree(self.log_dir)

    def _forget(self) -> None:
        """Delete the run's rows: its ledger and its jobs, live and dead."""
        for _ in range(2):
            try:
                ChaosExecution.objects.forget_run(self.run_id, self.queue, using=self.alias)
                return
            except DatabaseError:
                self._reconnect()
        self.on_event(
            f"could not delete the run's rows: delete the jobs of queue {self.queue} and the "
            f"pgjobs_chaos_execution rows of run {self.run_id} by hand"
        )

    def _check_database(self) -> None:
        try:
            ChaosExecution.objects.census(self.queue, using=self.alias)
            ChaosExecution.objects.of_run(self.run_id, using=self.alias)
        except DatabaseError as error:
            raise ChaosAborted(
                f"The jobs database '{self.alias}' is not ready: "
                f"{str(error).strip().splitlines()[0]}. "
                "Run: python manage.py migrate django_pgjobs"
            ) from None

    def _inject_faults(self) -> None:
        config = self.config
        began = time.monotonic()
        deadline = began + config.duration
        next_fault = began + self._fault_gap()
        next_progress = began
        owed_plain = owed_triggers = 0.0
        last = began
        while (now := time.monotonic()) < deadline:
            owed_plain += (now - last) * config.rate
            owed_triggers += (now - last) * config.triggers if config.keys else 0.0
            last = now
            if owed_plain >= 1:
                self._enqueue_plain(int(owed_plain))
                owed_plain -= int(owed_plain)
            while owed_triggers >= 1:
                self._trigger(self.random.randrange(config.keys))
                owed_triggers -= 1
            self._resume_due()
            self._watch_workers()
            if now >= next_fault and config.faults:
                self._inject(self.random.choice(config.faults))
                next_fault = time.monotonic() + self._fault_gap()
            if now >= next_progress:
                self.on_progress(self._progress("faults", now - began, config.duration))
                next_progress = now + PROGRESS_S
            time.sleep(TICK_S)
        for worker in self.workers:
            if worker.stopped_at is not None:
                self._resume(worker)

    def _drain(self) -> float | None:
        """Wait until nothing of the run is pending or running; return the seconds that
        took after the last fault (None: it never drained within the timeout)."""
        began = time.monotonic()
        deadline = began + self.config.drain_timeout
        while True:
            self._watch_workers()
            now = time.monotonic()
            progress = self._progress("drain", now - began, self.config.drain_timeout)
            self.on_progress(progress)
            if progress.waiting == 0:
                return time.monotonic() - (self._last_fault or began)
            if now > deadline:
                self.on_event(
                    f"{progress.waiting} jobs still pending or running after "
                    f"{self.config.drain_timeout:g} s of drain"
                )
                return None
            time.sleep(0.2)

    # -- workers ----------------------------------------------------------------------

    def _start(self, worker: _Worker) -> None:
        worker.generation += 1
        worker.stopped_at = None
        worker.log_path = self.log_dir / f"{worker.name}.log"
        env = {
            **os.environ,
            "PGAPPNAME": worker.name,
            "PYTHONPATH": os.pathsep.join(_import_path()),
            "PYTHONUNBUFFERED": "1",
        }
        command = [
            sys.executable,
            "-m",
            "django",
            "runjobs",
            f"--settings={self._settings_module}",
            f"--import={JOBS_MODULE}",
            f"--queue={self.queue}",
            f"--concurrency={self.config.concurrency}",
            f"--worker-id={worker.name}",
            "--poll-interval=1",
            "--sweep-interval=2",
            "--shutdown-grace=5",
            "--no-status",
        ]
        with worker.log_path.open("wb") as log:
            worker.process = subprocess.Popen(
                command,
                env=env,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,  # a Ctrl-C reaches the run, which stops them
            )

    def _watch_workers(self) -> None:
        """Restart a worker that exited by itself, and count it against the invariants."""
        for worker in self.workers:
            process = worker.process
            if process is None or process.poll() is None:
                continue
            worker.self_exits += 1
            self.ledger.worker_exits.append(
                f"{worker.name} exited by itself with status {process.returncode}:\n{worker.tail()}"
            )
            self.on_event(f"{worker.name} exited by itself ({process.returncode}); restarting")
            if worker.self_exits >= MAX_SELF_EXITS:
                raise ChaosAborted(
                    f"Worker {worker.name} exited {worker.self_exits} times by itself; "
                    f"its last output:\n{worker.tail()}"
                )
            self._start(worker)

    def _stop_workers(self) -> None:
        for worker in self.workers:
            if worker.alive and worker.process is not None:
                worker.process.send_signal(signal.SIGTERM)
        for worker in self.workers:
            if worker.process is None:
                continue
            try:
                code = worker.process.wait(30)
            except subprocess.TimeoutExpired:
                worker.process.kill()
                worker.process.wait()
                code = None
            if code != 0:
                self.ledger.worker_exits.append(
                    f"{worker.name} did not stop cleanly on SIGTERM (status {code}):\n"
                    f"{worker.tail()}"
                )
            worker.process = None

    def _kill_workers(self) -> None:
        for worker in self.workers:
            process = worker.process
            if process is not None and process.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    process.send_signal(signal.SIGCONT)
                    process.kill()
                process.wait()
            worker.process = None

    # -- faults -----------------------------------------------------------------------

    def _fault_gap(self) -> float:
        mean = self.config.fault_every
        return min(max(self.random.expovariate(1 / mean), mean / 10), mean * 3)

    def _inject(self, kind: str) -> None:
        if kind == "restart" and time.monotonic() - self._last_restart < self.config.restart_every:
            kind = self.random.choice(
                [k for k in self.config.faults if k != "restart"] or ["ghost"]
            )
        running = [worker for worker in self.workers if worker.alive and worker.stopped_at is None]
        if kind in ("kill", "terminate", "stop") and not running:
            self.ledger.missed[kind] += 1
            return
        if kind == "stop" and sum(w.stopped_at is not None for w in self.workers) >= max(
            1, len(self.workers) - 1
        ):
            kind = "kill"
        if kind == "ghost":
            self._ghost_burst()
        elif kind == "poison":
            self._poison_burst()
        elif kind == "restart":
            self._restart_database()
        else:
            worker = self.random.choice(running)
            {"kill": self._kill, "stop": self._stop, "terminate": self._terminate}[kind](worker)

    def _record(self, kind: str, worker: str | None, began: datetime) -> None:
        self.ledger.faults.append(Fault(kind, worker, began, self._clock()))
        self._last_fault = time.monotonic()

    def _kill(self, worker: _Worker) -> None:
        began = self._clock()
        assert worker.process is not None
        worker.process.kill()
        worker.process.wait()
        self._record("kill", worker.name, began)
        self._start(worker)

    def _stop(self, worker: _Worker) -> None:
        assert worker.process is not None
        worker.stopped_at = self._clock()
        worker.process.send_signal(signal.SIGSTOP)
        worker.resume_at = time.monotonic() + self.config.lease + self.random.uniform(0.5, 2.5)

    def _resume_due(self) -> None:
        now = time.monotonic()
        for worker in self.workers:
            if worker.stopped_at is not None and now >= worker.resume_at:
                self._resume(worker)

    def _resume(self, worker: _Worker) -> None:
        assert worker.stopped_at is not None and worker.process is not None
        with contextlib.suppress(ProcessLookupError):
            worker.process.send_signal(signal.SIGCONT)
        self._record("stop", worker.name, worker.stopped_at)
        worker.stopped_at = None

    def _terminate(self, worker: _Worker) -> None:
        began = self._clock()
        limit = self.random.choice([1, 1000])  # one connection, or all of them
        dropped = self._database(
            lambda: ChaosExecution.objects.terminate_connections(
                worker.name, limit=limit, using=self.alias
            ),
            "terminating connections",
        )
        if dropped:
            self._record("terminate", worker.name, began)
        else:  # not connected yet, or DATABASES names its connections itself
            self.ledger.missed["terminate"] += 1

    def _ghost_burst(self) -> None:
        """Enqueue jobs and a trigger inside a transaction that rolls back."""
        began = self._clock()
        size = self.random.randint(1, 20)

        def write(ids: list[int]) -> None:
            results = Job.objects.enqueue_many(
                [self._plain_job(ghost=True) for _ in range(size)], using=self.alias
            )
            ids += [result.id for result in results if result.inserted]
            if self.config.keys:
                key = self._key(self.random.randrange(self.config.keys))
                payload = {"run": self.run_id, "v": -1, "sleep": 0.0, "ghost": True}
                result = Job.objects.enqueue(
                    KEYED_KIND, payload, key=key, using=self.alias, **self._options()
                )
                if result.inserted:  # a merge returns a committed job's id: not a ghost
                    ids.append(result.id)

        ids, _ = self._write(write, roll_back=True)
        self.ledger.ghosts.update(ids)
        self._record("ghost", None, began)

    def _poison_burst(self) -> None:
        """Enqueue a few jobs of hostile handlers (S27): each must end dead, and the
        workers must keep going."""
        began = self._clock()
        names = sorted(poison.BEHAVIOURS)
        jobs = [
            {
                "kind": POISON_KIND,
                "payload": {"run": self.run_id, "how": self.random.choice(names)},
                **self._options(),
            }
            for _ in range(self.random.randint(1, 5))
        ]

        def write(ids: list[int]) -> None:
            ids += [result.id for result in Job.objects.enqueue_many(jobs, using=self.alias)]

        ids, committed = self._write(write)
        if committed:
            self.ledger.committed.update(dict.fromkeys(ids))
        else:
            self.ledger.uncertain.update(ids)
        self._record("poison", None, began)

    def _restart_database(self) -> None:
        command = self.config.restart_command
        assert command is not None
        self.on_event(f"restarting PostgreSQL: {command}")
        began = self._clock()
        connections[self.alias].close()
        completed = subprocess.run(
            shlex.split(command), capture_output=True, text=True, timeout=300, check=False
        )
        if completed.returncode != 0:
            raise ChaosAborted(
                f"The restart command failed ({completed.returncode}): {command}\n"
                f"{(completed.stderr or completed.stdout).strip()}"
            )
        self._record("restart", None, began)
        self._last_restart = time.monotonic()

    # -- jobs -------------------------------------------------------------------------

    def _options(self) -> dict[str, Any]:
        return {
            "queue": self.queue,
            "lease": self.config.lease,
            "max_attempts": self.config.max_attempts,
            "result_retention": 24 * 3600,
        }

    def _plain_job(self, *, ghost: bool = False) -> dict[str, Any]:
        roll = self.random.random()
        sleep = (
            self.random.uniform(0, 0.05)
            if roll < 0.7
            else self.random.uniform(0.05, 0.5)
            if roll < 0.95
            else self.random.uniform(0.5, 1.5)
        )
        payload: dict[str, Any] = {"run": self.run_id, "sleep": round(sleep, 3)}
        flavour = self.random.random()
        if flavour < 0.1:
            payload["flaky"] = True
        elif flavour < 0.13:
            payload["doomed"] = True
        if ghost:
            payload["ghost"] = True
        return {"kind": WORK_KIND, "payload": payload, **self._options()}

    def _enqueue_plain(self, count: int) -> None:
        while count > 0:
            size = min(count, 100)
            count -= size

            def write(ids: list[int], size: int = size) -> None:
                if size == 1:  # one at a time, and in bulk (S5)
                    job = self._plain_job()
                    kind, payload = job.pop("kind"), job.pop("payload")
                    ids.append(Job.objects.enqueue(kind, payload, using=self.alias, **job).id)
                else:
                    jobs = [self._plain_job() for _ in range(size)]
                    ids += [r.id for r in Job.objects.enqueue_many(jobs, using=self.alias)]

            ids, committed = self._write(write)
            if committed:
                self.ledger.committed.update(dict.fromkeys(ids))
            else:
                self.ledger.uncertain.update(ids)

    def _key(self, index: int) -> str:
        return f"{self.run_id}:k{index}"

    def _trigger(self, index: int) -> None:
        """Enqueue the next trigger of a key: merged into its live job, or a new job."""
        key = self._key(index)
        version = self.ledger.versions.get(key, 0) + 1
        self.ledger.versions[key] = version
        sleep = round(self.random.uniform(0.2, 1.2), 3)
        payload = {"run": self.run_id, "v": version, "sleep": sleep}

        def write(ids: list[int]) -> None:
            ids.append(
                Job.objects.enqueue(
                    KEYED_KIND, payload, key=key, using=self.alias, **self._options()
                ).id
            )

        ids, committed = self._write(write)
        if committed:
            self.ledger.committed[ids[0]] = key
            self.ledger.last_triggers[key] = version
            self.ledger.uncertain_keys.discard(key)
            self.ledger.triggers += 1
        elif ids:
            self.ledger.uncertain.update(ids)
            self.ledger.uncertain_keys.add(key)

    def _write(
        self, write: Callable[[list[int]], None], *, roll_back: bool = False
    ) -> tuple[list[int], bool]:
        """Run `write` in a transaction; return the ids it collected and whether they
        surely committed. A connection that breaks under it (a fault, a restart) leaves
        the commit unknown: those jobs are then counted neither as committed nor as lost.
        """
        ids: list[int] = []
        try:
            with transaction.atomic(using=self.alias):
                # A keyed trigger waits for the row lock of its job's fenced run; if this
                # run stopped that worker (SIGSTOP), only this loop would resume it.
                ChaosExecution.objects.limit_lock_wait(LOCK_WAIT_S, using=self.alias)
                write(ids)
                if roll_back:
                    transaction.set_rollback(True, using=self.alias)
        except OperationalError as error:
            if getattr(error.__cause__, "sqlstate", None) == LOCK_NOT_AVAILABLE:
                # Rolled back for sure: the trigger never happened. Try another later.
                self.ledger.skipped_busy += 1
                return [], False
            self.on_event(f"an enqueue failed ({str(error).strip().splitlines()[0]}); going on")
            self._reconnect()
            return ids, False
        except InterfaceError as error:
            self.on_event(f"an enqueue failed ({str(error).strip().splitlines()[0]}); going on")
            self._reconnect()
            return ids, False
        return ids, not roll_back

    # -- the database -----------------------------------------------------------------

    def _clock(self) -> datetime:
        now: datetime = self._database(
            lambda: ChaosExecution.objects.clock(using=self.alias), "reading the clock"
        )
        return now

    def _database(self, operation: Callable[[], Any], doing: str) -> Any:
        """Run `operation`, waiting out a database that went away (a restart)."""
        deadline = time.monotonic() + DATABASE_PATIENCE_S
        while True:
            try:
                return operation()
            except (OperationalError, InterfaceError) as error:
                if time.monotonic() > deadline:
                    raise ChaosAborted(
                        f"The database did not answer for {DATABASE_PATIENCE_S:g} s while "
                        f"{doing}: {str(error).strip().splitlines()[0]}"
                    ) from None
                self._reconnect()
                time.sleep(0.5)

    def _reconnect(self) -> None:
        with contextlib.suppress(DatabaseError):
            connections[self.alias].close()

    def _progress(self, phase: str, elapsed: float, total: float) -> Progress:
        census = self._database(
            lambda: ChaosExecution.objects.census(self.queue, using=self.alias), "counting jobs"
        )
        return Progress(
            phase=phase,
            elapsed=elapsed,
            total=total,
            enqueued=len(self.ledger.committed),
            finished=census.get("done", 0) + census.get("dead", 0),
            waiting=census.get("pending", 0) + census.get("running", 0),
            faults=Counter(fault.kind for fault in self.ledger.faults),
        )

    def _evidence(self) -> Evidence:
        manager = ChaosExecution.objects
        executions = self._database(
            lambda: manager.of_run(self.run_id, using=self.alias), "reading the ledger"
        )
        rows = self._database(
            lambda: manager.final_rows(self.queue, using=self.alias), "reading the jobs"
        )
        final = {row["id"]: _final_job(row) for row in rows}
        committed = {
            job_id: key
            for job_id, key in self.ledger.committed.items()
            if job_id not in self.ledger.uncertain
        }
        return Evidence(
            executions=executions,
            committed=committed,
            last_triggers=dict(self.ledger.last_triggers),
            ghosts=set(self.ledger.ghosts),
            faults=list(self.ledger.faults),
            final=final,
            uncertain=set(self.ledger.uncertain),
            uncertain_keys=set(self.ledger.uncertain_keys),
            worker_exits=list(self.ledger.worker_exits),
        )


def _final_job(row: dict[str, Any]) -> FinalJob:
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


def _settings_module() -> str:
    module = getattr(settings, "SETTINGS_MODULE", None) or os.environ.get("DJANGO_SETTINGS_MODULE")
    if not module:
        raise ChaosAborted(
            "chaosjobs starts its workers with `python -m django runjobs --settings=...`, "
            "so the project's settings must be a module: set DJANGO_SETTINGS_MODULE."
        )
    return str(module)


def _import_path() -> list[str]:
    """This process's import path, so that the workers import the same project."""
    return [entry or os.getcwd() for entry in sys.path if not entry or os.path.isdir(entry)]


def _remove_tree(path: Path) -> None:
    for child in path.iterdir():
        child.unlink(missing_ok=True)
    with contextlib.suppress(OSError):
        path.rmdir()
