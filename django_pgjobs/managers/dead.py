"""`DeadJob.objects`: dead letters listed and back to work (S3 merge), and their retention
(S24)."""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING, Any

from django.db import models

from django_pgjobs import options
from django_pgjobs.db import connection as db
from django_pgjobs.db import sql
from django_pgjobs.managers import workflows
from django_pgjobs.records import DeadLetter, DeadPartition, RequeueResult
from django_pgjobs.states import DeadCategory

if TYPE_CHECKING:
    from django_pgjobs.models import DeadJob  # noqa: F401

#: The category filter's name for the letters that have none recorded
#: (`DeadJob.in_category(None)`), as the admin's reason filter calls them.
UNRECORDED_CATEGORY = "other"
#: Every category a filter of dead letters may name.
CATEGORY_FILTERS = (*DeadCategory.values, UNRECORDED_CATEGORY)
#: The letters `requeue_matching` moves per transaction (as the admin's actions do).
REQUEUE_BATCH = 1000
#: How far ahead the sweeper makes the dead-letter table's partitions (S44): the spans
#: of the next day, at least one and at most MOST_PARTITIONS_AHEAD (a partition ahead is
#: one more to plan over; a letter no partition takes yet goes to the default one).
PARTITIONS_AHEAD_S = 86_400
MOST_PARTITIONS_AHEAD = 7
#: How long making or dropping a partition waits for a lock before it leaves it to the
#: next sweep: shorter than PostgreSQL's deadlock_timeout (1 s), so that in a lock cycle
#: with a transaction that holds the table, the sweeper is the one that gives up.
PARTITION_LOCK_TIMEOUT = "500ms"


