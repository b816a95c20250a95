"""What every benchmark needs: a scratch database, worker processes, figures, a table."""

from __future__ import annotations

import atexit
import contextlib
import json
import os
import platform
import re
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import psycopg

ROOT = Path(__file__).resolve().parent.parent
#: The scratch database (dropped and created again): name another to run beside a run.
BENCH_DATABASE = os.environ.get("PGJOBS_BENCH_DATABASE", "pgjobs_bench")
WORKER_APP_NAME = "pgjobs-bench-worker"


@dataclass
class Figure:
    """One measured figure, with the same-run ceiling it is compared to, if any."""

    benchmark: str
    name: str
    value: float
    unit: str
    ceiling: float | None = None
    target: str = ""
    met: bool | None = None
    details: dict[str, Any] = field(default_factory=dict)
    #: How the table shows the ratio: "percent" of a ceiling, or "times" a peer's figure.
    ratio_style: str = "percent"

    @property
    def ratio(self) -> float | None:
        if self.ceiling in (None, 0):
            return None
        return self.value / self.ceiling  # type: ignore[operator]


class Database:
    """A scratch database on the server of `server_url`, recreated for the run."""

    def __init__(self, server_url: str) -> None:
        parts = urlsplit(server_url)
        self.admin_url = server_url
        self.url = urlunsplit(parts._replace(path=f"/{BENCH_DATABASE}"))

    def recreate(self) -> None:
        with psycopg.connect(self.admin_url, autocommit=True) as admin:
            admin.execute(f'DROP DATABASE IF EXISTS "{BENCH_DATABASE}" WITH (FORCE)')
            admin.execute(f'CREATE DATABASE "{BENCH_DATABASE}"')

    def drop(self) -> None:
        with psycopg.connect(self.admin_url, autocommit=True) as admin:
            admin.execute(f'DROP DATABASE IF EXISTS "{BENCH_DATABASE}" WITH (FORCE)')

    @contextmanager
    def connect(self) -> Iterator[psycopg.Connection[Any]]:
        with psycopg.connect(self.url, autocommit=True) as conn:
            yield conn

    def server_facts(self) -> dict[str, Any]:
        with self.connect() as conn:
            version = conn.execute("SHOW server_version").fetchone()[0]  # type: ignore[index]
            settings = dict(
                conn.execute(
                    "SELECT name, setting FROM pg_settings WHERE name IN "
                    "('synchronous_commit', 'fsync', 'shared_buffers', 'max_connections',"
                    " 'autovacuum')"
                ).fetchall()
            )
        return {"postgresql": version, **settings}

    def reset_jobs(self) -> None:
        with self.connect() as conn:
            conn.execute("TRUNCATE pgjobs_job, pgjobs_dead, pgjobs_dependency, bench_stamp")
            conn.execute("VACUUM ANALYZE pgjobs_job")

    def forget_statistics(self, table: str = "pgjobs_job") -> None:
        """Drop the planner's statistics of `table`, as on a table never analyzed.

        TRUNCATE keeps them, and ANALYZE of an empty table leaves them as they were: a
        drain after a VACUUM ANALYZE of a full table would plan with them and flatter
        the next "fresh" figure. Needs a superuser (the bench's scratch server has one).
        """
        with self.connect() as conn:
            try:
                conn.execute("DELETE FROM pg_statistic WHERE starelid = %s::regclass", [table])
            except psycopg.errors.InsufficientPrivilege as error:
                raise RuntimeError(
                    "the fresh-table benchmarks drop a table's planner statistics, which "
                    "needs a superuser: run the bench as one (the default postgres user)"
                ) from error

    def count(self, table: str = "pgjobs_job", where: str = "true") -> int:
        with self.connect() as conn:
            return int(conn.execute(f"SELECT count(*) FROM {table} WHERE {where}").fetchone()[0])  # type: ignore[index]


#: Every worker started, so that none outlives the bench, whatever failed (a survivor
#: would reconnect to the next run's database and take its jobs).
_started: list[WorkerProcess] = []


def _kill_survivors() -> None:
    for worker in _started:
        with contextlib.suppress(Exception):
            worker.kill()


atexit.register(_kill_survivors)


def stop_all(workers: Sequence[WorkerProcess]) -> None:
    """SIGTERM every worker and wait for it; one that failed to stop cleanly is killed,
    the others are still stopped, and the first failure is raised after."""
    failures: list[BaseException] = []
    for worker in workers:
        try:
            worker.terminate()
        except Exception as error:
            failures.append(error)
            worker.kill()
        finally:
            worker.cleanup()
    if failures:
        raise failures[0]


