"""What a failed database call means to the worker: an outage, or one job's bad data (S27).

An outage (the server away, restarting, read-only after a failover, out of connections, a
transient conflict) is waited out: the worker backs off, reconnects and tries the same
thing again. Anything else the database refuses (a value out of range, a constraint, a
trigger's exception) comes from the data of what was sent: trying it again would fail
again, so the caller narrows it down to the job whose data it is.
"""

from __future__ import annotations

import contextlib
import logging
import random
import time
from collections.abc import Callable

import psycopg
from django.db import InterfaceError, OperationalError

from django_pgjobs.db import connection as db
from django_pgjobs.payloads import safe_str

logger = logging.getLogger("django_pgjobs.worker")

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


#: SQLSTATE of a statement that gave up waiting for a lock (lock_timeout).
LOCK_NOT_AVAILABLE = "55P03"


def is_lock_timeout(error: BaseException) -> bool:
    """True when `error` is a statement that gave up waiting for a row lock another
    transaction holds (S39): that job waits, the others go on."""
    return sqlstate(error) == LOCK_NOT_AVAILABLE


def read_only(error: BaseException) -> bool:
    """True when `error` is PostgreSQL refusing a write on a read-only server (25006)."""
    return sqlstate(error) == READ_ONLY_SQL_TRANSACTION


def describe(error: BaseException) -> str:
    """`Class: first line of the message`, for logs and dead letters' reasons."""
    lines = safe_str(error).strip().splitlines()
    return f"{type(error).__name__}: {lines[0]}" if lines else type(error).__name__


#: Longest wait between attempts to reach a database that went away: also the longest a
#: worker may sit idle once it is back.
RECONNECT_BACKOFF_CAP_S = 10.0


#: The longest first wait, after one failure: most are one connection ended under a
#: server that is up (pg_terminate_backend, a pooler's restart, an idle timeout), where
#: waiting only delays the jobs; the jitter spreads a fleet's reconnections.
FIRST_RECONNECT_S = 0.05


def reconnect_delay(failures: int) -> float:
    """How long to wait after the `failures`-th failed step in a row: at most
    FIRST_RECONNECT_S after the first, then a slowly growing backoff, since a failover
    takes seconds and a worker still backing off from its start would leave the new
    primary idle (0.23-0.45, 0.34-0.68, 0.5-1 ... 5-10 s), each jittered."""
    if failures <= 1:
        return random.uniform(0.0, FIRST_RECONNECT_S)
    return min(RECONNECT_BACKOFF_CAP_S, 0.2 * 1.5 ** min(failures, 12)) * random.uniform(0.5, 1.0)


class Faults:
    """The worker's failed steps in a row: when to try the database again, and what to say.

    An outage is waited out with a jittered exponential backoff; anything else is logged
    with its traceback and backed off alike, so that a fault that repeats never spins the
    loop.
    """

    def __init__(self, using: str, on_failure: Callable[[], None] = lambda: None) -> None:
        self.using = using
        #: Called after each failure (the worker then looks for work as soon as it may).
        self.on_failure = on_failure
        self.failures = 0
        self.retry_at = 0.0
        self._read_only_warned = False

    def waiting(self, now: float) -> bool:
        """Whether the worker is still backing off at `now` (time.monotonic())."""
        return now < self.retry_at

    def failed(self, what: str, error: Exception) -> None:
        """Log a failed step, drop the connection, and back off before the next call."""
        self.failures += 1
        delay = reconnect_delay(self.failures)
        self.retry_at = time.monotonic() + delay
        refused = read_only(error)
        # The first failure of a streak is a warning, and so is the first read-only
        # refusal in it (a failover shows as a lost connection, then refused writes).
        warn = self.failures == 1 or (refused and not self._read_only_warned)
        self._read_only_warned = self._read_only_warned or refused
        log = logger.warning if warn else logger.info
        if refused:
            log(
                "the database refused a write during %s: it is read-only (a standby after a "
                "failover, or the URL of a replica?); reconnecting in %.2fs",
                what,
                delay,
            )
        elif is_outage(error):
            log(
                "database error during %s (%s); reconnecting in %.2fs", what, describe(error), delay
            )
        else:
            logger.error(
                "unexpected error during %s (%s); trying again in %.2fs",
                what,
                describe(error),
                delay,
                exc_info=warn,
            )
        with contextlib.suppress(Exception):
            db.close(self.using)
        self.on_failure()

    def recovered(self) -> None:
        """A database call succeeded: the streak of failures is over."""
        if self.failures:
            logger.warning("database reachable again after %s failed attempts", self.failures)
        self.failures = 0
        self._read_only_warned = False
