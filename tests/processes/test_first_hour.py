"""The first hour with real processes (issue 31): a worker says which kinds it runs and from
where, PGJOBS["JOB_MODULES"] makes a module's kinds known everywhere, `manage.py check`
warns of unapplied migrations, Ctrl-C says at once what it waits for (every message on a
line of its own, under the live status line of a terminal), and `--log-format json`
writes one JSON object a line with the job's fields and its trace."""

from __future__ import annotations

import json
import os
import pty
import select
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from django_pgjobs.models import Job
from tests import jobs
from tests.helpers import count, execute, row
from tests.otel import named, read
from tests.spawn import ROOT, Workers, database_url_for_workers, suite_env, wait_for

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]


def test_job_modules_make_a_modules_kinds_known_and_the_start_line_says_so(
    workers: Workers,
) -> None:
    job_id = Job.objects.enqueue("tests.imported", {"text": "hello"}).id
    worker = workers.start(
        "--burst",
        extra_env={"PGJOBS_JOB_MODULES": "tests.imported_jobs", "PGJOBS_TEST_LOG_LEVEL": "INFO"},
    )
    assert worker.wait(60) == 0, worker.output()
    assert row(job_id) is None
    assert execute("SELECT text FROM tests_note WHERE job_id = %s", [job_id]) == [("hello",)]
    (kinds,) = [line for line in worker.output().splitlines() if line.startswith("kinds: ")]
    assert "tests.imported_jobs (tests.imported)" in kinds
    assert "tests.jobs (tests.async_cancellable, tests.async_double" in kinds


def test_a_job_module_that_cannot_be_imported_stops_every_command_saying_which() -> None:
    result = subprocess.run(
        [sys.executable, "manage.py", "check"],
        cwd=ROOT,
        env=suite_env(
            DATABASE_URL=database_url_for_workers(), PGJOBS_JOB_MODULES="tests.no_such_jobs"
        ),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode != 0
    assert (
        "PGJOBS['JOB_MODULES'] names 'tests.no_such_jobs', which cannot be imported (No "
        "module named 'tests.no_such_jobs'). Give the dotted path of a module on the Python "
        "path." in result.stderr
    )


def test_check_warns_of_unapplied_migrations_and_says_what_to_run(example_database: str) -> None:
    result = subprocess.run(
        [sys.executable, "manage.py", "check"],
        cwd=ROOT,
        env=suite_env(DATABASE_URL=example_database),
        capture_output=True,
        text=True,
        timeout=60,
    )
    # Every migration the app ships, none applied on a fresh database.
    shipped = sorted(path.stem for path in (ROOT / "django_pgjobs" / "migrations").glob("0*.py"))
    assert result.returncode == 0, result.stderr
    assert (
        f"?: (pgjobs.W013) django_pgjobs has {len(shipped)} unapplied migration(s) in database "
    ) in result.stderr
    assert f"(the last: {shipped[-1]}): enqueues fail until they are applied." in (result.stderr)
    assert "HINT: Run: python manage.py migrate django_pgjobs --database default" in (result.stderr)


class Terminal:
    """A process whose standard output and error are a terminal (a pty), read as it
    writes."""

    def __init__(self, *args: str, env: dict[str, str]) -> None:
        master, slave = pty.openpty()
        self.process = subprocess.Popen(
            [sys.executable, str(ROOT / "manage.py"), *args],
            cwd=ROOT,
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=slave,
            stderr=slave,
        )
        os.close(slave)
        self._master = master
        self._chunks: list[bytes] = []
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        while True:
            ready, _, _ = select.select([self._master], [], [], 0.1)
            if not ready:
                if self.process.poll() is not None:
                    return
                continue
            try:
                chunk = os.read(self._master, 65536)
            except OSError:  # the other side closed
                return
            if not chunk:
                return
            self._chunks.append(chunk)

    @property
    def output(self) -> str:
        return b"".join(self._chunks).decode(errors="replace")

    def close(self) -> None:
        if self.process.poll() is None:
            self.process.kill()
            self.process.wait(10)
        self._reader.join(5)
        os.close(self._master)


def test_ctrl_c_says_at_once_what_it_waits_for_and_each_message_has_its_own_line() -> None:
    job_id = jobs.patient.enqueue(seconds=60).id
    terminal = Terminal(
        "runjobs",
        "--queue",
        "long",
        "--shutdown-grace",
        "2",
        env={
            **os.environ,
            "DJANGO_SETTINGS_MODULE": "tests.settings",
            "DATABASE_URL": database_url_for_workers(),
            "PYTHONPATH": str(ROOT),
        },
    )
    try:
        wait_for(
            lambda: count("tests_note", "text = 'started'") == 1, timeout=60, what="the job running"
        )
        wait_for(lambda: "jobs/s" in terminal.output, timeout=30, what="the status line")
        terminal.process.send_signal(signal.SIGINT)
        asked = time.monotonic()
        said = (
            f"stopping: no more claims; waiting up to 2s for 1 running job (id {job_id}) to "
            "finish, then handing it back; press Ctrl-C again to exit now (it then runs "
            "again once its lease lapses)"
        )
        wait_for(lambda: said in terminal.output, timeout=5, what="the stop announced")
        assert time.monotonic() - asked < 1.5  # at once, not after the grace
        assert terminal.process.wait(30) == 0
    finally:
        terminal.close()
    output = terminal.output
    handed = "running jobs at the end of the grace period: 1 handed back (pending again, the "
    assert handed in output
    # Each message starts a line of its own: after the status line was taken off it
    # ("\r\x1b[K"), or at the start of a line, never glued after the status's text.
    for message in ("stopping: no more claims", handed):
        (line,) = [line for line in output.split("\n") if message in line]
        visible = line.rsplit("\x1b[K", 1)[-1].lstrip("\r")
        assert visible.startswith(message), repr(line)  # (the suite logs bare messages)
    assert row(job_id, "state", "attempts") == ("pending", 0)


def test_json_logs_are_one_object_a_line_with_the_jobs_fields_and_its_trace(
    workers: Workers, tmp_path: Path
) -> None:
    exported = tmp_path / "spans.jsonl"
    job_id = jobs.plain.enqueue(value=3).id
    worker = workers.start(
        "--burst",
        "--log-format",
        "json",
        "--verbosity",
        "2",
        "--worker-id",
        "json-worker",
        extra_env={"PGJOBS_TEST_SPANS_FILE": str(exported)},
    )
    assert worker.wait(60) == 0, worker.output()
    lines = [json.loads(line) for line in worker.output().splitlines() if line.strip()]
    assert all({"time", "level", "logger", "message", "worker"} <= set(line) for line in lines), (
        lines
    )
    assert all(line["worker"] == "json-worker" for line in lines)
    assert all(line["time"].endswith("Z") for line in lines)
    (done,) = [line for line in lines if line.get("job_id") == job_id]
    (span,) = named(read(exported), "process default")
    assert done == {
        "time": done["time"],
        "level": "INFO",
        "logger": "django_pgjobs.jobs",
        "message": done["message"],
        "worker": "json-worker",
        "job_id": job_id,
        "kind": "tests.plain",
        "queue": "default",
        "attempt": 1,
        "outcome": "succeeded",
        "duration_s": done["duration_s"],
        "trace_id": span["trace_id"],
        "span_id": span["span_id"],
    }
    assert done["message"].startswith(f"job done id={job_id} kind=tests.plain attempt=1/10 ")
    assert count() == 0
