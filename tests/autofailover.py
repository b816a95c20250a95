"""A pg_auto_failover formation for a test's length: a monitor and two PostgreSQL 15 nodes.

Debian's `pg_autoctl` (packages `pg-auto-failover-cli` and `postgresql-15-auto-failover`)
runs each of the three as an operator would, on free loopback ports, in a temporary
directory removed at the end. As root every process runs as an unprivileged account, as
tests/replication.py does. The monitor checks the nodes' health and promotes the
secondary by itself when the primary stops answering; nobody calls `pg_ctl promote`.

Its timings are shortened so that a failover takes seconds, not the minute of the
defaults (`MONITOR_SETTINGS`); docs/how-to/failover.md says what they trade.
"""

from __future__ import annotations

import os
import signal
import subprocess
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager, suppress
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO

import psycopg

from django_pgjobs.testing.localdb import DEFAULT_RUN_AS, free_port
from tests.replication import (
    BIN,
    DATABASE,
    Server,
    append_settings,
    as_owner,
    servers_root,
    wait_replayed,
)

PG_AUTOCTL = Path("/usr/bin/pg_autoctl")

#: The monitor's health checks: a node is unhealthy after about 2 s without answers
#: (defaults: 5 s period, 5 s timeout, 2 retries 2 s apart, 20 s without a report), and
#: a secondary waits 3 s (default 30 s) for an unreachable primary to demote itself
#: before it takes writes. The keepers of this formation are killed or frozen with their
#: servers, so nothing can write on the old primary meanwhile.
MONITOR_SETTINGS = {
    "pgautofailover.health_check_period": "500",
    "pgautofailover.health_check_timeout": "1000",
    "pgautofailover.health_check_max_retries": "1",
    "pgautofailover.health_check_retry_delay": "250",
    "pgautofailover.node_considered_unhealthy_timeout": "2000",
    "pgautofailover.primary_demote_timeout": "3000",
}


def available() -> bool:
    return PG_AUTOCTL.exists() and (BIN / "initdb").exists()


@dataclass
class Node(Server):
    """A server of the formation, and the pg_autoctl that runs it."""

    process: subprocess.Popen[bytes] | None = field(default=None, repr=False)


