"""A worker's guard against a database server that stops answering (S43).

A primary can hang instead of dying: a paused VM, a stuck kernel, a process stopped by a
signal. Its sockets stay open, and on a host that still runs, its kernel answers for it:
TCP keepalives succeed and `tcp_user_timeout` never fires, so a statement sent to it
waits forever. After a failover the new primary then waits with jobs while every thread
of the worker waits on the old one.

The watchdog watches every TCP connection to PostgreSQL of a worker's process: Django's,
in every thread (handlers' included), and the LISTEN line. It never calls libpq from
another thread: a connection is busy while psycopg holds its lock (a statement, a
commit), and the kernel says how long its socket has sent and received nothing (Linux's
TCP_INFO). When a busy connection has waited longer than `timeout` since it last sent
or received anything, it knocks on the same server: a new connection and the first
message of PostgreSQL's protocol (an SSL request), which a live server answers before
any login, however busy or out of connections. A server that answers is only slow, and
the statement is left alone. One that does not answer in time is taken for hung: every
watched connection to it is cut (its socket shut down), so that each waiting call fails
as if the server had died, and the worker's usual path takes over: back off, reconnect,
and land (libpq's multi-host URL) on the server that now takes writes. What the cut
calls had sent is the server's to commit or not, as after any lost connection: claims
come back when their lease lapses, completions are sent again.

Unix-socket connections are not watched (their server is on the same host), nor are
connections on a system without TCP_INFO.
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
from datetime import timedelta
from typing import Any

import psycopg
from django.db import connections
from django.db.backends.signals import connection_created

logger = logging.getLogger("django_pgjobs.worker")

#: The first message of PostgreSQL's protocol a client may send: an SSL request (length
#: 8, code 80877103), which the server answers with one byte, S or N, before any login.
SSL_REQUEST = struct.pack("!ii", 8, 80877103)
#: Where Linux's struct tcp_info keeps the count of retransmission timeouts of the data
#: not yet acknowledged (tcpi_retransmits, a byte), the milliseconds since data was last
#: sent (tcpi_last_data_sent) and received (tcpi_last_data_recv), and the bytes to ask for.
_RETRANSMITS, _LAST_DATA_SENT, _LAST_DATA_RECV, _TCP_INFO_BYTES = 2, 44, 52, 104


def connect_timeout(timeout: float) -> int:
    """Whole seconds to wait for one host to take a connection, login included (libpq's
    least is 2): the hung-server timeout, so that a multi-host URL tries the next host
    after it, and a slow login (TLS, LDAP) still fits."""
    return max(2, math.ceil(timeout))


def connection_options(timeout: float) -> dict[str, int]:
    """libpq's timeouts for a worker's connections, from the hung-server timeout: give up
    connecting to one host after a while (the next host of a multi-host URL is tried),
    find a peer that vanished (keepalives on an idle connection: after `keepalives_idle`
    plus `keepalives_count` unanswered probes `keepalives_interval` apart), and give up on
    data it never acknowledged (tcp_user_timeout, in milliseconds)."""
    whole = math.ceil(timeout)
    return {
        "connect_timeout": connect_timeout(timeout),
        "keepalives": 1,
        "keepalives_idle": whole,
        "keepalives_interval": max(1, math.ceil(timeout / 3)),
        "keepalives_count": 3,
        "tcp_user_timeout": 3 * whole * 1000,
    }


@dataclass
class _Watched:
    """A connection, and its socket: its descriptor, the socket it was (its inode, so that
    a number taken by another socket since is not mistaken for it), the server's address."""

    conn: weakref.ref[psycopg.Connection[Any]]
    fd: int
    inode: int
    peer: tuple[Any, ...]

    @property
    def server(self) -> str:
        return f"{self.peer[0]}:{self.peer[1]}"

    @contextlib.contextmanager
    def socket(self) -> Iterator[socket.socket | None]:
        """A duplicate of the socket while it is still this connection's (None once it is
        closed, or its number was taken by another)."""
        sock = None
        with contextlib.suppress(OSError):
            duplicate = os.dup(self.fd)
            try:
                if os.fstat(duplicate).st_ino == self.inode:
                    sock = socket.socket(fileno=duplicate)  # it owns the duplicate now
            finally:
                if sock is None:
                    os.close(duplicate)
        if sock is None:
            yield None
            return
        with sock:
            yield sock


