"""The worker processes of a chaos run: `runjobs` subprocesses on the run's queue."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path

from django.conf import settings

from django_pgjobs.chaos.config import ChaosAborted
from django_pgjobs.chaos.state import RunState

#: The module the run's workers import to know its job kinds.
JOBS_MODULE = "django_pgjobs.chaos.jobs"
#: A worker that exits by itself this many times stops the run: it cannot start at all.
MAX_SELF_EXITS = 3


@dataclass(slots=True)
class Worker:
    """One worker slot: its current process and how many it has had."""

    index: int
    run_id: str
    log_dir: Path
    generation: int = 0
    process: subprocess.Popen[bytes] | None = None
    log_path: Path | None = None
    stopped_at: datetime | None = None  # the database's clock when SIGSTOP was sent
    resume_at: float = 0.0  # monotonic time of its SIGCONT
    started: float = 0.0  # monotonic time its current process started
    self_exits: int = 0

    @property
    def name(self) -> str:
        """The worker id, and the application name of its connections."""
        return f"chaos-{self.run_id}-w{self.index}g{self.generation}"

    @property
    def alive(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def tail(self, lines: int = 15) -> str:
        text = self.output().strip().splitlines()
        return "\n".join(text[-lines:]) or "(no output)"

    def output(self) -> str:
        """What its current process has printed so far."""
        if self.log_path is None or not self.log_path.exists():
            return ""
        return self.log_path.read_text(errors="replace")


class Workers:
    """Start the run's workers, restart one that exits by itself, stop or kill them all."""

    def __init__(self, state: RunState) -> None:
        self.state = state
        self.settings_module = _settings_module()
        self.log_dir = Path(tempfile.mkdtemp(prefix=f"pgjobs-chaos-{state.run_id}-"))
        self.slots = [
            Worker(index=index, run_id=state.run_id, log_dir=self.log_dir)
            for index in range(state.config.workers)
        ]

    def start(self, worker: Worker) -> None:
        """Start the next generation of `worker`: a new process, id and log."""
        worker.generation += 1
        worker.stopped_at = None
        worker.started = time.monotonic()
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
            f"--settings={self.settings_module}",
            f"--import={JOBS_MODULE}",
            f"--queue={self.state.queue}",
            f"--concurrency={self.state.config.concurrency}",
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

    def watch(self) -> None:
        """Restart a worker that exited by itself, and count it against the invariants."""
        for worker in self.slots:
            process = worker.process
            if process is None or process.poll() is None:
                continue
            worker.self_exits += 1
            self.state.ledger.worker_exits.append(
                f"{worker.name} exited by itself with status {process.returncode}:\n{worker.tail()}"
            )
            self.state.on_event(
                f"{worker.name} exited by itself ({process.returncode}); restarting"
            )
            if worker.self_exits >= MAX_SELF_EXITS:
                raise ChaosAborted(
                    f"Worker {worker.name} exited {worker.self_exits} times by itself; "
                    f"its last output:\n{worker.tail()}"
                )
            self.start(worker)

    def stop(self) -> None:
        """Stop every worker with SIGTERM; one that does not stop cleanly fails the run."""
        for worker in self.slots:
            if worker.alive and worker.process is not None:
                worker.process.send_signal(signal.SIGTERM)
        for worker in self.slots:
            if worker.process is None:
                continue
            try:
                code = worker.process.wait(30)
            except subprocess.TimeoutExpired:
                worker.process.kill()
                worker.process.wait()
                code = None
            if code != 0:
                self.state.ledger.worker_exits.append(
                    f"{worker.name} did not stop cleanly on SIGTERM (status {code}):\n"
                    f"{worker.tail()}"
                )
            worker.process = None

    def kill(self) -> None:
        """Kill whatever worker is left, stopped (SIGSTOP) or not."""
        for worker in self.slots:
            process = worker.process
            if process is not None and process.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    process.send_signal(signal.SIGCONT)
                    process.kill()
                process.wait()
            worker.process = None


def _settings_module() -> str:
    """The project's settings module, which the workers are started with."""
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
