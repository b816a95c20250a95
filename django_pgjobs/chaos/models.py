"""The ledger of a chaos run: one row per execution of one of its jobs."""

from __future__ import annotations

from datetime import datetime
from typing import Any, ClassVar

from django.db import models

from django_pgjobs.claims import JobHandle
from django_pgjobs.db import connection as db
from django_pgjobs.db import sql
from django_pgjobs.functions import ClockTimestamp


class ChaosExecutionManager(models.Manager["ChaosExecution"]):
    """The ledger of a `manage.py chaosjobs` run, and the database calls the run makes."""

    def record_start(
        self, handle: JobHandle, *, run_id: str, version: int, ghost: bool
    ) -> ChaosExecution:
        """Commit that `handle`'s job started (at the database's clock) and return the row."""
        return self.using(handle.using).create(
            run_id=run_id,
            job_id=handle.id,
            token=handle.token,
            attempt=handle.attempt,
            max_attempts=handle.max_attempts,
            worker=handle.worker_id,
            key=handle.key,
            version=version,
            ghost=ghost,
            claimed_at=handle.claimed_at,
        )

    def record_outcome(self, execution: ChaosExecution, outcome: str, *, wrote: bool) -> None:
        """Set how an execution ended; `wrote`: it committed its result (stamps the time)."""
        changes: dict[str, Any] = {"outcome": outcome}
        if wrote:
            changes["written_at"] = ClockTimestamp()
        self.using(execution._state.db).filter(pk=execution.pk).update(**changes)

    def of_run(self, run_id: str, *, using: str | None = None) -> list[ChaosExecution]:
        alias = db.alias(using)
        return list(self.using(alias).filter(run_id=run_id).order_by("claimed_at", "id"))

    def forget_run(
        self, run_id: str, queue: str, batches: list[int], *, using: str | None = None
    ) -> None:
        """Delete what a run left: its ledger, its jobs (live and dead), their edges, its
        `batches` and their stats."""
        from django_pgjobs.models import Batch, BatchCallback, DeadJob, Dependency, Job, JobStats

        alias = db.alias(using)
        with db.atomic(alias):
            self.using(alias).filter(run_id=run_id).delete()
            ids = [
                *Job.objects.using(alias).filter(queue=queue).values_list("id", flat=True),
                *DeadJob.objects.using(alias).filter(queue=queue).values_list("id", flat=True),
            ]
            edges = Dependency.objects.using(alias)
            edges.filter(child_id__in=ids).delete()
            edges.filter(parent_id__in=ids).delete()
            Job.objects.using(alias).filter(queue=queue).delete()
            DeadJob.objects.using(alias).filter(queue=queue).delete()
            BatchCallback.objects.using(alias).filter(batch_id__in=batches).delete()
            Batch.objects.using(alias).filter(id__in=batches).delete()
            JobStats.objects.using(alias).filter(queue=queue).delete()

    def batch_ends(
        self, batches: list[int], *, using: str | None = None
    ) -> dict[int, tuple[str, int, int]]:
        """Each of `batches` as it stands: its state, members done and members failed."""
        from django_pgjobs.models import Batch

        found = {}
        for batch_id in batches:
            record = Batch.objects.get_batch(batch_id, using=db.alias(using))
            if record is not None:
                found[batch_id] = (record.state, record.done, record.failed)
        return found

    def census(self, queue: str, *, using: str | None = None) -> dict[str, int]:
        """How many jobs of `queue` are in each state, the dead ones under "dead"."""
        from django_pgjobs.models import DeadJob, Job

        alias = db.alias(using)
        counts = dict(
            Job.objects.using(alias)
            .filter(queue=queue)
            .values_list("state")
            .annotate(models.Count("id"))
            .order_by()
        )
        counts["dead"] = DeadJob.objects.using(alias).filter(queue=queue).count()
        return counts

    def final_rows(self, queue: str, *, using: str | None = None) -> list[dict[str, Any]]:
        """Every job of `queue`, live and dead: id, key, state, payload, result, reason."""
        from django_pgjobs.models import DeadJob, Job

        alias = db.alias(using)
        live = Job.objects.using(alias).filter(queue=queue)
        dead = DeadJob.objects.using(alias).filter(queue=queue)
        return [
            *(dict(row) for row in live.values("id", "key", "state", "payload", "result")),
            *(
                {**row, "state": "dead"}
                for row in dead.values("id", "key", "payload", "result", "reason")
            ),
        ]

    def limit_lock_wait(self, seconds: float, *, using: str | None = None) -> None:
        """Make the current transaction give up (LockNotAvailable) on a lock it waits for
        longer than `seconds`."""
        db.fetchall(sql.LIMIT_LOCK_WAIT, {"timeout": f"{int(seconds * 1000)}ms"}, using)

    def clock(self, *, using: str | None = None) -> datetime:
        """The database's time now (S22): what a run stamps its faults with."""
        return db.clock(using)

    def terminate_connections(
        self, application_name: str, *, limit: int, using: str | None = None
    ) -> int:
        """Drop up to `limit` server connections of `application_name` to this database;
        return how many."""
        params = {"application_name": application_name, "limit": limit}
        [(count,)] = db.fetchall(sql.TERMINATE_BACKENDS, params, using)
        return int(count)

    def hold_horizon(self, how: str, *, using: str | None = None) -> None:
        """Hold the database's xmin horizon until the caller's transaction ends: "idle"
        takes an XID (a session left idle in a transaction), "reader" reads the job table
        in REPEATABLE READ (a long report). Call first thing in the transaction."""
        if how == "reader":
            db.fetchall(sql.READ_JOBS_IN_SNAPSHOT, {}, using)
            db.fetchall(sql.COUNT_JOBS, {}, using)
        elif how == "idle":
            db.fetchall(sql.HOLD_XID, {}, using)
        else:
            raise ValueError(f"A pin is 'idle' or 'reader', not {how!r}.")


class ChaosExecution(models.Model):
    """One execution of a job of a `manage.py chaosjobs` run: its ledger, checked at the end.

    Written by the chaos handlers (django_pgjobs.chaos.jobs) with the database's clock;
    empty unless a chaos run is going on, and emptied by the run that wrote it.
    """

    run_id = models.CharField(max_length=40)
    job_id = models.BigIntegerField()
    token = models.UUIDField()
    attempt = models.IntegerField()
    max_attempts = models.IntegerField()
    worker = models.TextField()
    key = models.TextField(null=True, blank=True)
    version = models.IntegerField()
    ghost = models.BooleanField(
        db_default=False, help_text="Enqueued in a rolled-back transaction."
    )
    claimed_at = models.DateTimeField()
    started_at = models.DateTimeField(db_default=ClockTimestamp())
    written_at = models.DateTimeField(null=True, blank=True)
    outcome = models.CharField(max_length=16, db_default="started")

    objects: ClassVar[ChaosExecutionManager] = ChaosExecutionManager()

    class Meta:
        db_table = "pgjobs_chaos_execution"
        indexes: ClassVar[list[models.Index]] = [
            models.Index(fields=["run_id", "job_id"], name="pgjobs_chaos_run_job"),
            models.Index(fields=["token"], name="pgjobs_chaos_token"),
        ]

    def __str__(self) -> str:
        return f"{self.run_id}:{self.job_id}#{self.attempt}"
