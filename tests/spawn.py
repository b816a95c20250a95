"""Run `manage.py runjobs` for real, against the test database, and clean up after."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from urllib.parse import quote

from django.db import connection

ROOT = Path(__file__).resolve().parent.parent
WORKER_APPLICATION_NAME = "pgjobs-test-worker"


def database_url_for_workers() -> str:
    settings = connection.settings_dict
    user = quote(settings["USER"] or "")
    password = f":{quote(settings['PASSWORD'])}" if settings["PASSWORD"] else ""
    auth = f"{user}{password}@" if user else ""
    host = settings["HOST"] or "127.0.0.1"
    port = f":{settings['PORT']}" if settings["PORT"] else ""
    return f"postgresql://{auth}{host}{port}/{quote(settings['NAME'])}"


def manage_py(env: dict[str, str], *args: str, timeout: float = 180) -> str:
    """Run `manage.py ARGS` in a subprocess with exactly `env`; fail the test unless it
    exits 0; return what it printed."""
    result = subprocess.run(
        [sys.executable, "manage.py", *args],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    return result.stdout


def suite_env(settings: str = "tests.settings", **extra: str) -> dict[str, str]:
    """The environment of a subprocess that runs with the test suite's code and settings."""
    return {
        "PATH": "/usr/bin:/bin",
        "PYTHONPATH": str(ROOT),
        "DJANGO_SETTINGS_MODULE": settings,
        **extra,
    }


class WorkerProcess:
    """One `manage.py runjobs` process; its output goes to a file read on demand."""

    def __init__(self, *args: str, extra_env: dict[str, str] | None = None) -> None:
        self.log = tempfile.NamedTemporaryFile(  # noqa: SIM115 - closed by close()
            prefix="runjobs-", suffix=".log", delete=False
        )
        env = {
            **os.environ,
            "DJANGO_SETTINGS_MODULE": "tests.settings",
            "DATABASE_URL": database_url_for_workers(),
            "PYTHONPATH": str(ROOT),
            "PYTHONUNBUFFERED": "1",
            # libpq names the workers' connections, so a test can find (and kill) them.
            "PGAPPNAME": WORKER_APPLICATION_NAME,
            **(extra_env or {}),
        }
        self.process = subprocess.Popen(
            [sys.executable, str(ROOT / "manage.py"), "runjobs", "--no-status", *args],
            cwd=ROOT,
            env=env,
            stdout=self.log,
            stderr=subprocess.STDOUT,
        )

    @property
    def pid(self) -> int:
        return self.process.pid

    def output(self) -> str:
        return Path(self.log.name).read_text(errors="replace")

    def signal(self, signum: int) -> None:
        self.process.send_signal(signum)

    def wait(self, timeout: float = 60) -> int:
        try:
            return self.process.wait(timeout)
        except subprocess.TimeoutExpired:
            self.kill()
            raise AssertionError(
                f"runjobs did not exit within {timeout} s; output:\n{self.output()}"
            ) from None

    def kill(self) -> None:
        if self.process.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                self.process.send_signal(signal.SIGCONT)
            self.process.kill()
            self.process.wait(10)

    def close(self) -> None:
        self.kill()
        self.log.close()
        Path(self.log.name).unlink(missing_ok=True)


class Workers:
    """Start runjobs processes; every one still alive is killed at the end of the test."""

    def __init__(self, extra_env: dict[str, str] | None = None) -> None:
        self.started: list[WorkerProcess] = []
        #: The environment every worker started here gets beside its own.
        self.extra_env = extra_env or {}
        #: Whether they listen (PGJOBS_NOTIFY=0: they poll).
        self.listen = self.extra_env.get("PGJOBS_NOTIFY") != "0"

    def start(self, *args: str, extra_env: dict[str, str] | None = None) -> WorkerProcess:
        process = WorkerProcess(*args, extra_env={**self.extra_env, **(extra_env or {})})
        self.started.append(process)
        return process

    def close(self) -> None:
        for process in self.started:
            process.close()


def listening_workers() -> int:
    """How many worker subprocesses LISTEN now (each then takes wake-ups; a worker
    connects its LISTEN line before its first claim). A connection whose last statement
    is the LISTEN itself, not one that merely mentions it (the probe of the wake-up line
    says "a LISTEN connection" in its comment)."""
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database()"
            " AND application_name = %s AND query ~ %s",
            [WORKER_APPLICATION_NAME, r"(^|\n)\s*LISTEN "],
        )
        return int(cursor.fetchone()[0])


def ready_workers(workers: Workers) -> int:
    """How many worker subprocesses are up: listening, when they listen; otherwise
    registered (a polling worker registers before its first claim)."""
    if workers.listen:
        return listening_workers()
    with connection.cursor() as cursor:
        cursor.execute("SELECT count(*) FROM pgjobs_worker WHERE stopped_at IS NULL")
        return int(cursor.fetchone()[0])


def wait_for(condition, timeout: float = 30, interval: float = 0.05, what: str = "condition"):
    deadline = time.monotonic() + timeout
    while True:
        value = condition()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"{what} not met within {timeout} s")
        time.sleep(interval)