class DeadJobManager(models.Manager["DeadJob"]):
    """Dead letters: list, requeue and prune."""

    def letters(
        self,
        *,
        kind: str | None = None,
        queue: str | None = None,
        category: str | None = None,
        limit: int = 50,
        using: str | None = None,
    ) -> list[DeadLetter]:
        """Up to `limit` dead letters, the newest first: of the kinds that begin with
        `kind`, of `queue`, of `category` (a DeadCategory value, or "other": none
        recorded); None filters nothing.

        Raises:
            InvalidJobOption: a kind or a queue name no job can have.
            ValueError: a category that is none of CATEGORY_FILTERS, a limit below 1.
        """
        if limit < 1:
            raise ValueError(f"A listing's limit must be 1 or more, not {limit}.")
        params = {**_letter_filters(kind, queue, category), "limit": limit}
        return [DeadLetter(**row) for row in db.fetch_named(sql.DEAD_LETTERS, params, using)]

    def requeue_matching(
        self,
        *,
        kind: str | None = None,
        queue: str | None = None,
        category: str | None = None,
        using: str | None = None,
    ) -> RequeueResult:
        """Requeue every dead letter that matches the filters (as `letters` reads them,
        None filtering nothing) and had died when the call began, REQUEUE_BATCH letters
        per transaction, each as `requeue` moves it: a letter that dies again meanwhile
        stays dead.

        Raises:
            InvalidJobOption: a kind or a queue name no job can have.
            ValueError: a category that is none of CATEGORY_FILTERS.
        """
        params = {
            **_letter_filters(kind, queue, category),
            "died_by": db.clock(using),
            "limit": REQUEUE_BATCH,
        }
        requeued = merged = after = 0
        while True:
            rows = db.fetchall(sql.DEAD_LETTER_IDS, {**params, "after": after}, using)
            if not rows:
                return RequeueResult(requeued=requeued, merged=merged)
            ids = [int(row[0]) for row in rows]
            result = self.requeue(ids, using=using)
            requeued, merged = requeued + result.requeued, merged + result.merged
            after = ids[-1]

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
        self,
        queues: Sequence[str],
        retention_s: float,
        limit: int,
        *,
        strays_only: bool = False,
        using: str | None = None,
    ) -> int:
        """Delete up to `limit` dead letters of `queues` that died over `retention_s` ago;
        with `strays_only`, those of the default partition alone (the range partitions
        are dropped whole, S44)."""
        statement = sql.PRUNE_STRAY_DEAD_IN_QUEUES if strays_only else sql.PRUNE_DEAD_IN_QUEUES
        return _prune(statement, queues, retention_s, limit, using)

    def prune_outside_queues(
        self,
        queues: Sequence[str],
        retention_s: float,
        limit: int,
        *,
        strays_only: bool = False,
        using: str | None = None,
    ) -> int:
        """Delete up to `limit` dead letters of queues other than `queues` that died over
        `retention_s` ago: the default retention, for queues without their own. With
        `strays_only`, as `prune_in_queues`."""
        statement = (
            sql.PRUNE_STRAY_DEAD_OUTSIDE_QUEUES if strays_only else sql.PRUNE_DEAD_OUTSIDE_QUEUES
        )
        return _prune(statement, queues, retention_s, limit, using)

    def make_partitions(
        self, span_s: float, *, ahead: int | None = None, using: str | None = None
    ) -> int:
        """Make the partitions of this span and the next `ahead` spans of `span_s` seconds
        (S44; by default those of the next day, at least one), moving into them the
        default partition's letters of their ranges. Returns how many were made. Raises
        OperationalError (lock_not_available) when a lock is not had within
        PARTITION_LOCK_TIMEOUT: the next sweep tries again."""
        if ahead is None:
            ahead = min(MOST_PARTITIONS_AHEAD, max(1, math.ceil(PARTITIONS_AHEAD_S / span_s)))
        params = {"span_s": span_s, "ahead": ahead, "lock_timeout": PARTITION_LOCK_TIMEOUT}
        with db.atomic(using):
            ((_, made),) = db.fetchall(sql.MAKE_DEAD_PARTITIONS, params, using)
        return int(made)

    def drop_partitions(self, horizon_s: float, *, using: str | None = None) -> int:
        """Drop the range partitions whose letters all died over `horizon_s` ago, with
        their letters' edges (S44). Returns how many. Raises as `make_partitions`."""
        params = {"horizon_s": horizon_s, "lock_timeout": PARTITION_LOCK_TIMEOUT}
        with db.atomic(using):
            ((_, dropped),) = db.fetchall(sql.DROP_DEAD_PARTITIONS, params, using)
        return int(dropped)

    def partitions(self, *, using: str | None = None) -> list[DeadPartition]:
        """The dead-letter table's partitions, oldest first, the default one last."""
        return [DeadPartition(*row) for row in db.fetchall(sql.DEAD_PARTITIONS, {}, using)]


def _letter_filters(kind: str | None, queue: str | None, category: str | None) -> dict[str, Any]:
    """The parameters of DEAD_LETTERS' filters, each checked: a kind prefix and a queue
    name as an enqueue checks them (a filter no job can match is a mistake to say, not an
    empty answer), a category among CATEGORY_FILTERS."""
    from django_pgjobs.models import DEPENDENCY_REASON_PREFIX

    if category is not None and category not in CATEGORY_FILTERS:
        raise ValueError(
            f"{category!r} is no category of dead letters: one of {', '.join(CATEGORY_FILTERS)}."
        )
    # "_" is the one character of a kind that LIKE reads as a wildcard ("%" is none's).
    pattern = None if kind is None else options.validate_kind(kind).replace("_", "\\_") + "%"
    return {
        "kind_pattern": pattern,
        "queue": None if queue is None else options.validate_queue_name(queue),
        "category": category,
        "dependency_prefix": DEPENDENCY_REASON_PREFIX,
    }


def _prune(
    statement: str, queues: Sequence[str], retention_s: float, limit: int, using: str | None
) -> int:
    params = {"queues": list(queues), "retention_s": retention_s, "limit": limit}
    ((pruned,),) = db.fetchall(statement, params, using)
    return int(pruned)
