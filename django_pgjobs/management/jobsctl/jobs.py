"""`jobsctl running` and `cancel`: the running jobs of every database or of the queues
named, and cancels of jobs by id in the database that holds them."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import timedelta
from typing import Any

from django.core.management.base import CommandError

from django_pgjobs import labels, options
from django_pgjobs.conf import pgjobs_settings
from django_pgjobs.management.jobsctl.databases import (
    by_database,
    checked_database,
    database_of_jobs,
    databases_read,
    in_database,
    several,
)
from django_pgjobs.management.jobsctl.output import Output, iso
from django_pgjobs.models import Job
from django_pgjobs.records import JobRecord, RunningJob
from django_pgjobs.states import UNFINISHED_STATES


def running(out: Output, queues: Sequence[str] | None, *, limit: int, as_json: bool) -> None:
    """Up to `limit` running jobs, the longest running first, of every database (or of
    the databases of `queues`)."""
    wanted: dict[str, list[str] | None] = (
        dict.fromkeys(pgjobs_settings.databases())
        if not queues
        else dict(by_database(options.validate_queue_names(list(queues))))
    )
    found = [
        (database, job)
        for database, names in wanted.items()
        for job in Job.objects.running(names, limit=limit + 1, using=database)
    ]
    found.sort(key=lambda pair: -pair[1].running_s)
    more = len(found) > limit
    found = found[:limit]
    if as_json:
        out.document(
            {
                "databases": list(wanted),
                "jobs": [_running_document(database, job) for database, job in found],
                "more": more,
            }
        )
        return
    if not found:
        where = f" in {', '.join(queues)}" if queues else ""
        out.line(f"No job is running{where}{databases_read(list(wanted))}.")
        return
    header = ("id", "queue", "kind", "worker", "attempt", "running for", "progress")
    rows = [
        (
            str(job.id),
            job.queue,
            job.kind,
            job.worker_id or "-",
            f"{job.attempt}/{job.max_attempts}",
            labels.age(job.running_s),
            labels.progress(job.progress, job.read_at),
            *((database,) if several() else ()),
        )
        for database, job in found
    ]
    out.table((*header, "database") if several() else header, rows)
    if more:
        out.line(f"(the first {limit}; --limit N shows more)")


def _running_document(database: str, job: RunningJob) -> dict[str, Any]:
    return {
        "id": job.id,
        "database": database,
        "queue": job.queue,
        "kind": job.kind,
        "worker_id": job.worker_id,
        "attempt": job.attempt,
        "max_attempts": job.max_attempts,
        "running_s": job.running_s,
        "started_at": iso(job.read_at - timedelta(seconds=job.running_s)),
        "progress": job.progress,
    }


def cancel(out: Output, ids: Sequence[int], database: str | None) -> None:
    wanted = sorted(set(ids))
    if database is None:
        database = database_of_jobs(
            wanted, action="cancel", done="cancelled", counts=lambda record: True
        )
    else:
        database = checked_database(database)
    if database is None:
        raise CommandError(
            f"No job has the id{'' if len(wanted) == 1 else 's'} "
            f"{', '.join(map(str, wanted))}{databases_read(pgjobs_settings.databases())}: "
            "nothing was cancelled. jobsctl running lists the running jobs."
        )
    before = Job.objects.get_jobs(wanted, using=database)
    cancelled = Job.objects.cancel_many(wanted, using=database)
    if not cancelled:
        raise CommandError(
            f"Nothing was cancelled{in_database(database)}: "
            f"{whereabouts(wanted, before)}. Only a waiting, pending or running job can "
            "be cancelled."
        )
    out.line(
        f"Cancelled {cancelled} of {len(wanted)} job(s) in database {database}: "
        "dead-lettered as 'cancelled' (requeue them with jobsctl requeue); running "
        "handlers are told to stop."
    )
    others = [
        job_id
        for job_id in wanted
        if (record := before.get(job_id)) is None or record.state not in UNFINISHED_STATES
    ]
    if others:
        out.line(f"The others were not pending or running: {whereabouts(others, before)}.")


def whereabouts(ids: Sequence[int], records: Mapping[int, JobRecord]) -> str:
    """Where each job of `ids` stood, as `records` (get_jobs) read them: "12 is a dead
    letter (failed), 13 is done, 99 is no job"."""
    parts = []
    for job_id in ids:
        record = records.get(job_id)
        if record is None:
            parts.append(f"{job_id} is no job")
        elif record.is_dead:
            parts.append(f"{job_id} is a dead letter ({record.reason})")
        else:
            parts.append(f"{job_id} is {record.state}")
    return ", ".join(parts)
