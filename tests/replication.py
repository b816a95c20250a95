"""Two real PostgreSQL servers in streaming replication, for a test's length.

Debian's PostgreSQL 15 binaries: a primary made with initdb and a standby made from it
with `pg_basebackup -R`, on free loopback ports, in a temporary directory removed at the
end. As root they run as an unprivileged account, as the embedded PostgreSQL does. With
`synchronous=True` the primary names the standby in `synchronous_standby_names`, so a
commit returns only once the standby has flushed it.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psycopg

from django_pgjobs.testing.localdb import DEFAULT_RUN_AS, free_port

BIN = Path("/usr/lib/postgresql/15/bin")
DATABASE = "jobs"


def available() -> bool:
    return all((BIN / tool).exists() for tool in ("initdb", "pg_ctl", "pg_basebackup"))


@dataclass
class Server:
    name: str
    data: Path
    port: int

    @property
    def url(self) -> str:
        return f"postgresql://postgres@127.0.0.1:{self.port}/{DATABASE}"


class ReplicatedPair:
    """A primary and its standby; `url` reaches whichever of them accepts writes."""

    def __init__(self, root: Path, *, synchronous: bool) -> None:
        self.root = root
        self.synchronous = synchronous
        self.primary = Server("primary", root / "primary", free_port())
        self.standby = Server("standby", root / "standby", free_port())
        self._running: set[str] = set()

    @property
    def url(self) -> str:
        """libpq's multi-host form: the first of the two that takes writes."""
        hosts = ",".join(f"127.0.0.1:{s.port}" for s in (self.primary, self.standby))
        return f"postgresql://postgres@{hosts}/{DATABASE}?target_session_attrs=read-write"

    # Setting up -------------------------------------------------------------------------

    def start(self) -> None:
        primary, standby = self.primary, self.standby
        self._run(
            "initdb",
            "-D",
            str(primary.data),
            "-U",
            "postgres",
            "-A",
            "trust",
            "-E",
            "UTF8",
            "--locale=C",
            "--no-sync",
        )
        settings = {
            "listen_addresses": "'127.0.0.1'",
            "port": str(primary.port),
            "unix_socket_directories": "''",
            "wal_level": "replica",
            "max_wal_senders": "5",
            "hot_standby": "on",
            "fsync": "off",  # a process killed hard loses nothing the OS holds
            "shared_buffers": "32MB",
            "max_connections": "60",
        }
        append_settings(primary.data / "postgresql.conf", settings)
        self._pg_ctl(primary, "start")
        with psycopg.connect(
            f"postgresql://postgres@127.0.0.1:{primary.port}/postgres", autocommit=True
        ) as conn:
            conn.execute(f"CREATE DATABASE {DATABASE}")
        self._run(
            "pg_basebackup",
            "-h",
            "127.0.0.1",
            "-p",
            str(primary.port),
            "-U",
            "postgres",
            "-D",
            str(standby.data),
            "-R",
            "-X",
            "stream",
            "-c",
            "fast",
            "--no-sync",
        )
        append_settings(
            standby.data / "postgresql.conf",
            {
                "port": str(standby.port),
                "primary_conninfo": (
                    f"'host=127.0.0.1 port={primary.port} user=postgres application_name=standby'"
                ),
            },
        )
        # pg_basebackup -R wrote a primary_conninfo of its own there; ours names the standby.
        (standby.data / "postgresql.auto.conf").write_text("")
        self._pg_ctl(standby, "start")
        if self.synchronous:  # named only now: until the standby streams, commits would wait
            with psycopg.connect(self.primary.url, autocommit=True) as conn:
                conn.execute("ALTER SYSTEM SET synchronous_standby_names = 'standby'")
                conn.execute("SELECT pg_reload_conf()")
        self.wait_streaming()

    def wait_streaming(self, timeout: float = 60) -> None:
        wanted = "sync" if self.synchronous else "async"
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            with psycopg.connect(self.primary.url, autocommit=True) as conn:
                states = conn.execute(
                    "SELECT state, sync_state FROM pg_stat_replication"
                    " WHERE application_name = 'standby'"
                ).fetchall()
            if states == [("streaming", wanted)]:
                return
            time.sleep(0.1)
        raise AssertionError(f"the standby did not stream ({wanted}) within {timeout} s")

    def wait_replayed(self, timeout: float = 60) -> None:
        """Until the standby has replayed everything the primary wrote so far."""
        wait_replayed(self.primary.url, self.standby.url, timeout)

    # The failover -----------------------------------------------------------------------

    def kill_primary(self) -> None:
        """Stop the primary hard: every backend dies at once, as in a crash."""
        self._pg_ctl(self.primary, "stop", "-m", "immediate")

    def promote(self) -> None:
        """Promote the standby, and wait until it takes writes."""
        self._run("pg_ctl", "-D", str(self.standby.data), "-w", "-t", "60", "promote")

    def stop(self) -> None:
        for server in (self.standby, self.primary):
            if server.name in self._running:
                with suppress(subprocess.CalledProcessError):
                    self._pg_ctl(server, "stop", "-m", "fast")

    def log(self, server: Server) -> str:
        path = self.root / f"{server.name}.log"
        return path.read_text(errors="replace") if path.exists() else ""

    # Running the binaries -----------------------------------------------------------------

    def _pg_ctl(self, server: Server, action: str, *args: str) -> None:
        log = self.root / f"{server.name}.log"
        self._run("pg_ctl", "-D", str(server.data), "-l", str(log), "-w", "-t", "60", action, *args)
        if action == "start":
            self._running.add(server.name)
        elif action == "stop":
            self._running.discard(server.name)

    def _run(self, tool: str, *args: str) -> None:
        # Output to a file, not a pipe: a server pg_ctl starts would hold a pipe open.
        with tempfile.TemporaryFile(mode="w+") as output:
            result = subprocess.run(
                [str(BIN / tool), *args],
                stdin=subprocess.DEVNULL,
                stdout=output,
                stderr=subprocess.STDOUT,
                timeout=120,
                **as_owner(),
            )
            if result.returncode != 0:
                output.seek(0)
                raise subprocess.CalledProcessError(result.returncode, [tool, *args], output.read())


