"""`Worker.objects`: the registry of running workers, kept by their heartbeats."""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING, Any

from django.db import models

from django_pgjobs.db import connection as db
from django_pgjobs.db import sql
from django_pgjobs.records import QueueStatus, WorkerAsked, WorkerStatus
from django_pgjobs.states import WorkerAsk

if TYPE_CHECKING:
    from django_pgjobs.models import Worker  # noqa: F401


class WorkerManager(models.Manager["Worker"]):
    """Register, heartbeat and stop a worker's row; list them; prune the long gone."""

    def heartbeat(
        self,
        worker_id: str,
        *,
        host: str,
        pid: int,
        queues: Sequence[str],
        concurrency: int,
        version: str,
        heartbeat_s: float,
        running: int,
        succeeded: int,
        failed: int,
        abandoned: int = 0,
        claims_from_floors: bool = False,
        using: str | None = None,
    ) -> WorkerAsked:
        """Register the worker or refresh its row (last seen: the database's now()).
        Returns what operators asked of it: nothing, "quiet" or "stop", and the queues
        paused on it alone."""
        params = {
            "id": worker_id,
            "host": host,
            "pid": pid,
            "queues": json.dumps(list(queues)),
            "concurrency": concurrency,
            "version": version,
            "heartbeat_s": float(heartbeat_s),
            "running": running,
            "succeeded": succeeded,
            "failed": failed,
            "abandoned": abandoned,
            "claims_from_floors": claims_from_floors,
        }
        rows = db.fetchall(sql.HEARTBEAT_WORKER, params, using)
        if not rows:
            return WorkerAsked()
        asked, paused = rows[0]
        return WorkerAsked(asked, frozenset(paused_queues(paused)))

    def ask(
        self, worker_ids: Sequence[str], asked: str | None, *, by: str, using: str | None = None
    ) -> list[str]:
        """Ask workers to go quiet ("quiet": claim no more jobs), to stop after their
        running jobs ("stop"), or to run again (None); each obeys at its next heartbeat.
        Stopped workers are left out. Returns the ids asked."""
        if asked is not None and asked not in WorkerAsk.values:
            raise ValueError(f"A worker is asked 'quiet', 'stop' or None, not {asked!r}.")
        params = {"ids": list(worker_ids), "asked": asked, "by": by}
        return [worker_id for (worker_id,) in db.fetchall(sql.ASK_WORKERS, params, using)]

    def pause_on(
        self,
        worker_ids: Sequence[str],
        queue: str,
        *,
        paused: bool = True,
        by: str,
        using: str | None = None,
    ) -> list[str]:
        """Pause `queue` on these workers alone (`paused=False`: resume it there), as
        asked by `by`: its jobs stay for the other workers. Each obeys at its next
        heartbeat. Workers that stopped, do not claim from the queue, or have it so
        already are left out. Returns the ids changed."""
        params = {"ids": list(worker_ids), "queue": queue, "paused": paused, "by": by}
        return [worker_id for (worker_id,) in db.fetchall(sql.PAUSE_ON_WORKERS, params, using)]

    def stopped(
        self, worker_id: str, *, succeeded: int, failed: int, using: str | None = None
    ) -> bool:
        """Mark the worker stopped; False if it has no row."""
        params = {"id": worker_id, "succeeded": succeeded, "failed": failed}
        return db.rowcount(sql.STOP_WORKER, params, using) == 1

    def status(self, *, using: str | None = None) -> list[WorkerStatus]:
        """Every registered worker, newest first, live or not."""
        rows = db.fetch_named(sql.LIST_WORKERS, {}, using)
        return [_status(row) for row in rows]

    def status_of(self, worker_id: str, *, using: str | None = None) -> WorkerStatus | None:
        """The registered worker `worker_id`, live or not, or None (never registered, or
        pruned a day after it was last seen)."""
        rows = db.fetch_named(sql.WORKER_STATUS, {"id": worker_id}, using)
        return _status(rows[0]) if rows else None

    def prune(self, limit: int, *, using: str | None = None) -> int:
        """Delete up to `limit` workers not seen for a day."""
        return db.rowcount(sql.PRUNE_WORKERS, {"limit": limit}, using)


def _status(row: dict[str, Any]) -> WorkerStatus:
    row["queues"] = queue_list(row["queues"])
    row["paused_queues"] = paused_queues(row["paused_queues"])
    return WorkerStatus(**row)


def queue_list(stored: Any) -> list[str]:
    """A worker's queues as stored (a list); a value edited by hand into something else
    reads as none."""
    try:
        value = db.json_value(stored)
    except ValueError:
        return []
    return value if isinstance(value, list) else []


def paused_queues(stored: Any) -> dict[str, dict[str, str]]:
    """The queues paused on a worker as stored ({"mail": {"by": …, "at": …}}); a value
    edited by hand into something else than an object pauses none (as the statements
    that change it read it)."""
    try:
        value = db.json_value(stored)
    except ValueError:
        return {}
    if not isinstance(value, dict):
        return {}
    return {
        str(name): {k: str(v) for k, v in how.items() if k in ("by", "at")}
        if isinstance(how, dict)
        else {}
        for name, how in value.items()
    }


def unserved_queues(queues: Iterable[QueueStatus], workers: Iterable[WorkerStatus]) -> list[str]:
    """Queues that have runnable jobs, are not paused, and that no live worker claims (a
    worker asked to go quiet or to stop claims nothing, one whose queue is paused on it
    alone claims nothing of that queue)."""
    served = {
        queue for worker in workers if worker.live and not worker.asked for queue in worker.claiming
    }
    return sorted(
        status.queue
        for status in queues
        if status.runnable.value > 0 and not status.paused and status.queue not in served
    )
