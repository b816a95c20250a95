"""`jobsctl status`, `pause`, `resume`, `limit` and `rate`: the queues at a glance, and
their controls, each acting on the database of the queue it names."""

from __future__ import annotations

import difflib
from collections.abc import Sequence
from typing import Any

from django.core.management.base import CommandError

from django_pgjobs import labels, options
from django_pgjobs.conf import pgjobs_settings
from django_pgjobs.management.jobsctl.databases import by_database, in_database
from django_pgjobs.management.jobsctl.output import Output, iso
from django_pgjobs.managers.workers import unserved_queues
from django_pgjobs.models import QueueControl, Worker
from django_pgjobs.records import Count, QueueStatus, WorkerStatus
from django_pgjobs.worker.options import default_queues

#: The counts of a queue, in the order the table and the JSON document show them.
COUNTS = ("runnable", "scheduled", "retrying", "running", "done", "dead")


def status(out: Output, *, as_json: bool) -> None:
    """Each database's queues and workers: a table each, or one JSON document."""
    databases = pgjobs_settings.databases()
    read = [
        (
            database,
            QueueControl.objects.status(using=database),
            Worker.objects.status(using=database),
        )
        for database in databases
    ]
    if as_json:
        out.document(
            {
                "databases": [
                    {
                        "database": database,
                        "queues": [_queue_document(each) for each in statuses],
                        "workers": [_worker_document(worker) for worker in workers],
                        "unserved": unserved_queues(statuses, workers),
                    }
                    for database, statuses, workers in read
                ]
            }
        )
        return
    for index, (database, statuses, workers) in enumerate(read):
        if index:
            out.line()
        if len(databases) > 1:  # PGJOBS["QUEUE_DATABASES"]: each database's own
            out.heading(f"Database {database}")
        _queues_table(out, statuses)
        out.line()
        workers_table(out, workers)
        unserved = unserved_queues(statuses, workers)
        if unserved:
            out.line()
            out.warning(
                f"Warning: no live worker serves {', '.join(unserved)}, which "
                f"{'has' if len(unserved) == 1 else 'have'} runnable jobs."
            )


def _queues_table(out: Output, statuses: Sequence[QueueStatus]) -> None:
    if not statuses:
        out.line("No queues yet: no job, no dead letter, no control.")
        return
    header = (
        "queue",
        "runnable",
        "scheduled",
        "retrying",
        "running",
        "done",
        "rate",
        "paused",
        "dead",
        "oldest runnable",
    )
    rows = [
        (
            status.queue,
            labels.count(status.runnable),
            labels.count(status.scheduled),
            labels.count(status.retrying),
            labels.running_of_limit(status.running, status.max_running),
            labels.count(status.done),
            status.rate or "",
            "yes" if status.paused else "",
            labels.count(status.dead),
            labels.age(status.oldest_runnable_s),
        )
        for status in statuses
    ]
    out.table(header, rows)


def workers_table(out: Output, workers: Sequence[WorkerStatus]) -> None:
    """Print the workers' table of `status` (the docs print a sample with it too)."""
    if not workers:
        out.line("No workers registered: start one with python manage.py runjobs.")
        return
    header = ("worker", "state", "queues", "running", "done", "failed", "last seen", "version")
    rows = [
        (
            worker.id,
            _worker_state(worker) + (f", asked: {worker.asked}" if worker.asked else ""),
            ",".join(
                f"{queue} (paused here)" if queue in worker.paused_queues else queue
                for queue in worker.queues
            ),
            f"{worker.running} of {worker.concurrency}",
            f"{worker.succeeded:,}",
            f"{worker.failed:,}",
            f"{labels.age(worker.seen_s_ago)} ago",
            worker.version,
        )
        for worker in workers
    ]
    out.table(header, rows)


def _worker_state(worker: WorkerStatus) -> str:
    return "live" if worker.live else "stopped" if worker.stopped_at else "gone"


def _queue_document(status: QueueStatus) -> dict[str, Any]:
    counts: dict[str, Count] = {name: getattr(status, name) for name in COUNTS}
    return {
        "queue": status.queue,
        **{name: count.value for name, count in counts.items()},
        "estimated": [name for name, count in counts.items() if count.estimated],
        "oldest_runnable_s": status.oldest_runnable_s,
        "paused": status.paused,
        "max_running": status.max_running,
        "rate": status.rate,
    }


