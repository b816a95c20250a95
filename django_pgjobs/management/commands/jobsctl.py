"""`manage.py jobsctl`: queues and schedules at a glance, and their controls.

python manage.py jobsctl status               # a table per queue, then the workers
python manage.py jobsctl pause emails         # no worker claims its jobs
python manage.py jobsctl resume emails        # and wake the workers at once
python manage.py jobsctl limit emails 5       # at most 5 running, across every worker
python manage.py jobsctl limit emails none    # no limit
python manage.py jobsctl rate emails 100/m    # at most 100 claims a minute, across every worker
python manage.py jobsctl rate emails none     # no rate
python manage.py jobsctl running              # the running jobs: worker, for how long, progress
python manage.py jobsctl cancel 12 13         # dead-letter them as cancelled; handlers told
python manage.py jobsctl cancel --database jobs_a 12   # job 12 of that database

With PGJOBS["QUEUE_DATABASES"], each command acts on the database of the queue it names;
`cancel` finds each id's database, and refuses an id that names a job in several (say
which with --database); `running` reads every database, or those of the queues named.
python manage.py jobsctl schedules            # every schedule, its next and last run
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser
from django.db import DatabaseError

from django_pgjobs import labels
from django_pgjobs.conf import pgjobs_settings
from django_pgjobs.exceptions import InvalidJobOption
from django_pgjobs.managers.workers import unserved_queues
from django_pgjobs.models import Job, QueueControl, Schedule, Worker
from django_pgjobs.records import QueueStatus, WorkerStatus


def _limit(text: str) -> int | None:
    if text.lower() in ("none", "off"):
        return None
    try:
        value = int(text)
    except ValueError:
        raise CommandError(f"{text!r} is not a limit: give a whole number >= 1, or none.") from None
    return value


class Command(BaseCommand):
    help = "Show queues and schedules; pause, resume, limit or rate-limit queues."

    def add_arguments(self, parser: CommandParser) -> None:
        actions = parser.add_subparsers(dest="action", required=True, metavar="ACTION")
        actions.add_parser(
            "status", help="Each queue (runnable, scheduled, running, dead ...), each worker."
        )
        pause = actions.add_parser("pause", help="Stop every worker claiming these queues.")
        pause.add_argument("queues", nargs="+", metavar="QUEUE")
        resume = actions.add_parser("resume", help="Let workers claim these queues again.")
        resume.add_argument("queues", nargs="+", metavar="QUEUE")
        limit = actions.add_parser(
            "limit", help="Cap a queue's running jobs across every worker (none: no cap)."
        )
        limit.add_argument("queue", metavar="QUEUE")
        limit.add_argument("max_running", metavar="N|none")
        rate = actions.add_parser(
            "rate", help="Cap a queue's claims per period across every worker (none: no cap)."
        )
        rate.add_argument("queue", metavar="QUEUE")
        rate.add_argument("rate", metavar="N/PERIOD|none", help="100/m, 5/s, 1000/h, 3/10s")
        running = actions.add_parser(
            "running", help="The running jobs, longest first: worker, time, progress."
        )
        running.add_argument("queues", nargs="*", metavar="QUEUE", help="only these queues")
        running.add_argument("--limit", type=int, default=50, help="show at most N (50)")
        cancel = actions.add_parser(
            "cancel", help="Cancel jobs by id: dead-lettered (requeueable), running handlers told."
        )
        cancel.add_argument("ids", nargs="+", type=int, metavar="ID")
        cancel.add_argument(
            "--database",
            metavar="ALIAS",
            help="the database of the jobs (PGJOBS['QUEUE_DATABASES']); default: the one "
            "holding each id",
        )
        actions.add_parser("schedules", help="Every schedule: next run, last run, last job.")

    def handle(self, *args: Any, **options: Any) -> None:
        action = options["action"]
        try:
            if action == "status":
                self._status()
            elif action == "pause":
                self._pause(options["queues"])
            elif action == "resume":
                self._resume(options["queues"])
            elif action == "limit":
                self._set_limit(options["queue"], _limit(options["max_running"]))
            elif action == "running":
                self._running(options["queues"] or None, options["limit"])
            elif action == "cancel":
                self._cancel(options["ids"], options["database"])
            elif action == "rate":
                self._set_rate(options["queue"], options["rate"])
            else:
                self._schedules()
        except (InvalidJobOption, ValueError) as error:
            raise CommandError(str(error)) from None
        except DatabaseError as error:
            raise CommandError(
                f"The jobs database '{pgjobs_settings.DATABASE}' refused: "
                f"{str(error).strip().splitlines()[0]}. "
                "Is it running, and migrated (python manage.py migrate django_pgjobs)?"
            ) from None

    def _status(self) -> None:
        databases = pgjobs_settings.databases()
        for database in databases:
            if len(databases) > 1:  # PGJOBS["QUEUE_DATABASES"]: each database's own
                self.stdout.write(self.style.MIGRATE_HEADING(f"Database {database}"))
            self._status_of(database)
            if database != databases[-1]:
                self.stdout.write("")

    def _status_of(self, database: str) -> None:
        statuses = QueueControl.objects.status(using=database)
        self._queues(statuses)
        workers = Worker.objects.status(using=database)
        self.stdout.write("")
        self._workers(workers)
        unserved = unserved_queues(statuses, workers)
        if unserved:
            self.stdout.write("")
            self.stdout.write(
                self.style.WARNING(
                    f"Warning: no live worker serves {', '.join(unserved)}, which "
                    f"{'has' if len(unserved) == 1 else 'have'} runnable jobs."
                )
            )

    def _workers(self, workers: Sequence[WorkerStatus]) -> None:
        if not workers:
            self.stdout.write("No workers registered: start one with python manage.py runjobs.")
            return
        header = ("worker", "state", "queues", "running", "done", "failed", "last seen", "version")
        rows = [
            (
                worker.id,
                "live" if worker.live else "stopped" if worker.stopped_at else "gone",
                ",".join(worker.queues),
                f"{worker.running} of {worker.concurrency}",
                f"{worker.succeeded:,}",
                f"{worker.failed:,}",
                f"{labels.age(worker.seen_s_ago)} ago",
                worker.version,
            )
            for worker in workers
        ]
        self._table(header, rows)

    def _queues(self, statuses: Sequence[QueueStatus]) -> None:
        rows = [
            (
                status.queue,
                labels.count(status.runnable),
                labels.count(status.scheduled),
                labels.running_of_limit(status.running, status.max_running),
                status.rate or "",
                "yes" if status.paused else "",
                labels.count(status.dead),
                labels.age(status.oldest_runnable_s),
            )
            for status in statuses
        ]
        header = (
            "queue",
            "runnable",
            "scheduled",
            "running",
            "rate",
            "paused",
            "dead",
            "oldest runnable",
        )
        if not rows:
            self.stdout.write("No queues yet: no job, no dead letter, no control.")
            return
        self._table(header, rows)

    def _running(self, queues: list[str] | None, limit: int) -> None:
        if limit < 1:
            raise CommandError(f"--limit must be 1 or more, not {limit}.")
        databases = pgjobs_settings.databases()
        wanted: dict[str, list[str] | None] = (
            dict.fromkeys(databases) if queues is None else dict(_by_database(queues))
        )
        found = [
            (database, job)
            for database, names in wanted.items()
            for job in Job.objects.running(names, limit=limit, using=database)
        ]
        found.sort(key=lambda pair: -pair[1].running_s)
        found = found[:limit]
        if not found:
            where = f" in {', '.join(queues)}" if queues else ""
            self.stdout.write(f"No job is running{where}{_databases_read(wanted)}.")
            return
        header = ("id", "queue", "kind", "worker", "attempt", "running for", "progress")
        several = len(databases) > 1
        rows = [
            (
                str(job.id),
                job.queue,
                job.kind,
                job.worker_id or "-",
                f"{job.attempt}/{job.max_attempts}",
                labels.age(job.running_s),
                labels.progress(job.progress, job.read_at),
                *((database,) if several else ()),
            )
            for database, job in found
        ]
        self._table((*header, "database") if several else header, rows)
        if len(found) == limit:
            self.stdout.write(f"(the first {limit}; --limit N shows more)")

    def _cancel(self, ids: list[int], database: str | None) -> None:
        wanted = sorted(set(ids))
        if database is None:
            database = self._database_of_jobs(wanted)
        elif database not in pgjobs_settings.databases():
            raise CommandError(
                f"{database!r} holds no jobs: --database is one of "
                f"{', '.join(pgjobs_settings.databases())}."
            )
        cancelled = Job.objects.cancel_many(wanted, using=database)
        self.stdout.write(
            f"Cancelled {cancelled} of {len(wanted)} job(s) in database {database}: "
            "dead-lettered as 'cancelled' (requeue them from the dead letters); running "
            "handlers are told to stop."
        )
        if cancelled < len(wanted):
            self.stdout.write("The others were not pending or running (done, dead or no such id).")

    def _database_of_jobs(self, ids: list[int]) -> str:
        """The one database that holds the jobs `ids` name (live or dead); a CommandError
        when they name jobs in several, with what to type instead."""
        databases = pgjobs_settings.databases()
        if len(databases) == 1:
            return databases[0]
        holders = {
            database: set(Job.objects.get_jobs(ids, using=database)) for database in databases
        }
        where = {job_id: [db for db, held in holders.items() if job_id in held] for job_id in ids}
        ambiguous = {job_id: found for job_id, found in where.items() if len(found) > 1}
        if ambiguous:
            job_id, found = next(iter(ambiguous.items()))
            raise CommandError(
                f"Job {job_id} names a job in each of the databases {', '.join(found)} "
                "(each has ids of its own): say which, e.g. "
                f"jobsctl cancel --database {found[-1]} {job_id}. Nothing was cancelled."
            )
        used = sorted({found[0] for found in where.values() if found})
        if len(used) > 1:
            raise CommandError(
                f"These ids name jobs in several databases ({', '.join(used)}): cancel each "
                "database's with jobsctl cancel --database ALIAS ID... Nothing was cancelled."
            )
        return used[0] if used else pgjobs_settings.DATABASE

    def _pause(self, queues: list[str]) -> None:
        paused = [
            name
            for database, names in _by_database(queues).items()
            for name in QueueControl.objects.pause(names, using=database)
        ]
        self.stdout.write(
            f"Paused {', '.join(paused)}: no worker claims their jobs until resumed "
            "(enqueues still land)."
        )

    def _resume(self, queues: list[str]) -> None:
        resumed = [
            name
            for database, names in _by_database(queues).items()
            for name in QueueControl.objects.resume(names, using=database)
        ]
        if resumed:
            self.stdout.write(f"Resumed {', '.join(resumed)}; workers woken.")
        else:
            self.stdout.write(f"Not paused: {', '.join(queues)}. Nothing to do.")

    def _set_limit(self, queue: str, max_running: int | None) -> None:
        changed = QueueControl.objects.set_limit(
            queue, max_running, using=pgjobs_settings.database_of(queue)
        )
        what = "no limit" if max_running is None else f"at most {max_running} running"
        self.stdout.write(f"{queue}: {what}" + ("." if changed else " (already so)."))

    def _set_rate(self, queue: str, text: str) -> None:
        rate = None if text.lower() in ("none", "off") else text
        changed = QueueControl.objects.set_rate(
            queue, rate, using=pgjobs_settings.database_of(queue)
        )
        what = "no rate" if rate is None else f"at most {rate} claims"
        self.stdout.write(f"{queue}: {what}" + ("." if changed else " (already so)."))

    def _schedules(self) -> None:
        schedules = list(Schedule.objects.order_by("name"))
        if not schedules:
            self.stdout.write(
                "No schedules: declare them with @job(schedule=...) or PGJOBS['SCHEDULES'] "
                "(workers sync them as they start)."
            )
            return
        header = ("schedule", "kind", "cron", "timezone", "state", "next run", "last run", "runs")
        rows = [
            (
                schedule.name,
                schedule.kind,
                schedule.cron,
                schedule.timezone,
                "enabled"
                if schedule.enabled
                else ("retired" if not schedule.declared else "disabled"),
                _when(schedule.next_run_at) if schedule.enabled else "-",
                _when(schedule.last_run_at),
                str(schedule.runs),
            )
            for schedule in schedules
        ]
        self._table(header, rows)

    def _table(self, header: Sequence[str], rows: Sequence[Sequence[str]]) -> None:
        widths = [max(len(row[i]) for row in [header, *rows]) for i in range(len(header))]
        for index, row in enumerate([header, *rows]):
            self.stdout.write(
                "  ".join(cell.ljust(width) for cell, width in zip(row, widths, strict=True))
            )
            if index == 0:
                self.stdout.write("  ".join("-" * width for width in widths))


def _when(moment: datetime | None) -> str:
    return "-" if moment is None else f"{moment:%Y-%m-%d %H:%M:%S %Z}"


def _databases_read(wanted: dict[str, Any]) -> str:
    """ " (database jobs_a)", or nothing when the jobs live in one database only."""
    if len(pgjobs_settings.databases()) == 1:
        return ""
    return f" (read {', '.join(f'database {name}' for name in wanted)})"


def _by_database(queues: Sequence[str]) -> dict[str, list[str]]:
    """`queues` by the database their jobs live in (PGJOBS["QUEUE_DATABASES"])."""
    grouped: dict[str, list[str]] = {}
    for queue in queues:
        grouped.setdefault(pgjobs_settings.database_of(queue), []).append(queue)
    return grouped
