"""What a failed database call means to the worker: an outage, or one job's bad data (S27).

An outage (the server away, restarting, read-only after a failover, out of connections, a
transient conflict) is waited out: the worker backs off, reconnects and tries the same
thing again. Anything else the database refuses (a value out of range, a constraint, a
trigger's exception) comes from the data of what was sent: trying it again would fail
again, so the caller narrows it down to the job whose data it is.
"""

from __future__ import annotations

import psycopg
from django.db import InterfaceError, OperationalError

from django_pgjobs.options import safe_str

#: SQLSTATE classes of an outage: connection exception, insufficient resources (disk full,
#: too many connections), operator intervention (shutdown, crash, cancel), system error.
OUTAGE_CLASSES = ("08", "53", "57", "58")
#: SQLSTATEs of an outage outside those classes: a read-only server (a standby after a
#: failover), serialization failure and deadlock (try again), a lock wait given up.
OUTAGE_STATES = ("25006", "40001", "40P01", "55P03")
#: SQLSTATE of a write refused by a read-only server or transaction.
READ_ONLY_SQL_TRANSACTION = "25006"
_CONNECTION_ERRORS = (
    OperationalError,
    InterfaceError,
    psycopg.OperationalError,
    psycopg.InterfaceError,
)


def sqlstate(error: BaseException) -> str | None:
    """The SQLSTATE of a psycopg error, or of the one a Django error wraps (None: none)."""
    cause = error if isinstance(error, psycopg.Error) else error.__cause__
    state = getattr(cause, "sqlstate", None)
    return state if isinstance(state, str) else None


def is_outage(error: BaseException) -> bool:
    """True when `error` says the database is unreachable or unwilling for now, not that
    it refused the data of this call."""
    state = sqlstate(error)
    if state is None:
        # No answer from the server: the connection broke, or never was (psycopg's own
        # OperationalError / InterfaceError). Other exceptions are not the database's.
        return isinstance(error, _CONNECTION_ERRORS)
    return state[:2] in OUTAGE_CLASSES or state in OUTAGE_STATES


def read_only(error: BaseException) -> bool:
    """True when `error` is PostgreSQL refusing a write on a read-only server (25006)."""
    return sqlstate(error) == READ_ONLY_SQL_TRANSACTION


def describe(error: BaseException) -> str:
    """`Class: first line of the message`, for logs and dead letters' reasons."""
    lines = safe_str(error).strip().splitlines()
    return f"{type(error).__name__}: {lines[0]}" if lines else type(error).__name__
