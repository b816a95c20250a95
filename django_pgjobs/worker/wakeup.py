"""What an idle worker sleeps on (S23): a pipe its own threads write to, and the LISTEN
line, which it connects, probes once, and reconnects after a loss. The line also brings
the cancellations of running jobs (S32): "pgjobs.cancel:<id>:<token>"."""

from __future__ import annotations

import contextlib
import logging
import os
import select
import time
import uuid
from collections.abc import Collection

import psycopg
from django.db import DatabaseError

from django_pgjobs.conf import pgjobs_settings
from django_pgjobs.db.listener import Listener
from django_pgjobs.worker.faults import RECONNECT_BACKOFF_CAP_S

logger = logging.getLogger("django_pgjobs.worker")

#: The start of a cancellation's notification payload (queue names cannot start so).
CANCEL_PREFIX = "pgjobs.cancel:"


class Wakeup:
    """The loop's sleep: until the timeout, a wake() from a thread, or a notification."""

    def __init__(self, *, using: str, listen: bool, poll_interval: float) -> None:
        self.listening = listen
        self.poll_interval = poll_interval
        self.listener = Listener(
            using=using, channel=pgjobs_settings.CHANNEL, dsn=pgjobs_settings.LISTEN_DSN
        )
        self._read, self._write = os.pipe()
        os.set_blocking(self._read, False)
        os.set_blocking(self._write, False)
        self._probed = False
        self._retry_at = 0.0
        self._cancels: list[tuple[int, uuid.UUID]] = []

    @property
    def connected(self) -> bool:
        return self.listener.connected

    def reconnect_at(self, now: float) -> float | None:
        """When the loop should wake to connect the LISTEN line again (None: no need)."""
        if not self.listening or self.listener.connected:
            return None
        return max(self._retry_at, now)

    def connect(self) -> None:
        """Connect the LISTEN line now, if it is wanted (before the first claim, so that
        nothing notified after it is missed: a cancellation of a job it claims, say)."""
        self._ensure_listener()

    def wake(self) -> None:
        """Wake the loop from any thread."""
        # A full pipe means the loop wakes anyway; a closed one means it is shutting down.
        with contextlib.suppress(OSError):
            os.write(self._write, b"!")

    def wait(
        self, timeout: float, queues: Collection[str], own_pids: Collection[int | None] = ()
    ) -> bool:
        """Sleep up to `timeout` seconds; return True when a job of `queues` may be there
        to claim (a notification for one of them, or a LISTEN line just reconnected).

        A queue's notification the worker's own connections sent (`own_pids`: their
        server processes, the loop's and the recorder's) says nothing new: the loop looks
        again after each of its own statements that can make a job runnable (an ack that
        frees a workflow's child, a retry, a rerun), and its claim then sees what that
        statement committed. Waking on it too cost each link of a chain a claim that
        found nothing. A cancellation is heard whoever sent it."""
        maybe_more = self._ensure_listener()
        readable = [self._read]
        if self.listener.connected:
            readable.append(self.listener.fileno())
        try:
            ready, _, _ = select.select(readable, [], [], timeout)
        except InterruptedError:  # pragma: no cover - PEP 475 retries select itself
            return maybe_more
        if self._read in ready:
            try:
                while os.read(self._read, 4096):
                    pass
            except BlockingIOError:
                pass
        if self.listener.connected and self.listener.fileno() in ready:
            maybe_more = self._drain(queues, own_pids) or maybe_more
        return maybe_more

    def take_cancels(self) -> list[tuple[int, uuid.UUID]]:
        """The (job id, claim token) of the cancellations notified since the last call."""
        cancels, self._cancels = self._cancels, []
        return cancels

    def close(self) -> None:
        self.listener.close()
        os.close(self._read)
        os.close(self._write)

    def _ensure_listener(self) -> bool:
        """Connect the LISTEN line if it is wanted and down; True when it just connected
        (whatever was notified while it was down: look now)."""
        if not self.listening or self.listener.connected:
            return False
        now = time.monotonic()
        if now < self._retry_at:
            return False
        try:
            self.listener.connect()
            if not self._probed:
                self._probed = True
                if not self.listener.receives():
                    self._listen_off()
                    return True
        except (psycopg.Error, DatabaseError) as error:
            self.listener.close()
            self._retry_at = now + min(RECONNECT_BACKOFF_CAP_S, self.poll_interval * 2)
            logger.warning("LISTEN connection failed (%s); polling until it is back", error)
            return False
        return True

    def _listen_off(self) -> None:
        """Notifications do not reach the LISTEN connection: poll only, and say why."""
        self.listener.forget()
        self.listening = False
        logger.warning(
            "LISTEN receives no notifications on this connection (is it a transaction-mode "
            "pooler such as PgBouncer?): polling every %gs instead. Set PGJOBS['LISTEN_DSN'] "
            "to a direct connection string to PostgreSQL for instant wake-ups.",
            self.poll_interval,
        )

    def _drain(self, queues: Collection[str], own_pids: Collection[int | None]) -> bool:
        try:
            notified = self.listener.drain()
        except psycopg.Error as error:
            logger.warning("LISTEN connection lost (%s); reconnecting", error)
            self.listener.close()
            return False
        woken = False
        for sender, payload in notified:
            if payload.startswith(CANCEL_PREFIX):  # heard whoever sent it
                cancel = _cancel_of(payload)
                if cancel is not None:
                    self._cancels.append(cancel)
            elif sender not in own_pids and payload in queues:
                woken = True
        return woken


def _cancel_of(payload: str) -> tuple[int, uuid.UUID] | None:
    """The (job id, token) a cancellation's payload names, or None for a malformed one."""
    job_id, _, token = payload[len(CANCEL_PREFIX) :].partition(":")
    try:
        return int(job_id), uuid.UUID(token)
    except ValueError:
        logger.debug("ignored a malformed cancellation notification %r", payload[:100])
        return None