def _worker_document(worker: WorkerStatus) -> dict[str, Any]:
    return {
        "id": worker.id,
        "state": _worker_state(worker),
        "host": worker.host,
        "pid": worker.pid,
        "queues": worker.queues,
        "paused_here": worker.paused_queues,
        "asked": worker.asked,
        "asked_by": worker.asked_by,
        "concurrency": worker.concurrency,
        "running": worker.running,
        "succeeded": worker.succeeded,
        "failed": worker.failed,
        "version": worker.version,
        "started_at": iso(worker.started_at),
        "last_seen_at": iso(worker.last_seen_at),
        "stopped_at": iso(worker.stopped_at),
        "seen_s_ago": worker.seen_s_ago,
    }


def pause(out: Output, queues: Sequence[str], *, create: bool) -> None:
    names = _known(queues, action="pause", create=create)
    paused = [
        f"{name}{in_database(database)}"
        for database, grouped in by_database(names).items()
        for name in QueueControl.objects.pause(grouped, using=database)
    ]
    out.line(
        f"Paused {', '.join(paused)}: no worker claims their jobs until resumed "
        "(enqueues still land)."
    )


def resume(out: Output, queues: Sequence[str], *, create: bool) -> None:
    names = _known(queues, action="resume", create=create)
    resumed = [
        f"{name}{in_database(database)}"
        for database, grouped in by_database(names).items()
        for name in QueueControl.objects.resume(grouped, using=database)
    ]
    if resumed:
        out.line(f"Resumed {', '.join(resumed)}; workers woken.")
    else:
        out.line(f"Not paused: {', '.join(names)}. Nothing to do.")


def set_limit(out: Output, queue: str, max_running: int | None) -> None:
    database = pgjobs_settings.database_of(queue)
    changed = QueueControl.objects.set_limit(queue, max_running, using=database)
    what = "no limit" if max_running is None else f"at most {max_running} running"
    out.line(f"{queue}{in_database(database)}: {what}" + ("." if changed else " (already so)."))


def set_rate(out: Output, queue: str, text: str) -> None:
    rate = None if text.lower() in ("none", "off") else text
    database = pgjobs_settings.database_of(queue)
    changed = QueueControl.objects.set_rate(queue, rate, using=database)
    what = "no rate" if rate is None else f"at most {rate} claims"
    out.line(f"{queue}{in_database(database)}: {what}" + ("." if changed else " (already so)."))


def known_queues() -> list[str]:
    """Every queue something names: the registered jobs and tasks, the settings (QUEUES,
    QUEUE_DATABASES, DEFAULT_QUEUE), and every database's jobs, dead letters and rows."""
    named = {*default_queues(), *pgjobs_settings.QUEUE_DATABASES}
    for database in pgjobs_settings.databases():
        named.update(QueueControl.objects.names(using=database))
    return sorted(named)


def _known(queues: Sequence[str], *, action: str, create: bool) -> list[str]:
    """`queues`, checked as names, and known unless `create`: a name nothing has ever
    named is more likely a typo than a queue to steer."""
    names = options.validate_queue_names(list(queues))
    if create:
        return names
    known = known_queues()
    unknown = [name for name in names if name not in known]
    for database in pgjobs_settings.databases() if unknown else []:
        # Waiting and done jobs, which the listing of known queues does not read.
        held = QueueControl.objects.holding_anything(unknown, using=database)
        unknown = [name for name in unknown if name not in held]
    if not unknown:
        return names
    one = len(unknown) == 1
    it = "it" if one else "them"
    databases = pgjobs_settings.databases()
    where = f"database{'s' if len(databases) > 1 else ''} {', '.join(databases)}"
    guesses = "".join(
        f" Did you mean {' or '.join(map(repr, close))} for {name!r}?"
        for name in unknown
        if (close := difflib.get_close_matches(name, known, n=2, cutoff=0.6))
    )
    raise CommandError(
        f"Unknown queue{'' if one else 's'} {', '.join(map(repr, unknown))}: no registered "
        f"job or task names {it}, no setting, and {where} hold{'s' if len(databases) == 1 else ''} "
        f"no job, dead letter or control of {it}.{guesses} Known queues: "
        f"{', '.join(known) or 'none'}. Nothing was {action}d. To {action} {it} anyway "
        f"(a queue a coming deploy brings), add --create: "
        f"jobsctl {action} --create {' '.join(names)}"
    )
