"""Peers in the same run (`python -m bench --peers`), each pinned, installed under
bench/.peers/ (gitignored), its schema installed by its own API in a scratch database of
its own, its worker started as its users start it, and each of our figures printed as a
ratio to its:

- PgQueuer, the fastest at draining: into a venv of its own; its side is
  bench/pgqueuer_peer.py, run by that venv's interpreter (`pgq run` for its worker);
- graphile-worker, the fastest at waking: from the npm registry, run by Node; its side
  is bench/graphile_peer.cjs (its `run` for its worker). Only its wake-up is compared.

The pure pieces here (`compare`, `compare_wake`, `percentiles`, `drain_rate`) are
unit-tested.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit, urlunsplit

import psycopg

from bench.harness import BENCH_DATABASE, ROOT, Database, Figure, wait_for

if TYPE_CHECKING:
    from bench.suite import Sizes

PGQUEUER_VERSION = "1.6.0"
#: What the peer's venv gets. typer is held below 0.20: with typer 0.29 (what pip picks
#: today) `pgq run` of PgQueuer 1.6.0 fails at start in setup_fancy_logger
#: ("'str' object has no attribute 'name'": its --log-level parser no longer yields the
#: enum), so its users would pin it the same way.
PGQUEUER_REQUIREMENTS = (f"pgqueuer[asyncpg]=={PGQUEUER_VERSION}", "typer<0.20")
PEERS_DIR = ROOT / "bench" / ".peers"
PEER_SCRIPT = ROOT / "bench" / "pgqueuer_peer.py"
#: PgQueuer's drain grid: (processes, batch size); batch 10 is its default.
PGQUEUER_GRID = ((1, 10), (1, 100), (2, 10), (2, 100))
PEER = f"PgQueuer {PGQUEUER_VERSION}"
GRAPHILE_VERSION = "0.17.3"
GRAPHILE = f"graphile-worker {GRAPHILE_VERSION}"
GRAPHILE_SCRIPT = ROOT / "bench" / "graphile_peer.cjs"


def percentiles(latencies_ms: Iterable[float]) -> dict[str, float]:
    """p50, p95, p99 and max of latencies, by the suite's nearest-rank rule."""
    ordered = sorted(latencies_ms)
    if not ordered:
        raise ValueError("no latencies")

    def at(p: float) -> float:
        return ordered[min(len(ordered) - 1, round(p * (len(ordered) - 1)))]

    return {"p50": at(0.50), "p95": at(0.95), "p99": at(0.99), "max": ordered[-1]}


def drain_rate(window: dict[str, Any], n: int) -> float:
    """Jobs per second between a drain's first pick and last success (server clock);
    refuses a drain that did not finish every job."""
    if window["successful"] != n:
        raise RuntimeError(f"PgQueuer finished {window['successful']} of {n} jobs")
    return n / (float(window["last_success"]) - float(window["first_pick"]))


def _find(figures: Iterable[Figure], benchmark: str, prefix: str) -> Figure | None:
    for figure in figures:
        if figure.benchmark == benchmark and figure.name.startswith(prefix):
            return figure
    return None


def _best(figures: Iterable[Figure], benchmark: str, prefix: str) -> Figure | None:
    matching = [f for f in figures if f.benchmark == benchmark and f.name.startswith(prefix)]
    return max(matching, key=lambda f: f.value, default=None)


#: (name, our figure, the peer's, the ratio bound of the target or None, whether
#: higher is better: the bound is then a floor, else a ceiling).
_Pair = tuple[str, Figure | None, Figure | None, float | None, bool]


def compare(ours: list[Figure], theirs: list[Figure]) -> list[Figure]:
    """Each of our figures beside the peer's, as a Figure whose ceiling is the peer's
    (so the table's ratio column reads ours / theirs). Drain: higher is better; wake:
    lower is better. Figures missing on either side are left out."""
    pairs: list[_Pair] = [
        (
            "drain, 1 process, defaults (fresh) / its default (batch 10)",
            _find(ours, "drain", "1 process, default settings, fresh table"),
            _find(theirs, "pgqueuer", "drain, 1 process, batch 10"),
            None,
            True,
        ),
        (
            "drain, 1 process, defaults (fresh) / its best 1-process setting",
            _find(ours, "drain", "1 process, default settings, fresh table"),
            _best(theirs, "pgqueuer", "drain, 1 process"),
            1.2,
            True,
        ),
        (
            "drain, best of grid (fresh, <= 4 processes) / its best (<= 2 processes)",
            _find(ours, "drain", "best of grid, fresh table"),
            _best(theirs, "pgqueuer", "drain, "),
            1.5,
            True,
        ),
        (
            "enqueue, one per transaction (autocommit)",
            _find(ours, "enqueue", "enqueue, one per transaction (autocommit)"),
            _find(theirs, "pgqueuer", "enqueue, one per transaction (autocommit)"),
            1.0,
            True,
        ),
        (
            "enqueue, bulk (enqueue_many / its enqueue of lists)",
            _find(ours, "enqueue", "enqueue_many"),
            _find(theirs, "pgqueuer", "enqueue, bulk"),
            1.0,
            True,
        ),
        (
            "wake p50, commit -> handler (lower is better)",
            _find(ours, "wake", "p50"),
            _find(theirs, "pgqueuer", "wake p50"),
            None,
            False,
        ),
        (
            "wake p99, commit -> handler (lower is better)",
            _find(ours, "wake", "p99"),
            _find(theirs, "pgqueuer", "wake p99"),
            None,
            False,
        ),
    ]
    return _beside(pairs, PEER)


