"""A worker's guard against a database server that stops answering (S43).

A primary can hang instead of dying: a paused VM, a stuck kernel, a process stopped by a
signal. Its sockets stay open, and on a host that still runs, its kernel answers for it:
TCP keepalives succeed and `tcp_user_timeout` never fires, so a statement sent to it
waits forever. After a failover the new primary then waits with jobs while every thread
of the worker waits on the old one.

The watchdog watches every connection of a worker's process: Django's, in every thread
(handlers' included), and the LISTEN line. When one has been busy on a statement for
longer than `timeout`, it knocks on the same server: a new connection and the first
message of PostgreSQL's protocol, which a live server answers before any login, however
busy or out of connections. A server that answers is only slow, and the statement is
left alone. One that does not
answer in time is taken for hung: every watched connection to it is cut (its socket shut
down), so that each waiting call fails as if the server had died, and the worker's usual
path takes over: back off, reconnect, and land (libpq's multi-host URL) on the server that
now takes writes. What the cut calls had sent is the server's to commit or not, as after
any lost connection: claims come back when their lease lapses, completions are sent again.
"""

from __future__ import annotations

import contextlib
import logging
import math
import os
import socket
import struct
import threading
import time
import weakref
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import psycopg
from django.db import connections
from django.db.backends.signals import connection_created
from psycopg import pq

logger = logging.getLogger("django_pgjobs.worker")


def connect_timeout(timeout: float) -> int:
    """Whole seconds to wait for one host to accept a connection (libpq's least is 2): a
    third of the hung-server timeout, so that a multi-host URL soon tries the next."""
    return max(2, math.ceil(timeout / 3))


def connection_options(timeout: float) -> dict[str, int]:
    """libpq's timeouts for a worker's connections, from the hung-server timeout: give up
    connecting to one host after a while (the next host of a multi-host URL is tried),
    find a peer that vanished (keepalives on an idle connection), and give up on data it
    never acknowledged (tcp_user_timeout, in milliseconds)."""
    whole = math.ceil(timeout)
    return {
        "connect_timeout": connect_timeout(timeout),
        "keepalives": 1,
        "keepalives_idle": whole,
        "keepalives_interval": max(1, math.ceil(timeout / 3)),
        "keepalives_count": 3,
        "tcp_user_timeout": 3 * whole * 1000,
    }


#: The first message of PostgreSQL's protocol a client may send: an SSL request (length
#: 8, code 80877103), which the server answers with one byte, S or N, before any login.
SSL_REQUEST = struct.pack("!ii", 8, 80877103)


@dataclass
class _Watched:
    """A connection the watchdog may cut: its socket, and the server's address."""

    conn: weakref.ref[psycopg.Connection[Any]]
    fd: int
    peer: Any  # the server's socket address (a path for a Unix socket)
    busy_since: float | None = None

    @property
    def server(self) -> str:
        return (
            ":".join(str(part) for part in self.peer[:2])
            if isinstance(self.peer, tuple)
            else str(self.peer)
        )


class Watchdog:
    """Watches connections; `check()` cuts those of a server that stopped answering."""

    def __init__(self, timeout: float) -> None:
        self.timeout = timeout
        self.connect_timeout = connect_timeout(timeout)
        self._watched: dict[int, _Watched] = {}
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def watch(self, conn: psycopg.Connection[Any]) -> None:
        """Watch `conn` until it is closed (called on the thread that connected it)."""
        if conn.closed:
            return
        try:
            fd = conn.fileno()
            peer = _peer(fd)
        except (OSError, psycopg.Error):
            return
        if not peer:  # no address to probe (an unnamed socket): never cut blind
            return
        with self._lock:
            self._watched[id(conn)] = _Watched(conn=weakref.ref(conn), fd=fd, peer=peer)

    def check(self, now: float) -> list[str]:
        """One look at the watched connections (now: time.monotonic()); return the servers
        given up on, whose connections were cut."""
        with self._lock:
            entries = list(self._watched.items())
        waited_on: dict[str, _Watched] = {}
        for key, entry in entries:
            conn = entry.conn()
            if conn is None or conn.closed:
                with self._lock:
                    self._watched.pop(key, None)
                continue
            if conn.pgconn.transaction_status != pq.TransactionStatus.ACTIVE:
                entry.busy_since = None
            elif entry.busy_since is None:
                entry.busy_since = now
            elif now - entry.busy_since >= self.timeout:
                waited_on.setdefault(entry.server, entry)
        hung: list[str] = []
        for server, entry in waited_on.items():
            if self._answers(entry.peer):
                # Only slow: ask again after another timeout, if it still waits.
                for _, other in entries:
                    if other.server == server and other.busy_since is not None:
                        other.busy_since = now
                continue
            cut = sum(_cut(other) for _, other in entries if other.server == server)
            logger.warning(
                "the database server %s has not answered a statement for %.0fs, nor a new "
                "connection within %ss: taking it for hung and dropping this worker's %s "
                "connections to it; reconnecting (after a failover, to the new primary)",
                server,
                now - entry.busy_since if entry.busy_since is not None else self.timeout,
                self.connect_timeout,
                cut,
            )
            hung.append(server)
        return hung

    def _answers(self, peer: Any) -> bool:
        """Whether the server at `peer` (a socket address) answers a new connection in
        time. The probe sends the first message of PostgreSQL's protocol, an SSL request,
        which the server answers with one byte before any login: a server out of
        connections or busy answers it, a frozen one does not (nor a pooler's, for
        PgBouncer answers for the servers behind it)."""
        if isinstance(peer, str):
            family = socket.AF_UNIX
        elif isinstance(peer, tuple) and len(peer) == 4:
            family = socket.AF_INET6
        elif isinstance(peer, tuple):
            family = socket.AF_INET
        else:  # pragma: no cover - watch() keeps only socket addresses
            return True
        with socket.socket(family, socket.SOCK_STREAM) as sock:
            sock.settimeout(self.connect_timeout + 1)
            try:
                sock.connect(peer)
                sock.sendall(SSL_REQUEST)
                return len(sock.recv(1)) == 1
            except OSError:
                return False

    # The thread ------------------------------------------------------------------------

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="pgjobs-watchdog", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(self.connect_timeout + 2)

    def _run(self) -> None:
        interval = min(1.0, self.timeout / 4)
        while not self._stop.wait(interval):
            try:
                self.check(time.monotonic())
            except Exception:  # the watchdog must outlive any surprise
                logger.exception("the database watchdog failed a check; it goes on")