def wait_replayed(primary: str, standby: str, timeout: float = 60) -> None:
    """Until the server at `standby` has replayed everything `primary` wrote so far."""
    with psycopg.connect(primary, autocommit=True) as conn:
        (target,) = conn.execute("SELECT pg_current_wal_lsn()").fetchone() or (None,)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        with psycopg.connect(standby, autocommit=True) as conn:
            (behind,) = conn.execute(
                "SELECT pg_wal_lsn_diff(%s, pg_last_wal_replay_lsn()) > 0", [target]
            ).fetchone() or (True,)
        if not behind:
            return
        time.sleep(0.05)
    raise AssertionError(f"the standby did not catch up within {timeout} s")


@contextmanager
def replicated_pair(*, synchronous: bool) -> Iterator[ReplicatedPair]:
    """Start a primary and its standby; stop both and remove their data at the end."""
    with servers_root("pgjobs-replication-") as root:
        pair = ReplicatedPair(root, synchronous=synchronous)
        try:
            pair.start()
            yield pair
        finally:
            pair.stop()


@contextmanager
def servers_root(prefix: str) -> Iterator[Path]:
    """A temporary directory for servers' data, owned by the account they run as, and
    removed at the end."""
    root = Path(tempfile.mkdtemp(prefix=prefix))
    owner = as_owner()
    if owner:
        os.chown(root, owner["user"], owner["group"])
    try:
        yield root
    finally:
        shutil.rmtree(root, ignore_errors=True)


def as_owner() -> dict[str, Any]:
    """subprocess arguments that run a server's tools as an unprivileged account (as root)."""
    if os.geteuid() != 0:
        return {}
    import pwd

    account = pwd.getpwnam(os.environ.get("EMBEDDED_PG_USER", DEFAULT_RUN_AS))
    return {"user": account.pw_uid, "group": account.pw_gid, "extra_groups": []}


def append_settings(path: Path, settings: dict[str, str]) -> None:
    with path.open("a") as conf:
        conf.write("\n# tests/replication.py\n")
        for name, value in settings.items():
            conf.write(f"{name} = {value}\n")
