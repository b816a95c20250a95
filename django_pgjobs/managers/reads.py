"""`Job.objects`' reads: the operators' view of the live table (get_job, running jobs,
queue overviews, capped counts). `JobManager` builds on it with the writes."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from typing import TYPE_CHECKING, Any

from django.db import models

from django_pgjobs import options
from django_pgjobs.conf import pgjobs_settings
from django_pgjobs.db import connection as db
from django_pgjobs.db import sql
from django_pgjobs.managers import workflows
from django_pgjobs.records import COUNT_CAP, Count, JobRecord, QueueOverview, RunningJob

if TYPE_CHECKING:
    from django_pgjobs.models import Job  # noqa: F401

#: The jsonb columns of a job, which a raw statement reads as text.
JSON_COLUMNS = ("payload", "result", "errors", "rerun_payload", "progress")


class JobReads(models.Manager["Job"]):
    """Read jobs and queues; change nothing."""

    def clock(self, *, using: str | None = None) -> datetime:
        """The database's time at this instant (S22), for a time nothing stored holds."""
        return db.clock(using)

    def get_job(self, job_id: int, *, using: str | None = None) -> JobRecord | None:
        """Read a job from the live or the dead table (S19), or return None."""
        from django_pgjobs.models import DeadJob

        alias = db.alias(using)
        live = self.using(alias).filter(pk=job_id).values().first()
        if live is not None:
            values: dict[str, Any] = dict(live)
        else:
            dead = DeadJob.objects.using(alias).filter(pk=job_id).values().first()
            if dead is None:
                return None
            values = {**dead, "state": "dead"}
        return JobRecord.of(workflows.with_dependencies(values, alias))

    def running(
        self, queues: Sequence[str] | None = None, *, limit: int = 50, using: str | None = None
    ) -> list[RunningJob]:
        """Up to `limit` running jobs of `queues` (None: every queue), the longest
        running first, with their progress."""
        names = None if queues is None else options.validate_queue_names(queues)
        params = {"queues": names, "limit": limit}
        return [
            RunningJob(
                id=row["id"],
                queue=row["queue"],
                kind=row["kind"],
                worker_id=row["worker_id"],
                attempt=row["attempts"],
                max_attempts=row["max_attempts"],
                running_s=row["running_s"],
                progress=db.json_value(row["progress"]),
                read_at=row["now"],
            )
            for row in db.fetch_named(sql.RUNNING_JOBS, params, using)
        ]

    def running_of_workers(
        self, worker_ids: Sequence[str], *, per_worker: int = 5, using: str | None = None
    ) -> dict[str, list[tuple[int, str]]]:
        """Up to `per_worker` running jobs of each of `worker_ids`, by id: (id, kind) by
        worker, in one read (a worker running none is absent)."""
        if not worker_ids:
            return {}
        params = {"workers": list(worker_ids), "per_worker": per_worker}
        found: dict[str, list[tuple[int, str]]] = {}
        for worker_id, job_id, kind in db.fetchall(sql.RUNNING_JOBS_OF_WORKERS, params, using):
            found.setdefault(worker_id, []).append((job_id, kind))
        return found

    def get_jobs(self, job_ids: Sequence[int], *, using: str | None = None) -> dict[int, JobRecord]:
        """Read many jobs from the live and the dead table in one statement (S19): those
        found, by id."""
        rows = db.fetch_named(sql.READ_JOBS, {"ids": db.array_of_ids(job_ids)}, using)
        for values in rows:
            for column in JSON_COLUMNS:
                values[column] = db.json_value(values[column])
        return {values["id"]: JobRecord.of(values) for values in rows}

    def queue_names(self, *, dead: bool = False, using: str | None = None) -> list[str]:
        """Queues with jobs (or, with `dead`, with dead letters), and the configured ones."""
        statement = sql.DEAD_QUEUE_NAMES if dead else sql.LIVE_QUEUE_NAMES
        found = {row[0] for row in db.fetchall(statement, {}, using)}
        if not dead:
            found.update(pgjobs_settings.QUEUES)
        return sorted(found)

    def _dead_estimates(self, queues: list[str], using: str | None) -> dict[str, int]:
        """The estimates of the dead letters of `queues` past the cap, read at once from
        the partitions' statistics (S44); those it cannot make (statistics this role may
        not read, partitions not analyzed yet) are left out, for the planner to make."""
        rows = db.fetchall(sql.ESTIMATE_DEAD_QUEUES, {"queues": queues}, using)
        return {
            queue: int(estimated)
            for queue, estimated, complete in rows
            if complete and estimated > COUNT_CAP
        }

    def overview(self, *, using: str | None = None) -> list[QueueOverview]:
        """Every queue's runnable, scheduled, running and dead jobs and its oldest runnable
        job's age, read along the partial indexes; counts past COUNT_CAP are estimates."""
        queues = sorted(
            set(self.queue_names(using=using)) | set(self.queue_names(dead=True, using=using))
        )
        if not queues:
            return []
        rows = db.fetchall(sql.QUEUE_OVERVIEW, {"queues": queues, "cap": COUNT_CAP}, using)
        estimates = (
            sql.ESTIMATE_RUNNABLE,
            sql.ESTIMATE_SCHEDULED,
            sql.ESTIMATE_RUNNING,
            sql.ESTIMATE_DEAD,
            sql.ESTIMATE_RETRYING,
            sql.ESTIMATE_DONE,
        )
        many_dead = [queue for queue, *counts in rows if counts[3] > COUNT_CAP]
        dead_estimates = self._dead_estimates(many_dead, using) if many_dead else {}

        def estimate(statement: str, queue: str) -> int:
            if statement == sql.ESTIMATE_DEAD and queue in dead_estimates:
                return dead_estimates[queue]
            return db.estimate(statement, {"queue": queue}, using)

        overview = []
        for queue, runnable_n, scheduled_n, running_n, dead_n, oldest, *more in rows:
            runnable, scheduled, running, dead, retrying, done = (
                Count(int(value))
                if value <= COUNT_CAP
                else Count(estimate(statement, queue), estimated=True)
                for value, statement in zip(
                    (runnable_n, scheduled_n, running_n, dead_n, *more), estimates, strict=True
                )
            )
            overview.append(
                QueueOverview(
                    queue,
                    runnable,
                    scheduled,
                    running,
                    dead,
                    oldest_runnable_s=oldest,
                    retrying=retrying,
                    done=done,
                )
            )
        return overview

    def busy_in(self, queues: Sequence[str], *, using: str | None = None) -> int:
        """How many jobs of `queues` can run now or are running."""
        names = options.validate_queue_names(queues)
        ((busy,),) = db.fetchall(sql.BUSY_JOBS, {"queues": names}, using)
        return int(busy)

    def capped_count(self, queryset: models.QuerySet[Any]) -> int:
        """Count a queryset's rows up to COUNT_CAP; past it, return the planner's estimate."""
        exact = queryset.order_by()[: COUNT_CAP + 1].count()
        if exact <= COUNT_CAP:
            return exact
        return max(db.planned_rows(queryset.order_by()), exact)
