"""S36 and S43, rehearsed on real servers: a primary and its standby in streaming
replication (tests/replication.py), or a pg_auto_failover monitor and two nodes
(tests/autofailover.py); two `runjobs` processes and an enqueuer reach them through
libpq's multi-host URL (`target_session_attrs=read-write`). Mid-drain the primary is
stopped hard and the standby promoted by hand, or killed (kill -9) or frozen (SIGSTOP)
whole and promoted by the monitor; nobody is told where the new primary is.

With synchronous replication nothing committed is lost (every enqueue that returned,
every job it made, runs) and every transaction-mode job takes effect exactly once. With
asynchronous replication the same is measured, not promised: what the standby had not
received is gone. The figures of each run are written to artifacts/failover-*.json.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any, Protocol

import psycopg
import pytest

from tests import autofailover, replication
from tests.spawn import ROOT, WorkerProcess, manage_py, suite_env, wait_for

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(not replication.available(), reason="needs Debian's PostgreSQL 15"),
]

needs_pg_auto_failover = pytest.mark.skipif(
    not autofailover.available(),
    reason="needs Debian's pg-auto-failover-cli and postgresql-15-auto-failover",
)

#: Jobs waiting when the workers start; the primary dies when about a third are done.
JOBS = 1200
ARTIFACTS = ROOT / "artifacts"

#: One job enqueued per transaction, as a request would, until the stop file appears;
#: each enqueue that returned is written down. A failed one is tried again on a new
#: connection (libpq finds whichever server takes writes).
ENQUEUER = """
import os, time
from pathlib import Path
from django.db import DatabaseError, connection, transaction
from django_pgjobs import guard_connections
from tests import jobs
ledger, stop = Path(os.environ["LEDGER"]).open("a"), Path(os.environ["STOP"])
n, refused = 1_000_000, 0
with guard_connections(5):  # a hung primary fails its transaction, as a dead one does
    while not stop.exists():
        try:
            with transaction.atomic():
                jobs.failover_effect.enqueue(n=n)
        except DatabaseError:
            refused += 1
            connection.close()
            time.sleep(0.05)
            continue
        ledger.write(f"{n}\\n")
        ledger.flush()
        n += 1
        time.sleep(0.01)