def _silent_ms(sock: socket.socket) -> int | None:
    """Milliseconds the socket has waited for the server (None: the kernel cannot say)."""
    try:
        info = sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_INFO, _TCP_INFO_BYTES)
    except (OSError, AttributeError):
        return None
    return waited_ms(info)


def waited_ms(info: bytes) -> int | None:
    """Milliseconds a connection has waited for its server, from its struct tcp_info:
    since it last sent or received data, whichever came later, so that a connection idle
    for a minute that sends a statement now has waited for nothing yet. While the data
    sent goes unacknowledged past a retransmission timeout (a host that no longer
    answers at all), the kernel's resends are no sending: since it last received."""
    if len(info) < _LAST_DATA_RECV + 4:
        return None
    since_sent = struct.unpack_from("I", info, _LAST_DATA_SENT)[0]
    since_received = struct.unpack_from("I", info, _LAST_DATA_RECV)[0]
    if info[_RETRANSMITS]:
        return int(since_received)
    return int(min(since_sent, since_received))


class Watchdog:
    """Watches connections; `check()` cuts those of a server that stopped answering."""

    def __init__(self, timeout: float) -> None:
        if not timeout >= 1:
            raise ValueError(f"the hung-server timeout must be at least 1 second, not {timeout}")
        self.timeout = timeout
        self.probe_timeout = connect_timeout(timeout)
        self._watched: dict[int, _Watched] = {}
        #: When each server last answered a probe (time.monotonic()): it is not asked
        #: again for `timeout` seconds, however long its statements run.
        self._answered_at: dict[str, float] = {}
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def watch(self, conn: psycopg.Connection[Any]) -> None:
        """Watch `conn`'s socket while it stays open (called on the thread that connected
        it): a TCP connection whose waits the kernel can report."""
        try:
            fd = conn.fileno()
            with socket.socket(fileno=os.dup(fd)) as sock:
                if sock.family not in (socket.AF_INET, socket.AF_INET6):
                    return
                if _silent_ms(sock) is None:
                    return
                peer = sock.getpeername()
            inode = os.fstat(fd).st_ino
        except (OSError, psycopg.Error):
            return
        with self._lock:
            self._watched[fd] = _Watched(conn=weakref.ref(conn), fd=fd, inode=inode, peer=peer)

    def check(self) -> list[str]:
        """One look at the watched connections; return the servers given up on, whose
        connections were cut."""
        with self._lock:
            entries = list(self._watched.items())
        waiting: dict[str, tuple[_Watched, int]] = {}
        for fd, entry in entries:
            conn = entry.conn()
            busy = conn is not None and conn.lock.locked()  # a statement, a commit
            with entry.socket() as sock:
                if sock is None or conn is None:
                    with self._lock:
                        if self._watched.get(fd) is entry:
                            del self._watched[fd]
                    continue
                waited = _silent_ms(sock) if busy else None
            if waited is not None and waited >= self.timeout * 1000:
                longest = waiting.get(entry.server, (entry, 0))[1]
                waiting[entry.server] = (entry, max(longest, waited))
        hung: list[str] = []
        for server, (entry, waited) in waiting.items():
            if time.monotonic() - self._answered_at.get(server, float("-inf")) < self.timeout:
                continue
            if self._answers(entry.peer):
                self._answered_at[server] = time.monotonic()  # only slow: it runs on
                continue
            cut = sum(_cut(other) for _, other in entries if other.server == server)
            logger.warning(
                "the database server %s has not answered a statement for %.1fs, nor a new "
                "connection within %ss: taking it for hung; dropped=%s connections; "
                "reconnecting (after a failover, to the new primary)",
                server,
                waited / 1000,
                self.probe_timeout,
                cut,
            )
            hung.append(server)
        return hung

    def _answers(self, peer: tuple[Any, ...]) -> bool:
        """Whether the server at `peer` answers a new connection within the probe's
        time. The probe sends PostgreSQL's SSL request, which the server answers with one
        byte before any login: a server out of connections or busy answers it, a frozen
        one does not. (PgBouncer answers it itself: behind a pooler the probe hears the
        pooler, whatever its servers do.)"""
        deadline = time.monotonic() + self.probe_timeout
        try:
            with socket.create_connection(peer[:2], timeout=self.probe_timeout) as sock:
                sock.sendall(SSL_REQUEST)
                sock.settimeout(max(deadline - time.monotonic(), 0.01))
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
            self._thread.join(self.probe_timeout + 1)

    def _run(self) -> None:
        interval = min(1.0, self.timeout / 4)
        while not self._stop.wait(interval):
            try:
                self.check()
            except Exception:  # the watchdog must outlive any surprise
                logger.exception("the database watchdog failed a check; it goes on")


