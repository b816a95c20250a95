"""A job's timeline on its page: enqueued, each attempt (on which worker, how it ended,
its error), how it ended, and what people did to it from the console (the admin's log),
oldest first. Read from the job's own row and the log: nothing is recorded for it."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from django.contrib.admin.models import LogEntry
from django.contrib.contenttypes.models import ContentType
from django.utils import timezone
from django.utils.dateparse import parse_datetime
from django.utils.html import format_html, format_html_join
from django.utils.safestring import SafeString

from django_pgjobs import labels
from django_pgjobs.admin import audit
from django_pgjobs.admin.common import exact_time
from django_pgjobs.models import DeadJob, Job
from django_pgjobs.states import JobState

#: What a timeline shows of an error, and of a person's note.
_TEXT_CHARS = 160


def timeline(obj: Job | DeadJob) -> SafeString:
    """The job's events as a table, oldest first."""
    events = sorted(_events(obj), key=lambda event: (_aware(event[0]), event[1]))
    rows = format_html_join(
        "",
        '<tr><td class="nowrap">{}</td><td class="nowrap">{}</td><td>{}</td></tr>',
        ((exact_time(at), what, detail) for at, _, what, detail in events),
    )
    return format_html(
        '<table class="pgjobs-timeline"><thead><tr><th>at</th><th>what</th><th>detail</th>'
        "</tr></thead><tbody>{}</tbody></table>",
        rows,
    )


def _events(obj: Job | DeadJob) -> list[tuple[datetime, int, str, str]]:
    """(at, order within the same instant, what, detail) for each event of the job."""
    events: list[tuple[datetime, int, str, str]] = []
    if obj.created_at is not None:
        events.append((obj.created_at, 0, "enqueued", f"queue {obj.queue}"))
    for entry in obj.errors if isinstance(obj.errors, list) else []:
        if not isinstance(entry, dict):
            continue
        at = _moment(entry.get("at"))
        if at is None:
            continue
        worker = entry.get("worker_id") or "a worker"
        error = labels.shortened(str(entry.get("error") or ""), _TEXT_CHARS)
        events.append(
            (at, 2, f"attempt {entry.get('attempt', '?')} failed", f"on {worker}: {error}")
        )
    attempt = f"attempt {obj.attempts}"
    if obj.claimed_at is not None and obj.attempts:
        events.append((obj.claimed_at, 1, f"{attempt} claimed", f"by {obj.worker_id or '?'}"))
    if isinstance(obj, DeadJob):
        events.append((obj.died_at, 3, "dead-lettered", labels.shortened(obj.reason, _TEXT_CHARS)))
    elif obj.state == JobState.DONE and obj.finished_at is not None:
        ran = ""
        seconds = (obj.finished_at - obj.started_at).total_seconds() if obj.started_at else -1
        if seconds >= 0:  # (both from the database's clock; one transaction can invert them)
            ran = f" after {labels.age(seconds) if seconds >= 1 else f'{seconds * 1000:.0f} ms'}"
        events.append((obj.finished_at, 3, f"{attempt} done", f"on {obj.worker_id or '?'}{ran}"))
    events += _people(obj)
    return events


def _people(obj: Job | DeadJob) -> list[tuple[datetime, int, str, str]]:
    """What the admin's log says people did to this job or its dead letter."""
    types = ContentType.objects.get_for_models(Job, DeadJob, for_concrete_models=False)
    entries = LogEntry.objects.filter(
        content_type__in=list(types.values()), object_id=str(obj.pk)
    ).select_related("user")
    # Ids are each database's own: the entries of this job's database only.
    tag = audit.database_tag()
    if tag:
        entries = entries.filter(change_message__endswith=tag)
    else:
        entries = entries.exclude(change_message__regex=r" \(database [^)]*\)$")
    return [
        (
            entry.action_time,
            4,
            f"by {entry.user.get_username()}",
            labels.shortened(entry.get_change_message(), _TEXT_CHARS),
        )
        for entry in entries.order_by("action_time")
    ]


def _aware(moment: datetime) -> datetime:
    """A time that sorts beside the others: with USE_TZ = False the database's are naive
    (the project's TIME_ZONE), an error entry's aware."""
    if timezone.is_aware(moment):
        return moment
    return timezone.make_aware(moment, timezone.get_default_timezone())


def _moment(value: Any) -> datetime | None:
    """An error entry's time (ISO text as the worker writes it; a row edited by hand may
    hold anything), aware, or None."""
    try:
        moment = parse_datetime(value) if isinstance(value, str) else value
    except ValueError:
        return None
    if not isinstance(moment, datetime):
        return None
    return moment if timezone.is_aware(moment) else timezone.make_aware(moment, UTC)