class Formation:
    """A monitor and two nodes; `url` reaches whichever node takes writes."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.sockets = root / "sockets"
        self.monitor = Node("monitor", root / "monitor", free_port())
        self.nodes = [Node(f"node{i}", root / f"node{i}", free_port()) for i in (1, 2)]
        self._logs: list[IO[bytes]] = []

    @property
    def url(self) -> str:
        """libpq's multi-host form, as `pg_autoctl show uri --formation default` gives it."""
        hosts = ",".join(f"127.0.0.1:{node.port}" for node in self.nodes)
        return f"postgresql://postgres@{hosts}/{DATABASE}?target_session_attrs=read-write"

    @property
    def monitor_url(self) -> str:
        return f"postgresql://postgres@127.0.0.1:{self.monitor.port}/pg_auto_failover"

    # Setting up -------------------------------------------------------------------------

    def start(self, timeout: float = 120) -> None:
        self.sockets.mkdir()
        self._chown(self.sockets)
        self._initdb(self.monitor)
        self._run_autoctl(self.monitor, "monitor")
        self._wait(self._monitor_answers, timeout, "the monitor to start", setting_up=True)
        with psycopg.connect(self.monitor_url, autocommit=True) as conn:
            for name, value in MONITOR_SETTINGS.items():
                conn.execute(f"ALTER SYSTEM SET {name} = {value}")
            conn.execute("SELECT pg_reload_conf()")
        first, second = self.nodes
        self._initdb(first)
        self._run_autoctl(first, "postgres")
        self._wait(
            lambda: self.states().get(first.name) == "single",
            timeout,
            "node1 single",
            setting_up=True,
        )
        self._run_autoctl(second, "postgres")
        # The secondary's pg_basebackup waits for a checkpoint, which the defaults spread
        # over minutes: ask for one until the secondary streams.
        self._wait(
            lambda: (
                self._checkpoint(first)
                and self.states()
                == {
                    first.name: "primary",
                    second.name: "secondary",
                }
            ),
            timeout,
            "node1 primary and node2 its secondary",
            interval=0.5,
            setting_up=True,
        )

    def states(self) -> dict[str, str]:
        """Each node's state as the monitor last heard it (primary, secondary, ...)."""
        with psycopg.connect(self.monitor_url, autocommit=True, connect_timeout=3) as conn:
            rows = conn.execute("SELECT nodename, reportedstate FROM pgautofailover.node")
            return {str(name): str(state) for name, state in rows}

    def primary(self) -> Node:
        """The node that takes writes now."""
        for node in self.nodes:
            if ask(node.url, "SELECT pg_is_in_recovery()") == (False,):
                return node
        raise AssertionError("no node of the formation takes writes")

    def other(self, node: Node) -> Node:
        return next(each for each in self.nodes if each is not node)

    def wait_replayed(self) -> None:
        primary = self.primary()
        wait_replayed(primary.url, self.other(primary).url)

    def failover_command(self) -> str:
        """A shell command that has the monitor fail the primary over to its secondary
        and returns once the formation is whole again (for `chaosjobs --failover`)."""
        command = (
            f"{PG_AUTOCTL} perform failover --monitor "
            f"postgresql://autoctl_node@127.0.0.1:{self.monitor.port}/pg_auto_failover --wait 60"
        )
        owner = os.environ.get("EMBEDDED_PG_USER", DEFAULT_RUN_AS) if as_owner() else None
        return f"runuser -u {owner} -- {command}" if owner else command

    # The faults -------------------------------------------------------------------------

    def kill(self, node: Node) -> None:
        """kill -9 a node whole: its keeper, its postmaster and every backend at once."""
        assert node.process is not None
        os.killpg(node.process.pid, signal.SIGKILL)
        node.process.wait(30)

    def freeze(self, node: Node) -> None:
        """SIGSTOP a node whole: its sockets stay open and nothing answers on them."""
        assert node.process is not None
        os.killpg(node.process.pid, signal.SIGSTOP)

    def wait_promoted(self, node: Node, timeout: float = 120) -> float:
        """Wait until the monitor has made `node` a primary that takes writes; return
        when that was seen (time.monotonic())."""

        def takes_writes() -> bool:
            statement = (
                "SELECT NOT pg_is_in_recovery()"
                " AND current_setting('default_transaction_read_only') = 'off'"
            )
            return ask(node.url, statement) == (True,)

        self._wait(takes_writes, timeout, f"{node.name} promoted", interval=0.02)
        return time.monotonic()

    def stop(self) -> None:
        for node in [*self.nodes, self.monitor]:
            process = node.process
            if process is None or process.poll() is not None:
                continue
            with suppress(ProcessLookupError):
                os.killpg(process.pid, signal.SIGCONT)  # a frozen node must hear the stop
                process.terminate()  # pg_autoctl stops its server ("fast" shutdown)
            try:
                process.wait(30)
            except subprocess.TimeoutExpired:
                with suppress(ProcessLookupError):
                    os.killpg(process.pid, signal.SIGKILL)
                process.wait(30)
        for log in self._logs:
            log.close()

    def log(self, node: Node) -> str:
        path = self.root / f"{node.name}.log"
        return path.read_text(errors="replace") if path.exists() else ""

    # Running pg_autoctl ----------------------------------------------------------------

    def _initdb(self, node: Node) -> None:
        """The data directory, made before pg_autoctl adopts it: Debian's server puts its
        socket in /var/run/postgresql, which an unprivileged account may not write."""
        subprocess.run(
            [
                str(BIN / "initdb"),
                *("-D", str(node.data), "-U", "postgres", "-A", "trust"),
                *("-E", "UTF8", "--locale=C", "--no-sync"),
            ],
            check=True,
            capture_output=True,
            env=self._env(),
            **as_owner(),
        )
        append_settings(
            node.data / "postgresql.conf",
            {
                "unix_socket_directories": f"'{self.sockets}'",
                "fsync": "off",  # a process killed hard loses nothing the OS holds
                "shared_buffers": "32MB",
                "max_connections": "60",
            },
        )

    def _run_autoctl(self, node: Node, what: str) -> None:
        common = [
            *("--pgdata", str(node.data), "--pgport", str(node.port)),
            *("--hostname", "127.0.0.1", "--listen", "127.0.0.1"),
            *("--auth", "trust", "--no-ssl", "--run"),
        ]
        if what == "postgres":
            monitor = f"postgresql://autoctl_node@127.0.0.1:{self.monitor.port}/pg_auto_failover"
            common += ["--name", node.name, "--dbname", DATABASE, "--monitor", monitor]
        log = (self.root / f"{node.name}.log").open("ab")
        self._logs.append(log)
        node.process = subprocess.Popen(
            [str(PG_AUTOCTL), "create", what, *common],
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            env=self._env(),
            start_new_session=True,  # its own process group: kill() and freeze() take all
            **as_owner(),
        )

    def _env(self) -> dict[str, str]:
        return {
            "PATH": f"{BIN}:/usr/bin:/bin",
            "PG_CONFIG": str(BIN / "pg_config"),
            "HOME": str(self.root),
            "XDG_CONFIG_HOME": str(self.root / "config"),
            "XDG_DATA_HOME": str(self.root / "share"),
            "PGHOST": str(self.sockets),
            "PGUSER": "postgres",
        }

    def _monitor_answers(self) -> bool:
        return ask(self.monitor_url, "SELECT count(*) FROM pgautofailover.formation") is not None

    def _checkpoint(self, node: Node) -> bool:
        ask(node.url, "CHECKPOINT")
        return True

    def _wait(
        self,
        condition: Callable[[], bool],
        timeout: float,
        what: str,
        interval: float = 0.1,
        *,
        setting_up: bool = False,
    ) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            for node in [self.monitor, *self.nodes] if setting_up else []:
                if node.process is not None and node.process.poll() is not None:
                    raise AssertionError(f"pg_autoctl of {node.name} exited:\n{self.log(node)}")
            if condition():
                return
            time.sleep(interval)
        logs = "\n".join(
            f"--- {n.name}\n{self.log(n)[-3000:]}" for n in [self.monitor, *self.nodes]
        )
        raise AssertionError(f"waited {timeout} s for {what}\n{logs}")

    def _chown(self, path: Path) -> None:
        owner = as_owner()
        if owner:
            os.chown(path, owner["user"], owner["group"])


def ask(url: str, statement: str) -> tuple[object, ...] | None:
    """The first row of `statement` on a new connection (() when it returns none), or
    None when the server cannot be reached or refuses it."""
    try:
        with psycopg.connect(url, autocommit=True, connect_timeout=2) as conn:
            cursor = conn.execute(statement)
            return (cursor.fetchone() or ()) if cursor.description else ()
    except psycopg.Error:
        return None


@contextmanager
def formation() -> Iterator[Formation]:
    """Start a monitor and two nodes; stop them and remove their data at the end."""
    with servers_root("pgjobs-autofailover-") as root:
        group = Formation(root)
        try:
            group.start()
            yield group
        finally:
            group.stop()
