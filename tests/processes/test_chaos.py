"""`manage.py chaosjobs` for real: a short run under faults (kill -9, SIGSTOP past the
lease, dropped connections, rolled-back enqueues, poison jobs) keeps every invariant, and
leaves nothing behind. The invariants themselves: tests/unit/test_chaos.py."""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

from django_pgjobs.chaos.run import ChaosConfig
from tests import autofailover
from tests.helpers import count, other_connection
from tests.spawn import ROOT, database_url_for_workers, manage_py, suite_env

pytestmark = pytest.mark.slow  # each test runs chaosjobs: a supervisor and its workers


def chaosjobs(
    *args: str, timeout: float = 240, database_url: str | None = None
) -> subprocess.CompletedProcess[str]:
    env = {
        **os.environ,
        "DJANGO_SETTINGS_MODULE": "tests.settings",
        "DATABASE_URL": database_url or database_url_for_workers(),
        "PYTHONPATH": str(ROOT),
    }
    # A session of its own: if the run hangs, its workers die with it (a stopped one,
    # left behind, would hold its locks and stall every later test).
    process = subprocess.Popen(
        [sys.executable, "-m", "django", "chaosjobs", *args],
        cwd=ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    try:
        stdout, stderr = process.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        for signum in (signal.SIGCONT, signal.SIGKILL):
            with contextlib.suppress(ProcessLookupError):
                os.killpg(process.pid, signum)
        stdout, stderr = process.communicate()
        raise AssertionError(f"chaosjobs hung past {timeout} s:\n{stdout}\n{stderr}") from None
    return subprocess.CompletedProcess(process.args, process.returncode, stdout, stderr)


@pytest.mark.django_db(transaction=True)
def test_a_short_chaos_run_injects_every_fault_and_keeps_every_invariant() -> None:
    result = chaosjobs(
        "--duration=12",
        "--workers=2",
        "--jobs=60",
        "--rate=10",
        "--lease=3",
        "--fault-every=0.4",  # some 30 faults, dealt in rounds of every kind
    )
    output = result.stdout + result.stderr
    assert result.returncode == 0, output
    for name in ("no job lost", "no ghost ran", "fencing", "keys", "attempts", "workflows"):
        assert re.search(rf"ok\s+{name}:", output), output
    assert re.search(r"ok\s+poison dead-lettered:", output), output
    faults = dict(
        re.findall(r"(kill|stop|terminate|ghost|poison) (\d+)", output.split("faults injected")[1])
    )
    assert set(faults) == {"kill", "stop", "terminate", "ghost", "poison"}, output
    chains, batches = map(
        int, re.search(r"workflows\s+(\d+) chains, (\d+) batches", output).groups()
    )
    assert chains + batches >= 6, output  # about one a second, each ended as it should
    executions = int(re.search(r"executions\s+(\d+)", output).group(1))
    assert executions >= 60
    # It leaves nothing behind: no jobs, no ledger, no logs.
    assert count() == 0 and count("pgjobs_dead") == 0
    assert count("pgjobs_chaos_execution") == 0
    assert count("pgjobs_batch") == count("pgjobs_dependency") == 0
    run_id = re.search(r"chaos run (\w+)", output).group(1)
    assert not list(Path(tempfile.gettempdir()).glob(f"pgjobs-chaos-{run_id}-*"))


@pytest.mark.django_db(transaction=True)
def test_s42_under_pins_the_claim_reads_past_the_dead_rows() -> None:
    """An idle transaction or a REPEATABLE READ reader holds the xmin horizon for 22 s
    while 600 jobs run and die in the held rows, beside keyed triggers and the limited
    key: every invariant holds, and the claim at a pin's end reads at most twice the
    buffers it read as the pin began (+64): the workers read from their floors. Without
    workflows and connection faults: a released child or a rescued lease comes back with
    its old run_after, which takes the floors back to it when they are next read from the
    start (a gap docs/explanation/pressure.md names)."""
    result = chaosjobs(
        "--duration=36",
        "--workers=2",
        "--jobs=60",
        "--rate=10",
        "--lease=3",
        "--workflows=0",
        "--faults=pin",
        "--fault-every=2",  # the first pin by 6 s at the latest
        "--pin-seconds=22",
        "--pin-churn=600",
    )
    output = result.stdout + result.stderr
    assert result.returncode == 0, output
    assert re.search(r"ok\s+claim cost under a held horizon:", output), output
    held = re.findall(
        r"^pin \((idle|reader)\) +\d+ s: a claim read (\d+) buffers as it began, "
        r"(\d+) as it ended, (\d+) from the start \(the workers' claims from their floors; "
        r"(\d+) dead rows\)$",
        output,
        re.MULTILINE,
    )
    assert held, output  # a pin held its whole time, and was judged
    for _, before, after, from_start, dead in held:
        # Within twice the start's cost (+64), or, where writers held the floors back
        # (seconds of dead entries on a loaded machine), a third of the walk from the start.
        assert int(after) <= 2 * int(before) + 64 or 3 * int(after) <= int(from_start), output
        assert int(dead) >= 1000, output  # rows enough for the floors to matter


@pytest.mark.django_db(transaction=True)
def test_chaosjobs_refuses_bad_arguments_with_what_to_do() -> None:
    result = chaosjobs("--faults=restart", "--duration=1")
    assert result.returncode == 1
    assert "--allow-db-restart" in result.stderr
    result = chaosjobs("--workers=0")
    assert result.returncode != 0 and "at least 1" in result.stderr


@pytest.mark.django_db(transaction=True)
def test_a_trigger_never_waits_long_for_a_row_its_own_fault_keeps_locked() -> None:
    """A SIGSTOPped worker may hold its job's row in a fenced transaction; the run's loop,
    which sends its SIGCONT (a timer only a second later), must not wait for that lock:
    it gives the trigger up."""
    from django_pgjobs.chaos.jobs import KEYED_KIND
    from django_pgjobs.chaos.run import LOCK_WAIT_S, ChaosRun

    run = ChaosRun(ChaosConfig(duration=1, workers=1, jobs=0))
    shutil.rmtree(run.log_dir)  # no worker will write there
    run._trigger(0)  # the key's first job
    [job_id] = run.ledger.committed
    with other_connection(autocommit=False) as stopped_worker:
        stopped_worker.execute("SELECT 1 FROM pgjobs_job WHERE id = %s FOR UPDATE", [job_id])
        started = time.monotonic()
        run._trigger(0)  # would merge into that job: waits for its row
        waited = time.monotonic() - started
        stopped_worker.rollback()
    assert LOCK_WAIT_S <= waited < LOCK_WAIT_S + 3
    assert run.ledger.skipped_busy == 1
    assert run.ledger.last_triggers == {run._key(0): 1}  # the given-up trigger is not owed
    run._trigger(0)  # the lock is gone: merged
    assert run.ledger.last_triggers == {run._key(0): 3}
    assert count(where=f"kind = '{KEYED_KIND}'") == 1


@pytest.mark.skipif(not autofailover.available(), reason="needs Debian's pg_auto_failover")
def test_a_chaos_run_with_failovers_among_its_faults_keeps_every_invariant() -> None:
    """chaosjobs --failover: the pg_auto_failover monitor moves the primary to the other
    node every few seconds, among the other faults; the run reaches the servers through
    the formation's multi-host URL and judges every invariant as usual."""
    with autofailover.formation() as group:
        manage_py(suite_env(DATABASE_URL=group.url), "migrate", "--run-syncdb", "-v0")
        result = chaosjobs(
            "--duration=14",
            "--workers=2",
            "--jobs=60",
            "--rate=10",
            "--lease=3",
            "--fault-every=0.5",  # a round of every kind about every 4 s
            "--failover-every=5",
            f"--failover={group.failover_command()}",
            database_url=group.url,
            timeout=300,
        )
        output = result.stdout + result.stderr
        assert result.returncode == 0, output
        # Every round of faults deals one failover (the first at once): two or three in a
        # quiet run, one when a loaded machine slows the faults down.
        failovers = re.search(r"failover (\d+)", output.split("faults injected")[1])
        assert failovers and int(failovers.group(1)) >= 1, output
        for name in ("no job lost", "no ghost ran", "fencing", "keys", "attempts", "workflows"):
            assert re.search(rf"ok\s+{name}:", output), output