class WorkerProcess:
    """`manage.py runjobs` with the bench settings; its stderr is kept for parsing."""

    def __init__(self, database: Database, *args: str, env: dict[str, str] | None = None) -> None:
        env = {
            **os.environ,
            "DJANGO_SETTINGS_MODULE": "bench.settings",
            "DATABASE_URL": database.url,
            "PYTHONPATH": str(ROOT),
            "PGAPPNAME": WORKER_APP_NAME,
            **(env or {}),
        }
        self.log_path = Path(f"/tmp/pgjobs-bench-{uuid.uuid4().hex[:8]}.log")
        self._log = self.log_path.open("w")
        _started.append(self)
        self.process = subprocess.Popen(
            [sys.executable, str(ROOT / "manage.py"), "runjobs", "--no-status", *args],
            cwd=ROOT,
            env=env,
            stdout=self._log,
            stderr=subprocess.STDOUT,
        )

    @property
    def pid(self) -> int:
        return self.process.pid

    def wait(self, timeout: float, *, stopped: tuple[int, ...] = (0, -9)) -> int:
        """Wait for the worker to exit; raise unless it exited with one of `stopped`."""
        code = self.process.wait(timeout)
        self._log.close()
        if code not in stopped:
            raise RuntimeError(f"runjobs exited {code}:\n{self.output()[-3000:]}")
        return code

    def kill(self) -> None:
        if self.process.poll() is None:
            self.process.kill()
            self.process.wait(10)
        self._log.close()

    def terminate(self, timeout: float = 60) -> None:
        if self.process.poll() is None:
            self.process.terminate()
        # Killed by the SIGTERM itself: it came before the worker set its handlers, at the
        # start of its run, so the worker had claimed nothing (a smoke-sized drain can end
        # while one of several workers is still starting); not once it said it started.
        starting = "worker started" not in self.output()
        self.wait(timeout, stopped=(0, -9, -signal.SIGTERM) if starting else (0, -9))

    def output(self) -> str:
        return self.log_path.read_text(errors="replace")

    def drain_window(self) -> tuple[float, float] | None:
        """(first claim, last recorded outcome) from the worker's closing log line."""
        match = re.search(r"first_claim_at=(\S+) last_recorded_at=(\S+)", self.output())
        if not match or "-" in (match.group(1), match.group(2)):
            return None
        first, last = (datetime.fromisoformat(match.group(n)).timestamp() for n in (1, 2))
        return first, last

    def cleanup(self) -> None:
        self.kill()
        self.log_path.unlink(missing_ok=True)


def percentile(values: Sequence[float], p: float) -> float:
    """The value at fraction `p` of `values` sorted (nearest rank); `values` not empty."""
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(p * (len(ordered) - 1)))]


def wait_for(condition: Any, timeout: float, interval: float = 0.05, what: str = "") -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise TimeoutError(f"timed out after {timeout} s waiting for {what}")
        time.sleep(interval)


def machine_facts() -> dict[str, Any]:
    return {
        "cores": os.cpu_count(),
        "python": platform.python_version(),
        "platform": platform.platform(),
    }


def measured(run: Callable[[], list[Figure]]) -> list[Figure]:
    """The figures of `run`, each with the machine's 1-minute load average at the run's
    start and end in its details ("load": "0.4-1.2"): a figure taken on a loaded machine
    says so beside it."""
    before = os.getloadavg()[0]
    figures = run()
    load = f"{before:.1f}-{os.getloadavg()[0]:.1f}"
    for figure in figures:
        figure.details.setdefault("load", load)
    return figures


def render_table(figures: list[Figure]) -> str:
    header = ("benchmark", "figure", "value", "ceiling", "ratio", "target", "met", "load")
    rows = [header]
    for figure in figures:
        rows.append(
            (
                figure.benchmark,
                figure.name,
                f"{_number(figure.value)} {figure.unit}",
                f"{_number(figure.ceiling)} {figure.unit}" if figure.ceiling is not None else "",
                _ratio(figure),
                figure.target,
                {True: "yes", False: "NO", None: ""}[figure.met],
                str(figure.details.get("load", "")),
            )
        )
    widths = [max(len(row[i]) for row in rows) for i in range(len(header))]
    lines = [
        "  ".join(cell.ljust(width) for cell, width in zip(row, widths, strict=True))
        for row in rows
    ]
    lines.insert(1, "  ".join("-" * width for width in widths))
    return "\n".join(lines)


def _ratio(figure: Figure) -> str:
    if figure.ratio is None:
        return ""
    if figure.ratio_style == "times":
        return f"{figure.ratio:.2f}x"
    return f"{figure.ratio:.0%}"


def _number(value: float | None) -> str:
    if value is None:
        return ""
    if abs(value) >= 100:
        return f"{value:,.0f}"
    return f"{value:.3g}"


def write_json(path: Path, figures: list[Figure], facts: dict[str, Any]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    payload = {
        "facts": facts,
        "figures": [{**asdict(figure), "ratio": figure.ratio} for figure in figures],
    }
    path.write_text(json.dumps(payload, indent=2))


#: CPU time of the /proc counters, in seconds per tick.
TICK_S = 1 / os.sysconf("SC_CLK_TCK")


def proc_stat(pid: int) -> list[str]:
    """The fields of /proc/PID/stat after the command's name: state is [0], ppid [1],
    utime [11], stime [12]. Raises OSError once the process is gone."""
    text = Path(f"/proc/{pid}/stat").read_text()
    return text[text.rindex(")") + 2 :].split()


def cpu_seconds(pid: int) -> float:
    """The CPU seconds `pid` has spent (utime + stime). Raises OSError once it is gone."""
    fields = proc_stat(pid)
    return (int(fields[11]) + int(fields[12])) * TICK_S
