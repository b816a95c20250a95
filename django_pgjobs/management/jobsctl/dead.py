"""`jobsctl dead` and `requeue`: the dead letters, newest first, and back to work by id or
by filter (kind prefix, queue, reason category), as the admin's dead-letter list offers."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from django.core.management.base import CommandError

from django_pgjobs import labels
from django_pgjobs.conf import pgjobs_settings
from django_pgjobs.management.jobsctl.databases import (
    checked_database,
    database_of_jobs,
    databases_read,
    in_database,
    several,
)
from django_pgjobs.management.jobsctl.jobs import whereabouts
from django_pgjobs.management.jobsctl.output import Output, ago_and_when, iso, plural
from django_pgjobs.models import DeadJob, Job
from django_pgjobs.records import DeadLetter, RequeueResult

#: How many characters of a reason a row of the listing shows.
REASON_CHARS = 40


class Filters:
    """The letters a listing or a requeue names: a kind prefix, a queue, a category."""

    def __init__(self, kind: str | None, queue: str | None, category: str | None) -> None:
        self.kind, self.queue, self.category = kind, queue, category

    def any(self) -> bool:
        return any(value is not None for value in (self.kind, self.queue, self.category))

    def databases(self) -> list[str]:
        """The databases to read: the queue's own, or every one."""
        if self.queue is not None:
            return [pgjobs_settings.database_of(self.queue)]
        return pgjobs_settings.databases()

    def described(self) -> str:
        """ " of kind prefix 'billing.', queue 'emails', reason 'failed'", or nothing."""
        parts = [
            *([f"kind prefix {self.kind!r}"] if self.kind is not None else []),
            *([f"queue {self.queue!r}"] if self.queue is not None else []),
            *([f"reason {self.category!r}"] if self.category is not None else []),
        ]
        return f" of {', '.join(parts)}" if parts else ""

    def of(self) -> dict[str, Any]:
        return {"kind": self.kind, "queue": self.queue, "category": self.category}


def dead(out: Output, filters: Filters, *, limit: int, as_json: bool) -> None:
    """Up to `limit` dead letters matching `filters`, the newest first, from every
    database (or the queue's)."""
    databases = filters.databases()
    found = [
        (database, letter)
        for database in databases
        for letter in DeadJob.objects.letters(**filters.of(), limit=limit + 1, using=database)
    ]
    found.sort(key=lambda pair: (pair[1].died_at, pair[1].id), reverse=True)
    more = len(found) > limit
    found = found[:limit]
    if as_json:
        out.document(
            {
                "databases": databases,
                "filters": filters.of(),
                "letters": [_letter_document(database, letter) for database, letter in found],
                "more": more,
            }
        )
        return
    if not found:
        out.line(f"No dead letter{filters.described()}{databases_read(databases)}.")
        return
    header = ("id", "kind", "queue", "reason", "died")
    rows = [
        (
            str(letter.id),
            letter.kind,
            letter.queue,
            first_line(letter.reason, REASON_CHARS),
            ago_and_when(letter.died_at, letter.died_s_ago),
            *((database,) if several() else ()),
        )
        for database, letter in found
    ]
    out.table((*header, "database") if several() else header, rows)
    if more:
        out.line(f"(the newest {limit}; --limit N shows more)")


def _letter_document(database: str, letter: DeadLetter) -> dict[str, Any]:
    return {
        "id": letter.id,
        "database": database,
        "queue": letter.queue,
        "kind": letter.kind,
        "key": letter.key,
        "reason": letter.reason,
        "category": letter.category,
        "attempts": letter.attempts,
        "max_attempts": letter.max_attempts,
        "last_error": letter.last_error,
        "created_at": iso(letter.created_at),
        "died_at": iso(letter.died_at),
        "died_s_ago": letter.died_s_ago,
    }


def requeue_ids(out: Output, ids: Sequence[int], database: str | None) -> None:
    """Requeue the dead letters `ids` of the database that holds them (or `database`)."""
    wanted = sorted(set(ids))
    if database is None:
        database = database_of_jobs(
            wanted, action="requeue", done="requeued", counts=lambda record: record.is_dead
        )
    else:
        database = checked_database(database)
    if database is None:
        raise CommandError(
            f"No dead letter has the id{'' if len(wanted) == 1 else 's'} "
            f"{', '.join(map(str, wanted))}{databases_read(pgjobs_settings.databases())}: "
            "nothing was requeued. jobsctl dead lists the dead letters."
        )
    before = Job.objects.get_jobs(wanted, using=database)
    result = DeadJob.objects.requeue(wanted, using=database)
    if not (result.requeued or result.merged):
        raise CommandError(
            f"Nothing was requeued{in_database(database)}: {whereabouts(wanted, before)}. "
            "Only a dead letter can be requeued: jobsctl dead lists them."
        )
    out.line(
        f"Requeued {result.requeued} of {len(wanted)} job(s){in_database(database)}"
        + _requeued(result)
    )
    others = [
        job_id for job_id in wanted if (record := before.get(job_id)) is None or not record.is_dead
    ]
    if others:
        out.line(f"The others were not dead letters: {whereabouts(others, before)}.")


def requeue_matching(out: Output, filters: Filters, database: str | None) -> None:
    """Requeue every dead letter matching `filters` in every database (the queue's, or
    `database`)."""
    databases = [checked_database(database)] if database else filters.databases()
    done = {
        alias: DeadJob.objects.requeue_matching(**filters.of(), using=alias) for alias in databases
    }
    if not any(result.requeued or result.merged for result in done.values()):
        raise CommandError(
            f"No dead letter{filters.described()}{databases_read(databases)}: nothing was "
            "requeued. jobsctl dead lists the dead letters (with the same filters)."
        )
    for alias, result in done.items():
        if result.requeued or result.merged or not several():
            out.line(
                f"Requeued {plural(result.requeued, 'dead letter')}{filters.described()}"
                f"{in_database(alias)}" + _requeued(result)
            )


def _requeued(result: RequeueResult) -> str:
    """ ": back to pending with fresh attempts; 1 merged into the live job of its key"."""
    text = ": back to pending with fresh attempts"
    if result.merged:
        text += (
            f"; {result.merged:,} more merged into the live job of "
            f"{'its' if result.merged == 1 else 'their'} key instead"
        )
    return text + "."


def first_line(text: str, length: int) -> str:
    """The first line of `text`, cut to `length` characters with an ellipsis, its control
    characters blanked (a handler's message is no terminal's escape sequence)."""
    lines = text.strip().splitlines()
    first = "".join(char if char.isprintable() else " " for char in (lines or [""])[0])
    return labels.shortened(first, length)