def _cut(entry: _Watched) -> bool:
    """Shut a watched connection's socket down, so that whatever waits on it fails at
    once; return whether it was cut (not when it is no longer that connection's)."""
    with entry.socket() as sock:
        if sock is None:
            return False
        try:
            sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            return False
    return True


# The process's watchdog -----------------------------------------------------------------


@dataclass
class _Guard:
    """The process's watchdog while guards are open, and the OPTIONS it added."""

    dog: Watchdog
    added: dict[str, dict[str, int]]  # alias -> the options added, with their values
    guards: int = 1


_guard_lock = threading.Lock()
_current: _Guard | None = None


def watch(conn: Any) -> None:
    """Watch `conn` if a guard is open in this process (the LISTEN line, say)."""
    current = _current
    if current is not None and isinstance(conn, psycopg.Connection):
        current.dog.watch(conn)


def _on_connection_created(sender: Any, connection: Any, **kwargs: Any) -> None:
    watch(connection.connection)


@contextlib.contextmanager
def guarding(timeout: float | timedelta | None) -> Iterator[None]:
    """Guard this process's connections to PostgreSQL against a server that stops
    answering (S43), for the length of the block.

    Within it every connection this process opens to a PostgreSQL database of DATABASES
    is watched, and gets the libpq timeouts its OPTIONS do not set (`connection_options`).
    A statement that waits on a server that no longer answers (a hung primary) then
    fails with OperationalError about `timeout` seconds after it was sent, plus the
    probe's time, instead of waiting forever. Every worker runs in one
    (PGJOBS["HUNG_SERVER_TIMEOUT"]); a long-running process of your own that enqueues
    can too, as `django_pgjobs.guard_connections(5)`.

    Args:
        timeout: seconds (or a timedelta), at least 1; None: nothing is guarded.

    Guards nest and overlap across threads: the first one open starts the watchdog, with
    its timeout, and the last one out stops it and takes back the options it added (those
    still as it set them).
    """
    global _current
    if timeout is None:
        yield
        return
    seconds = timeout.total_seconds() if isinstance(timeout, timedelta) else float(timeout)
    with _guard_lock:
        if _current is None:
            _current = _start(seconds)
        else:
            _current.guards += 1
    try:
        yield
    finally:
        with _guard_lock:
            if _current is not None:
                _current.guards -= 1
                if _current.guards == 0:
                    _stop(_current)
                    _current = None


def _start(timeout: float) -> _Guard:
    dog = Watchdog(timeout)  # raises on a timeout under a second, before any change
    dog.start()
    defaults = connection_options(timeout)
    added: dict[str, dict[str, int]] = {}
    for alias in connections:
        if connections[alias].vendor != "postgresql":
            continue
        options = connections.settings[alias].setdefault("OPTIONS", {})
        added[alias] = {name: value for name, value in defaults.items() if name not in options}
        options.update(added[alias])
    guard = _Guard(dog=dog, added=added)
    connection_created.connect(_on_connection_created, dispatch_uid="pgjobs-watchdog")
    for wrapper in connections.all(initialized_only=True):
        if isinstance(wrapper.connection, psycopg.Connection):
            dog.watch(wrapper.connection)
    return guard


def _stop(guard: _Guard) -> None:
    connection_created.disconnect(dispatch_uid="pgjobs-watchdog")
    guard.dog.stop()
    for alias, added in guard.added.items():
        options = connections.settings.get(alias, {}).get("OPTIONS", {})
        for name, value in added.items():
            if options.get(name) == value:
                del options[name]