print(f"refused={refused}")
"""


#: The jobs waiting when the workers start: n = 0 .. JOBS - 1.
FILL = (
    "from django_pgjobs.models import Job; Job.objects.enqueue_many("
    f"[{{'kind': 'tests.failover_effect', 'payload': {{'n': i}}}} for i in range({JOBS})])"
)


def scalar(url: str, query: str) -> Any:
    with psycopg.connect(url, autocommit=True, connect_timeout=3) as conn:
        row = conn.execute(query).fetchone()
        return None if row is None else row[0]


def notes(url: str) -> int:
    return int(scalar(url, "SELECT count(*) FROM tests_note"))


class Servers(Protocol):
    """A primary and its standby, as the rehearsal sees them."""

    url: str  # libpq's multi-host URL: whichever server takes writes

    def wait_replayed(self) -> None: ...


def rehearse(
    servers: Servers, primary: str, fail: Callable[[], str], tmp_path: Path
) -> dict[str, Any]:
    """One failover mid-drain: `fail()` breaks the primary (at `primary`) and returns the
    URL of the server that took over once it takes writes. Return what happened, by the
    numbers."""
    env = suite_env(DATABASE_URL=servers.url, PYTHONUNBUFFERED="1")
    manage_py(env, "migrate", "--run-syncdb", "-v0")
    manage_py(env, "shell", "-c", FILL)
    servers.wait_replayed()
    ledger, stop = tmp_path / "ledger", tmp_path / "stop"
    ledger.touch()
    enqueuer = subprocess.Popen(
        [sys.executable, "manage.py", "shell", "-c", ENQUEUER],
        cwd=ROOT,
        env={**env, "LEDGER": str(ledger), "STOP": str(stop)},
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    workers = [
        WorkerProcess(
            "--queue",
            "failover",
            "--concurrency",
            "4",
            "--poll-interval",
            "0.5",
            extra_env={"DATABASE_URL": servers.url, "PGJOBS_TEST_LOG_LEVEL": "INFO"},
        )
        for _ in range(2)
    ]
    try:
        wait_for(lambda: notes(primary) >= JOBS // 3, timeout=60, what="a third done")
        killed = time.monotonic()
        new_primary = fail()
        promoted = time.monotonic()
        at_promotion = notes(new_primary)
        wait_for(
            lambda: notes(new_primary) > at_promotion,
            timeout=120,
            interval=0.01,
            what="a job completed on the new primary",
        )
        first_completion = time.monotonic()
        before = len(ledger.read_text().split())
        wait_for(
            lambda: len(ledger.read_text().split()) >= before + 20,
            timeout=60,
            what="enqueues on the new primary",
        )
        stop.touch()
        enqueuer_output, _ = enqueuer.communicate(timeout=60)
        assert enqueuer.returncode == 0, enqueuer_output
        wait_for(
            lambda: scalar(new_primary, "SELECT count(*) FROM pgjobs_job") == 0,
            timeout=180,
            interval=0.2,
            what="the queue drained on the new primary",
        )
        drained = time.monotonic()
        for worker in workers:
            worker.signal(signal.SIGTERM)
        for worker in workers:
            assert worker.wait(60) == 0, worker.output()
        logs = "".join(worker.output() for worker in workers)
        with psycopg.connect(new_primary, autocommit=True) as conn:
            effects = Counter(int(text) for (text,) in conn.execute("SELECT text FROM tests_note"))
            dead = conn.execute("SELECT count(*) FROM pgjobs_dead").fetchone()
    finally:
        stop.touch()
        if enqueuer.poll() is None:
            enqueuer.kill()
        for worker in workers:
            worker.close()
    committed = set(range(JOBS)) | {int(line) for line in ledger.read_text().split()}
    done_ids = Counter(re.findall(r"job done id=(\d+)", logs))
    return {
        "jobs enqueued and acknowledged": len(committed),
        "enqueues refused during the failover": int(
            re.search(r"refused=(\d+)", enqueuer_output).group(1)  # type: ignore[union-attr]
        ),
        "failover (kill -> standby promoted), s": round(promoted - killed, 3),
        "primary's death -> first job completed on the new primary, s": round(
            first_completion - killed, 3
        ),
        "primary's death -> queue drained, s": round(drained - killed, 3),
        "acknowledged jobs lost": len(committed - set(effects)),
        "acknowledged jobs lost, ids": sorted(committed - set(effects))[:20],
        "jobs with more than one effect": sorted(n for n, times in effects.items() if times > 1),
        "dead letters": dead[0] if dead else None,
        "runs logged done twice (an outcome lost with the primary)": sum(
            1 for times in done_ids.values() if times > 1
        ),
    }


def record(name: str, figures: dict[str, Any]) -> None:
    ARTIFACTS.mkdir(exist_ok=True)
    path = ARTIFACTS / f"failover-{name}.json"
    path.write_text(json.dumps(figures, indent=2) + "\n")
    print(json.dumps(figures, indent=2))


def crash_and_promote(pair: replication.ReplicatedPair, *, standby_behind_s: float = 0) -> str:
    """Stop the primary hard and promote its standby by hand. `standby_behind_s`: the
    standby receives nothing for that long before the primary dies (the primary's WAL
    sender is stopped, then killed with it), as a standby that lags does."""
    if standby_behind_s:
        sender = scalar(pair.primary.url, "SELECT pid FROM pg_stat_replication")
        os.kill(sender, signal.SIGSTOP)
        time.sleep(standby_behind_s)
        os.kill(sender, signal.SIGKILL)  # what it held back dies with the primary
    pair.kill_primary()
    pair.promote()
    return pair.standby.url


def test_s36_a_synchronous_standby_promoted_mid_drain_loses_nothing_and_runs_each_once(
    tmp_path: Path,
) -> None:
    with replication.replicated_pair(synchronous=True) as pair:
        figures = rehearse(pair, pair.primary.url, lambda: crash_and_promote(pair), tmp_path)
    record("synchronous", figures)
    assert_nothing_lost(figures)


def assert_nothing_lost(figures: dict[str, Any]) -> None:
    assert figures["acknowledged jobs lost"] == 0
    assert figures["jobs with more than one effect"] == []
    assert figures["dead letters"] == 0
    assert figures["runs logged done twice (an outcome lost with the primary)"] == 0
    assert figures["jobs enqueued and acknowledged"] > JOBS  # the enqueuer went on


def test_s36_with_asynchronous_replication_what_is_lost_is_measured_and_nothing_runs_twice(
    tmp_path: Path,
) -> None:
    with replication.replicated_pair(synchronous=False) as pair:
        figures = rehearse(
            pair,
            pair.primary.url,
            lambda: crash_and_promote(pair, standby_behind_s=1.0),
            tmp_path,
        )
    record("asynchronous", {"standby behind by, s": 1.0, **figures})
    # What the standby never received is gone: enqueues the primary acknowledged (their
    # jobs never run) and outcomes it recorded (those jobs run again) ...
    assert figures["acknowledged jobs lost"] > 0, "a second of WAL missing lost nothing?"
    # ... but what it holds is whole: no effect twice, nothing stranded, and the workers
    # and the enqueuer found it by themselves.
    assert figures["jobs with more than one effect"] == []
    assert figures["jobs enqueued and acknowledged"] > JOBS


def rehearse_with_pg_auto_failover(
    fault: Callable[[autofailover.Formation, autofailover.Node], None], tmp_path: Path
) -> dict[str, Any]:
    """The rehearsal on a pg_auto_failover formation: `fault` breaks the primary node,
    and its monitor promotes the other."""
    with autofailover.formation() as group:
        primary = group.primary()

        def fail() -> str:
            fault(group, primary)
            standby = group.other(primary)
            group.wait_promoted(standby)
            return standby.url

        return rehearse(group, primary.url, fail, tmp_path)


@needs_pg_auto_failover
def test_s36_pg_auto_failover_promotes_by_itself_when_the_primary_is_killed_mid_drain(
    tmp_path: Path,
) -> None:
    figures = rehearse_with_pg_auto_failover(autofailover.Formation.kill, tmp_path)
    record("pg_auto_failover-kill", figures)
    assert_nothing_lost(figures)


@needs_pg_auto_failover
def test_s43_a_frozen_primary_is_given_up_and_the_drain_goes_on_on_the_new_one(
    tmp_path: Path,
) -> None:
    figures = rehearse_with_pg_auto_failover(autofailover.Formation.freeze, tmp_path)
    record("pg_auto_failover-freeze", figures)
    assert_nothing_lost(figures)