def _peer(fd: int) -> Any:
    """The address of the far end of socket `fd` (None when it has none)."""
    with socket.socket(fileno=os.dup(fd)) as sock:
        try:
            return sock.getpeername()
        except OSError:
            return None


def _cut(entry: _Watched) -> bool:
    """Shut the socket of a watched connection down, so that whatever waits on it fails
    at once; skip it when its descriptor no longer leads to the same peer (closed, and
    the number taken by another socket). Return whether it was cut."""
    conn = entry.conn()
    if conn is None or conn.closed:
        return False
    try:
        with socket.socket(fileno=os.dup(entry.fd)) as sock:
            if sock.getpeername() != entry.peer:
                return False
            sock.shutdown(socket.SHUT_RDWR)
    except OSError:
        return False
    return True


# The process's watchdog -----------------------------------------------------------------

_guard_lock = threading.Lock()
_active: list[Watchdog] = []  # at most one: the process's, while a worker runs
_guards = 0
_added_options: dict[str, list[str]] = {}


def watch(conn: psycopg.Connection[Any]) -> None:
    """Watch `conn` if a worker runs in this process (the LISTEN line, say)."""
    if _active:
        _active[0].watch(conn)


def _on_connection_created(sender: Any, connection: Any, **kwargs: Any) -> None:
    if connection.connection is not None:
        watch(connection.connection)


@contextlib.contextmanager
def guarding(timeout: float | None) -> Iterator[None]:
    """Within it, watch every connection this process opens, and give each database's
    connections the libpq timeouts their OPTIONS do not set: a statement that waits on a
    server that no longer answers (a hung primary) fails with OperationalError within
    about `timeout` seconds plus a probe's, instead of waiting forever.

    Every worker runs in one (PGJOBS["HUNG_SERVER_TIMEOUT"]); a long-running process of
    your own that enqueues (`django_pgjobs.guard_connections(5)`) can too. The first
    guard of a process starts the watchdog; the last one out stops it and takes those
    options back. None: nothing is watched."""
    global _guards
    if timeout is None:
        yield
        return
    with _guard_lock:
        _guards += 1
        if _guards == 1:
            _start(timeout)
    try:
        yield
    finally:
        with _guard_lock:
            _guards -= 1
            if _guards == 0:
                _stop()


def _start(timeout: float) -> None:
    dog = Watchdog(timeout)
    defaults = connection_options(timeout)
    for alias in connections:
        options = connections.settings[alias].setdefault("OPTIONS", {})
        added = [name for name in defaults if name not in options]
        options.update({name: defaults[name] for name in added})
        _added_options[alias] = added
    _active.append(dog)
    connection_created.connect(_on_connection_created, dispatch_uid="pgjobs-watchdog")
    for wrapper in connections.all(initialized_only=True):
        if wrapper.connection is not None:
            dog.watch(wrapper.connection)
    dog.start()


def _stop() -> None:
    connection_created.disconnect(dispatch_uid="pgjobs-watchdog")
    dog = _active.pop()
    dog.stop()
    for alias, added in _added_options.items():
        options = connections.settings[alias].get("OPTIONS", {})
        for name in added:
            options.pop(name, None)
    _added_options.clear()