def compare_wake(ours: list[Figure], theirs: list[Figure], peer: str) -> list[Figure]:
    """Our wake-up (commit -> handler) beside a peer's `wake p50` / `wake p99`, as
    `compare` sets them (ratio ours / theirs, lower is better); the p50 is met when ours
    is at or below its (issue 28's target against graphile-worker)."""
    return _beside(
        [
            (
                f"wake {name}, commit -> handler (lower is better)",
                _find(ours, "wake", name),
                next((f for f in theirs if f.name == f"wake {name}"), None),
                bound,
                False,
            )
            for name, bound in (("p50", 1.0), ("p99", None))
        ],
        peer,
    )


def _beside(pairs: list[_Pair], peer: str) -> list[Figure]:
    """Each pair whose both figures exist, as a Figure of "vs `peer`" whose ceiling is
    the peer's value (the table's ratio reads ours / theirs), met when the ratio keeps
    its bound."""
    compared = []
    for name, mine, theirs, bound, higher_is_better in pairs:
        if mine is None or theirs is None:
            continue
        target, met = "", None
        if bound is not None and theirs.value:
            if higher_is_better:
                target, met = f">= {bound:g}x", mine.value >= bound * theirs.value
            else:
                target, met = f"<= {bound:g}x", mine.value <= bound * theirs.value
        compared.append(
            Figure(
                f"vs {peer}",
                name,
                mine.value,
                mine.unit,
                ceiling=theirs.value,
                target=target,
                met=met,
                details={
                    "ours": f"{mine.benchmark}: {mine.name}",
                    "theirs": theirs.name,
                    "higher is better": higher_is_better,
                },
                ratio_style="times",
            )
        )
    return compared


def wake_latencies(
    start_worker: Callable[[Path], subprocess.Popen[str]],
    trickle: Callable[[int, float], str],
    jobs: int,
    gap_s: float,
    who: str,
) -> list[float]:
    """A peer's wake-up, commit -> handler in ms: its idle worker (started with the file
    its `stamp` handler writes "job_id wall_clock" lines to), then `jobs` single
    enqueues `gap_s` apart, each its own transaction (`trickle` returns {job id: commit
    wall clock} as JSON). One job first, not measured: once its stamp is there, the
    worker listens."""
    with tempfile.NamedTemporaryFile("r", suffix=".stamps", delete=False) as stamps:
        path = Path(stamps.name)
    worker = start_worker(path)
    try:
        trickle(1, 0)
        wait_for(lambda: _lines(path) >= 1, timeout=60, what=f"{who}'s first stamp")
        time.sleep(0.5)
        committed = json.loads(trickle(jobs, gap_s))
        wait_for(lambda: _lines(path) >= jobs + 1, 60, what=f"every {who} stamp")
    finally:
        worker.terminate()
        try:
            worker.communicate(timeout=30)
        except subprocess.TimeoutExpired:
            worker.kill()
            worker.communicate()
    started = dict(line.split() for line in path.read_text().splitlines())
    path.unlink(missing_ok=True)
    return [(float(started[job_id]) - at) * 1000 for job_id, at in committed.items()]


def _scratch_database(admin_url: str, name: str) -> str:
    """(Re)create database `name` on the server of `admin_url`; its URL."""
    with psycopg.connect(admin_url, autocommit=True) as admin:
        admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        admin.execute(f'CREATE DATABASE "{name}"')
    return urlunsplit(urlsplit(admin_url)._replace(path=f"/{name}"))


def _drop_database(admin_url: str, name: str) -> None:
    with psycopg.connect(admin_url, autocommit=True) as admin:
        admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


