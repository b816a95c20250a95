"""The worker's wake-up line: a dedicated connection that LISTENs on the channel (S23).

Notifications are hints. The worker also polls, so a notification lost while this
connection was down only delays a job by one poll interval.
"""

from __future__ import annotations

import contextlib
import time
import uuid
from typing import Any

import psycopg
from django.db import connections
from psycopg import sql as pgsql

from django_pgjobs.db import sql, watchdog
from django_pgjobs.db.connection import fetchall

#: How long a new LISTEN connection is given to receive its probe.
PROBE_TIMEOUT_S = 2.0


class Listener:
    """A psycopg connection of its own, in autocommit, LISTENing on `channel`."""

    def __init__(self, *, using: str, channel: str, dsn: str | None = None) -> None:
        self.using = using
        self.channel = channel
        self.dsn = dsn
        self._conn: psycopg.Connection[Any] | None = None

    @property
    def connected(self) -> bool:
        return self._conn is not None and not self._conn.closed

    def connect(self) -> None:
        """Open the connection and LISTEN. Raises psycopg.Error when the server is away."""
        self.close()
        if self.dsn is not None:
            conn = psycopg.connect(self.dsn, autocommit=True)
        else:
            params = connections[self.using].get_connection_params()
            for django_only in ("cursor_factory", "context", "prepare_threshold"):
                params.pop(django_only, None)
            conn = psycopg.connect(**params, autocommit=True)
        statement = pgsql.SQL(sql.LISTEN_CHANNEL).format(channel=pgsql.Identifier(self.channel))
        conn.execute(statement)
        self._conn = conn
        watchdog.watch(conn)

    def receives(self, timeout: float = PROBE_TIMEOUT_S) -> bool:
        """Send a probe through the jobs database's connection (the way enqueues notify)
        and say whether this connection receives it within `timeout` seconds.

        Raises DatabaseError when the probe cannot be sent.
        """
        if self._conn is None:
            return False
        token = f"pgjobs-probe:{uuid.uuid4()}"
        fetchall(sql.PROBE_LISTENER, {"channel": self.channel, "token": token}, self.using)
        deadline = time.monotonic() + timeout
        while (left := deadline - time.monotonic()) > 0:
            for notify in self._conn.notifies(timeout=left, stop_after=1):
                if notify.payload == token:
                    return True
        return False

    def forget(self) -> None:
        """Stop listening (UNLISTEN *, best effort), then close: for a connection whose
        probe failed, whose LISTEN may stay behind on a pooled server connection."""
        if self._conn is not None:
            with contextlib.suppress(psycopg.Error):
                self._conn.execute(sql.UNLISTEN_ALL)
        self.close()

    def fileno(self) -> int:
        if self._conn is None:
            raise RuntimeError("The listener is not connected.")
        return self._conn.fileno()

    def drain(self) -> set[tuple[int, str]]:
        """Return the notifications received since the last call, without waiting: each
        as (the process id of the server backend that sent it, its payload).

        Raises psycopg.Error when the connection broke; the caller reconnects.
        """
        if self._conn is None:
            return set()
        return {(notify.pid, notify.payload) for notify in self._conn.notifies(timeout=0)}

    def close(self) -> None:
        if self._conn is not None:
            with contextlib.suppress(psycopg.Error):
                self._conn.close()
            self._conn = None
