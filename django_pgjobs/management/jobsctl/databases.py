"""Which database a `jobsctl` command acts on, with PGJOBS["QUEUE_DATABASES"]: a queue's
own, the one that holds the ids it names, or every one; and how it says so."""

from __future__ import annotations

from collections.abc import Callable, Sequence

from django.core.management.base import CommandError

from django_pgjobs.conf import pgjobs_settings
from django_pgjobs.models import Job
from django_pgjobs.records import JobRecord


def several() -> bool:
    """Whether jobs live in more than one database (then every message names its own)."""
    return len(pgjobs_settings.databases()) > 1


def in_database(alias: str) -> str:
    """ " in database jobs_a", or nothing when the jobs live in one database only."""
    return f" in database {alias}" if several() else ""


def databases_read(aliases: Sequence[str]) -> str:
    """ " (read database jobs_a)", or nothing when the jobs live in one database only."""
    if not several():
        return ""
    return f" (read {', '.join(f'database {name}' for name in aliases)})"


def checked_database(alias: str) -> str:
    """`alias` if it holds jobs, else a CommandError that lists those that do."""
    if alias not in pgjobs_settings.databases():
        raise CommandError(
            f"{alias!r} holds no jobs: --database is one of "
            f"{', '.join(pgjobs_settings.databases())}."
        )
    return alias


def by_database(queues: Sequence[str]) -> dict[str, list[str]]:
    """`queues` by the database their jobs live in (PGJOBS["QUEUE_DATABASES"])."""
    grouped: dict[str, list[str]] = {}
    for queue in queues:
        grouped.setdefault(pgjobs_settings.database_of(queue), []).append(queue)
    return grouped


def database_of_jobs(
    ids: Sequence[int], *, action: str, done: str, counts: Callable[[JobRecord], bool]
) -> str | None:
    """The one database that holds the jobs `ids` name, of those a record `counts` for
    (live or dead for a cancel, dead letters for a requeue); a CommandError when they name
    jobs in several, with what to type instead (`jobsctl {action} --database ...`; nothing
    was `done`). None when several databases hold jobs and none holds one of these."""
    databases = pgjobs_settings.databases()
    if len(databases) == 1:
        return databases[0]
    holders = {
        database: {
            job_id
            for job_id, record in Job.objects.get_jobs(ids, using=database).items()
            if counts(record)
        }
        for database in databases
    }
    where = {job_id: [db for db, held in holders.items() if job_id in held] for job_id in ids}
    ambiguous = {job_id: found for job_id, found in where.items() if len(found) > 1}
    if ambiguous:
        job_id, found = next(iter(ambiguous.items()))
        raise CommandError(
            f"Job {job_id} names a job in each of the databases {', '.join(found)} "
            "(each has ids of its own): say which, e.g. "
            f"jobsctl {action} --database {found[-1]} {job_id}. Nothing was {done}."
        )
    used = sorted({found[0] for found in where.values() if found})
    if len(used) > 1:
        raise CommandError(
            f"These ids name jobs in several databases ({', '.join(used)}): {action} each "
            f"database's with jobsctl {action} --database ALIAS ID... Nothing was {done}."
        )
    return used[0] if used else None