class PgQueuerPeer:
    """PgQueuer in its own venv, on a scratch database of its own on our server."""

    def __init__(self, database: Database) -> None:
        self.admin_url = database.admin_url
        self.name = os.environ.get("PGJOBS_BENCH_PEER_DATABASE", f"{BENCH_DATABASE}_pgqueuer")
        parts = urlsplit(database.admin_url)
        self.url = urlunsplit(parts._replace(path=f"/{self.name}"))
        self.venv = PEERS_DIR / f"pgqueuer-{PGQUEUER_VERSION}"

    # Setup -------------------------------------------------------------------------

    def prepare(self) -> None:
        """Install PgQueuer into its venv (once), create its database, install its schema."""
        if not (self.venv / "bin" / "pgq").exists():
            print(f"   installing {PEER} into {self.venv}", file=sys.stderr, flush=True)
            subprocess.run([sys.executable, "-m", "venv", str(self.venv)], check=True)
            subprocess.run(
                [str(self.venv / "bin" / "pip"), "install", "-q", *PGQUEUER_REQUIREMENTS],
                check=True,
            )
        _scratch_database(self.admin_url, self.name)
        self._script("install")

    def drop(self) -> None:
        _drop_database(self.admin_url, self.name)

    # Measurements ------------------------------------------------------------------

    def drain(self, n: int, processes: int, batch: int) -> float:
        """Fill `n` no-op jobs through its bulk enqueue, then drain them straight after
        with `processes` x `pgq run --mode drain --batch-size batch`; jobs per second."""
        self._script("reset")
        self._script("fill", str(n))
        workers = [
            self._worker("--mode", "drain", "--batch-size", str(batch)) for _ in range(processes)
        ]
        for worker in workers:
            _, err = worker.communicate(timeout=max(600, n / 200))
            if worker.returncode != 0:
                raise RuntimeError(f"pgq run exited {worker.returncode}:\n{err[-3000:]}")
        return drain_rate(json.loads(self._script("window")), n)

    def enqueue_rates(self, singles: int, bulk: int) -> dict[str, float]:
        """Jobs per second of its enqueue one per transaction (autocommit), and of its
        bulk enqueue, on an empty table."""
        self._script("reset")
        rates: dict[str, float] = json.loads(self._script("rates", str(singles), str(bulk)))
        self._script("reset")
        return rates

    def wake(self, jobs: int, gap_s: float) -> list[float]:
        """An idle `pgq run` worker; `jobs` single enqueues; commit -> handler, in ms."""
        self._script("reset")
        return wake_latencies(
            lambda path: self._worker(env={"PEER_STAMPS": str(path)}),
            lambda n, gap: self._script("trickle", str(n), str(gap)),
            jobs,
            gap_s,
            "PgQueuer",
        )

    # Plumbing ----------------------------------------------------------------------

    def _env(self, extra: dict[str, str] | None = None) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if not k.startswith(("DJANGO", "PGJOBS"))}
        env.pop("DATABASE_URL", None)
        env.pop("VIRTUAL_ENV", None)
        return {**env, "PGDSN": self.url, "PYTHONPATH": str(PEER_SCRIPT.parent), **(extra or {})}

    def _script(self, *args: str) -> str:
        done = subprocess.run(
            [str(self.venv / "bin" / "python"), str(PEER_SCRIPT), *args],
            env=self._env(),
            capture_output=True,
            text=True,
            timeout=600,
        )
        if done.returncode != 0:
            raise RuntimeError(f"pgqueuer_peer.py {' '.join(args)}:\n{done.stderr[-3000:]}")
        return done.stdout

    def _worker(self, *args: str, env: dict[str, str] | None = None) -> subprocess.Popen[str]:
        return subprocess.Popen(
            [str(self.venv / "bin" / "pgq"), "run", "pgqueuer_peer:factory", *args],
            cwd=PEER_SCRIPT.parent,
            env=self._env(env),
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
        )


