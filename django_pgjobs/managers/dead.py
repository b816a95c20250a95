"""`DeadJob.objects`: dead letters back to work (S3 merge), and their retention (S24)."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING

from django.db import models

from django_pgjobs.db import connection as db
from django_pgjobs.db import sql
from django_pgjobs.managers import workflows
from django_pgjobs.records import RequeueResult

if TYPE_CHECKING:
    from django_pgjobs.models import DeadJob  # noqa: F401


class DeadJobManager(models.Manager["DeadJob"]):
    """Dead letters: requeue and prune."""

    def requeue(self, ids: Iterable[int], *, using: str | None = None) -> RequeueResult:
        """Move dead letters back to pending, attempts reset and expiry cleared.

        A letter whose key already has a live job is merged into that job (S3, replace)
        instead. Ids that are not dead letters are skipped. All in one transaction. The
        dependents a requeued job's death took with it wait for it again (S30).
        """
        requeued = merged = 0
        params = db.wake_params()
        with db.atomic(using):
            for job_id in dict.fromkeys(ids):
                rows = db.fetchall(sql.REQUEUE_DEAD_JOB, {**params, "id": int(job_id)}, using)
                for _id, inserted, _woken in rows:
                    if inserted:
                        requeued += 1
                        workflows.revive_dependents(int(job_id), using)
                    else:
                        merged += 1
        return RequeueResult(requeued=requeued, merged=merged)

    def delete_letters(self, ids: Sequence[int], *, using: str | None = None) -> int:
        """Delete the dead letters `ids` for good, with their edges (as pruning does);
        ids that are no dead letter are skipped. Returns how many were deleted."""
        params = {"ids": db.array_of_ids(ids)}
        ((deleted,),) = db.fetchall(sql.DELETE_DEAD_JOBS, params, using)
        return int(deleted)

    def prune_in_queues(
        self, queues: Sequence[str], retention_s: float, limit: int, *, using: str | None = None
    ) -> int:
        """Delete up to `limit` dead letters of `queues` that died over `retention_s` ago."""
        params = {"queues": list(queues), "retention_s": retention_s, "limit": limit}
        ((pruned,),) = db.fetchall(sql.PRUNE_DEAD_IN_QUEUES, params, using)
        return int(pruned)

    def prune_outside_queues(
        self, queues: Sequence[str], retention_s: float, limit: int, *, using: str | None = None
    ) -> int:
        """Delete up to `limit` dead letters of queues other than `queues` that died over
        `retention_s` ago: the default retention, for queues without their own."""
        params = {"queues": list(queues), "retention_s": retention_s, "limit": limit}
        ((pruned,),) = db.fetchall(sql.PRUNE_DEAD_OUTSIDE_QUEUES, params, using)
        return int(pruned)
