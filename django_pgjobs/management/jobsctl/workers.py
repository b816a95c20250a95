"""`jobsctl worker …`: what the console's worker controls do, from a terminal: ask
workers (by id, or every worker on a host) to go quiet, to stop after their running jobs,
or to run again; pause one of a worker's queues on it alone, or resume it there. Each
worker obeys at its next heartbeat; the registry keeps who asked."""

from __future__ import annotations

import getpass
import socket
from collections.abc import Sequence

from django.core.management.base import CommandError

from django_pgjobs.conf import pgjobs_settings
from django_pgjobs.management.jobsctl.databases import in_database
from django_pgjobs.management.jobsctl.output import Output, plural
from django_pgjobs.models import Worker
from django_pgjobs.states import WorkerAsk

#: What each verb asks of a worker, and how the message says it.
ASKS: dict[str, tuple[str | None, str]] = {
    "quiet": (WorkerAsk.QUIET, "go quiet (claim no more jobs)"),
    "stop": (WorkerAsk.STOP, "stop after their running jobs"),
    "run": (None, "run again"),
}


def who() -> str:
    """Who asks, as the registry and the console say it: the terminal's user and host."""
    try:
        user = getpass.getuser()
    except (KeyError, OSError):
        user = "?"
    return f"{user}@{socket.gethostname()} (jobsctl)"


def ask(out: Output, verb: str, ids: Sequence[str], host: str | None) -> None:
    """Ask the workers `ids` (or every live worker on `host`) to go quiet, stop or run
    again, in every database that holds jobs."""
    if bool(ids) == bool(host):
        raise CommandError(
            "Which workers? Give their ids (jobsctl status lists them), or --host HOST "
            "for every worker on a host; not both. Nothing was asked."
        )
    asked, said = ASKS[verb]
    done: list[tuple[str, str]] = []
    for database in pgjobs_settings.databases():
        chosen = list(ids) or [
            worker.id
            for worker in Worker.objects.status(using=database)
            if worker.host == host and worker.stopped_at is None
        ]
        if chosen:
            changed = Worker.objects.ask(chosen, asked, by=who(), using=database)
            done.extend((worker_id, database) for worker_id in changed)
    if not done:
        target = f"on host {host!r}" if host else ", ".join(ids)
        raise CommandError(
            f"No running worker {target} could be asked to {said}: each has stopped, was "
            "asked to stop already, or is not registered (jobsctl status lists them)."
        )
    for worker_id, database in done:
        out.line(f"Asked worker {worker_id}{in_database(database)} to {said}.")
    one = len(done) == 1
    out.line(
        f"{plural(len(done), 'worker')} {'obeys' if one else 'obey'} at "
        f"{'its' if one else 'their'} next heartbeat "
        f"(every {pgjobs_settings.WORKER_HEARTBEAT:g} s)."
    )


def pause_here(out: Output, worker_id: str, queue: str, *, paused: bool) -> None:
    """Pause `queue` on the worker `worker_id` alone, or resume it there."""
    what = "paused" if paused else "resumed"
    for database in pgjobs_settings.databases():
        status = Worker.objects.status_of(worker_id, using=database)
        if status is None:
            continue
        if queue not in status.queues:
            raise CommandError(
                f"Worker {worker_id} does not claim from queue {queue!r}: its queues are "
                f"{', '.join(status.queues) or 'none'}. Nothing was changed."
            )
        changed = Worker.objects.pause_on(
            [worker_id], queue, paused=paused, by=who(), using=database
        )
        if not changed:
            raise CommandError(
                f"Queue {queue} was already {what} on worker {worker_id}, or the worker has "
                "stopped: nothing was changed."
            )
        others = "; the other workers still claim its jobs" if paused else ""
        out.line(
            f"Queue {queue} {what} on worker {worker_id}{in_database(database)} alone{others}. "
            f"It obeys at its next heartbeat (every {pgjobs_settings.WORKER_HEARTBEAT:g} s)."
        )
        return
    raise CommandError(
        f"No worker {worker_id!r} is registered (jobsctl status lists them). Nothing was changed."
    )