class GraphilePeer:
    """graphile-worker under Node, installed from npm, on a scratch database of its own."""

    def __init__(self, database: Database) -> None:
        self.admin_url = database.admin_url
        self.name = os.environ.get("PGJOBS_BENCH_GRAPHILE_DATABASE", f"{BENCH_DATABASE}_graphile")
        self.url = ""
        self.modules = PEERS_DIR / f"graphile-worker-{GRAPHILE_VERSION}" / "node_modules"

    def prepare(self) -> None:
        """Install graphile-worker with npm (once), create its database, migrate it."""
        missing = [tool for tool in ("node", "npm") if shutil.which(tool) is None]
        if missing:
            raise RuntimeError(
                f"{GRAPHILE} runs under Node: install {' and '.join(missing)} (Debian: "
                "apt-get install nodejs npm), or leave out --peers"
            )
        if not (self.modules / "graphile-worker").exists():
            print(f"   installing {GRAPHILE} into {self.modules.parent}", file=sys.stderr)
            self.modules.parent.mkdir(parents=True, exist_ok=True)
            subprocess.run(
                ["npm", "install", "--no-audit", "--no-fund", "--silent",
                 f"graphile-worker@{GRAPHILE_VERSION}"],
                cwd=self.modules.parent,
                check=True,
                timeout=600,
            )  # fmt: skip
        self.url = _scratch_database(self.admin_url, self.name)
        self._script("install")

    def drop(self) -> None:
        _drop_database(self.admin_url, self.name)

    def wake(self, jobs: int, gap_s: float) -> list[float]:
        """An idle worker at its defaults; `jobs` single add_job calls; commit -> task."""
        return wake_latencies(
            lambda path: subprocess.Popen(
                ["node", str(GRAPHILE_SCRIPT), "run"],
                env=self._env({"PEER_STAMPS": str(path)}),
                stdout=subprocess.DEVNULL,
                stderr=subprocess.PIPE,
                text=True,
            ),
            lambda n, gap: self._script("trickle", str(n), str(gap)),
            jobs,
            gap_s,
            "graphile-worker",
        )

    def _env(self, extra: dict[str, str] | None = None) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if not k.startswith(("DJANGO", "PGJOBS"))}
        return {**env, "DATABASE_URL": self.url, "NODE_PATH": str(self.modules), **(extra or {})}

    def _script(self, *args: str) -> str:
        done = subprocess.run(
            ["node", str(GRAPHILE_SCRIPT), *args],
            env=self._env(),
            capture_output=True,
            text=True,
            timeout=600,
        )
        if done.returncode != 0:
            raise RuntimeError(f"graphile_peer.cjs {' '.join(args)}:\n{done.stderr[-3000:]}")
        return done.stdout


def graphile(database: Database, sizes: Sizes) -> list[Figure]:
    """graphile-worker's wake latency with as many jobs and the same gap as ours."""
    peer = GraphilePeer(database)
    peer.prepare()
    try:
        latencies = peer.wake(sizes.wake_jobs, sizes.wake_gap_s)
    finally:
        peer.drop()
    details = {
        "jobs": sizes.wake_jobs,
        "gap_ms": sizes.wake_gap_s * 1000,
        "worker": "run() at its defaults (concurrency 1, LISTEN, 2 s poll)",
        "enqueue": "graphile_worker.add_job, one per transaction",
    }
    return [
        Figure("graphile", f"wake {name}", value, "ms", details=details)
        for name, value in percentiles(latencies).items()
    ]


def _lines(path: Path) -> int:
    return len(path.read_text().splitlines())


def pgqueuer(database: Database, sizes: Sizes) -> list[Figure]:
    """PgQueuer's drain (batch 10 and 100, 1 and 2 processes) of as many jobs as ours, on
    a fresh table; its enqueue, one per transaction and in bulk, of as many as ours; and
    its wake latency with as many jobs and the same gap as ours."""
    peer = PgQueuerPeer(database)
    peer.prepare()
    try:
        figures = []
        for processes, batch in PGQUEUER_GRID:
            rate = peer.drain(sizes.drain, processes, batch)
            figures.append(
                Figure(
                    "pgqueuer",
                    f"drain, {processes} process{'es' if processes > 1 else ''}, batch {batch}",
                    rate,
                    "jobs/s",
                    details={
                        "jobs": sizes.drain,
                        "fill": "Queries.enqueue of lists (its bulk API)",
                        "table": "fresh table",
                        "worker": f"pgq run --mode drain --batch-size {batch}",
                    },
                )
            )
        rates = peer.enqueue_rates(sizes.enqueue_singles, sizes.enqueue_many)
        figures += [
            Figure(
                "pgqueuer",
                "enqueue, one per transaction (autocommit)",
                rates["single"],
                "jobs/s",
                details={"jobs": sizes.enqueue_singles, "api": "Queries.enqueue of one job"},
            ),
            Figure(
                "pgqueuer",
                "enqueue, bulk",
                rates["bulk"],
                "jobs/s",
                details={"jobs": sizes.enqueue_many, "api": "Queries.enqueue of lists"},
            ),
        ]
        latencies = peer.wake(sizes.wake_jobs, sizes.wake_gap_s)
        details = {"jobs": sizes.wake_jobs, "gap_ms": sizes.wake_gap_s * 1000}
        for name, value in percentiles(latencies).items():
            figures.append(Figure("pgqueuer", f"wake {name}", value, "ms", details=details))
    finally:
        peer.drop()
    return figures
