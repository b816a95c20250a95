"""`python manage.py demo`: a database, an admin user, a realistic mix of jobs, workers
until the work is done, and a summary.

Every number it prints counts one thing, read from the job tables: the jobs this run
wrote (rows of `pgjobs_job` and `pgjobs_dead` newer than the newest before it: ids only
grow), which end done or as dead letters, so that enqueued = done + dead letters + left to
run, from the first line to the summary. Failed attempts that ran again are counted
apart, as retries: they are runs of a job, not jobs.
"""

from __future__ import annotations

import logging
import os
import secrets
import sys
import threading
import time
from dataclasses import dataclass
from typing import Any
from zoneinfo import ZoneInfo

from django.contrib.auth import get_user_model
from django.core.management import call_command
from django.core.management.base import BaseCommand, CommandParser
from django.db.models import Count, Max, Q, QuerySet
from django.db.models.functions import Now

from django_pgjobs.models import DeadJob, Job, Schedule
from django_pgjobs.states import JobState
from django_pgjobs.worker import Worker
from example_project.agent_sessions.services import close_session, open_session
from example_project.demo.jobs import (
    charge_card,
    deliver_webhook,
    rebuild_search_index,
    send_digest,
)
from example_project.ingestion.models import Collection
from example_project.ingestion.services import add_document, reindex_collection
from example_project.purge.services import log_events, schedule_purge
from example_project.replay.services import write


def _where_the_database_lives() -> str:
    """DATABASE_URL's server, or the folder of the example's own embedded PostgreSQL."""
    from django.conf import settings

    from django_pgjobs.testing.localdb import cluster_directory

    if os.environ.get("DATABASE_URL"):
        return "DATABASE_URL"
    return f"the embedded PostgreSQL in {cluster_directory(settings.BASE_DIR / '.pgdata')}"


def newest_job_id() -> int:
    """The newest id of either job table: every job written after has a greater one."""
    live = Job.objects.aggregate(newest=Max("id"))["newest"] or 0
    dead = DeadJob.objects.aggregate(newest=Max("id"))["newest"] or 0
    return max(live, dead)


@dataclass(frozen=True, slots=True)
class Tally:
    """Where the jobs of this run stand: enqueued = done + dead + left."""

    enqueued: int
    done: int
    dead: int
    left: int

    @property
    def ended(self) -> int:
        return self.done + self.dead


class RunJobs:
    """The jobs this run wrote, found by id in the job tables and remembered once seen.
    A job seen that is in neither table any more was acked (its row deleted, as without
    result retention): done. The demo cancels none, which would delete rows too."""

    def __init__(self, after: int) -> None:
        self.after = after
        self.seen: set[int] = set()

    def live(self) -> QuerySet[Job]:
        return Job.objects.filter(id__gt=self.after)

    def tally(self) -> Tally:
        states = dict(self.live().values_list("id", "state"))
        dead = set(DeadJob.objects.filter(id__gt=self.after).values_list("id", flat=True))
        self.seen |= states.keys() | dead
        left = sum(1 for state in states.values() if state != JobState.DONE)
        return Tally(len(self.seen), len(self.seen) - left - len(dead), len(dead), left)


class Command(BaseCommand):
    help = "Run the example end to end: migrate, enqueue a mix of jobs, work them, summarise."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--timeout", type=float, default=120.0, help="Give up after this.")
        parser.add_argument("--concurrency", type=int, default=8)

    def handle(self, *args: Any, **options: Any) -> None:
        self.step(f"Migrating the database ({_where_the_database_lives()})")
        call_command("migrate", verbosity=0)
        credentials = self.ensure_admin()
        self.step("Enqueueing a mix of jobs")
        jobs = RunJobs(after=newest_job_id())
        self.enqueue_mix()
        self.describe_enqueued(jobs)
        self.step("Running workers until the work is done")
        worker, took = self.work(jobs, options["concurrency"], options["timeout"])
        self.summarise(jobs, worker, took)
        self.stdout.write(
            "\nOpen the admin:  DJANGO_DEBUG=1 python manage.py runserver  then  "
            "http://127.0.0.1:8000/admin/"
        )
        if credentials:
            self.stdout.write(f"  user: {credentials[0]}  password: {credentials[1]}")
        self.stdout.write("  the example's own page: http://127.0.0.1:8000/")

    def step(self, text: str) -> None:
        self.stdout.write(self.style.MIGRATE_HEADING(f"== {text}"))

    def ensure_admin(self) -> tuple[str, str] | None:
        user_model = get_user_model()
        if user_model.objects.filter(is_superuser=True).exists():
            self.stdout.write("An admin user exists already; its password is unchanged.")
            return None
        password = secrets.token_urlsafe(9)
        user_model.objects.create_superuser("admin", "admin@example.invalid", password)
        self.stdout.write(f"Created the admin user 'admin' with password {password}")
        return ("admin", password)

    def enqueue_mix(self) -> None:
        sessions = [open_session(f"session {n}") for n in range(1, 6)]
        for session in sessions[:2]:
            close_session(session.id)
        for collection in ("handbook", "runbooks", "faq"):
            for n in range(4):
                add_document(collection, f"{collection} {n}", f"page {n} of the {collection} " * 20)
        reindex_collection("runbooks")  # a batch: one job per document, then one index build
        for n in range(30):  # bursts of writes: one replay per (session, subsystem)
            write(1 + n % 2, ("memory", "search")[n // 15], f"entry {n}", debounce_s=0.5)
        log_events(1200, age_days=40)
        schedule_purge(batch=300)
        for n in range(5):
            deliver_webhook.enqueue(url=f"https://hooks.example.invalid/{n}", fail_times=n % 3)
        for amount in (10, -5, 20, -1):
            charge_card.enqueue(amount=amount)
        for shard in (1, 2):
            rebuild_search_index.enqueue(shard=shard)
        for user in ("ada", "grace", "linus"):
            send_digest.using(delay=2).enqueue(user=user)

    def describe_enqueued(self, jobs: RunJobs) -> None:
        """Say how many jobs the mix wrote, in how many queues, and where they stand."""
        jobs.tally()  # no worker runs yet: every job of the run is seen
        pending = Q(state=JobState.PENDING)
        # One statement, so one now(): a job's delay that ends meanwhile is counted once.
        counts = jobs.live().aggregate(
            enqueued=Count("id"),
            queues=Count("queue", distinct=True),
            runnable=Count("id", filter=pending & Q(run_after__lte=Now())),
            scheduled=Count("id", filter=pending & Q(run_after__gt=Now())),
            waiting=Count("id", filter=Q(state=JobState.WAITING)),
        )
        self.stdout.write(
            "{enqueued} jobs enqueued in {queues} queues: {runnable} runnable now, "
            "{scheduled} scheduled a few seconds ahead, {waiting} waiting for other "
            "jobs".format(**counts)
        )

    def work(self, jobs: RunJobs, concurrency: int, timeout: float) -> tuple[Worker, float]:
        # One progress line instead of a log line per job; the summary lists the outcome.
        logging.getLogger("django_pgjobs").setLevel(logging.ERROR)
        logging.getLogger("django_pgjobs.jobs").setLevel(logging.CRITICAL)
        worker = Worker(concurrency=concurrency, poll_interval=0.5, sweep_interval=0)
        thread = threading.Thread(target=worker.run, daemon=True)
        started = time.monotonic()
        thread.start()
        try:
            while time.monotonic() - started < timeout:
                tally = jobs.tally()
                self.progress(worker, tally)
                if tally.left == 0:
                    break
                time.sleep(0.2)
            else:
                self.stderr.write(f"\nGave up after {timeout:g} s with work left.")
        finally:
            worker.stop()
            thread.join(30)
            sys.stderr.write("\n")
        return worker, time.monotonic() - started

    def progress(self, worker: Worker, tally: Tally) -> None:
        """A bar redrawn in place on a terminal; a line every 2 s otherwise."""
        width = 30
        filled = width * tally.ended // max(tally.enqueued, 1)
        line = (
            f"[{'#' * filled}{'.' * (width - filled)}] {tally.ended}/{tally.enqueued} jobs "
            f"ended: {tally.done} done, {tally.dead} dead letters; "
            f"{worker.stats.retried} retries"
        )
        if sys.stderr.isatty():
            sys.stderr.write(f"\r{line} ")
        elif time.monotonic() - self._last_line >= 2 or tally.left == 0:
            self._last_line = time.monotonic()
            sys.stderr.write(line + "\n")
        sys.stderr.flush()

    _last_line = 0.0

    def summarise(self, jobs: RunJobs, worker: Worker, took: float) -> None:
        tally = jobs.tally()
        schedules = list(Schedule.objects.filter(enabled=True).order_by("name"))
        rows = [
            ("jobs enqueued", tally.enqueued, ""),
            ("done", tally.done, ""),
            ("dead letters", tally.dead, "(listed below)" if tally.dead else ""),
            ("left to run", tally.left, ""),
            ("retries", worker.stats.retried, "(failed attempts that ran again)"),
            ("schedules", len(schedules), "(listed below)" if schedules else ""),
            ("time", f"{took:.1f} s", f"({tally.ended / max(took, 0.1):.1f} jobs ended a second)"),
        ]
        self.step("Summary")
        width = max(len(name) for name, _, _ in rows)
        for name, value, note in rows:
            self.stdout.write(f"  {name.ljust(width)}  {value} {note}".rstrip())
        for letter in DeadJob.objects.filter(id__gt=jobs.after).order_by("id"):
            self.stdout.write(f"  dead: #{letter.id} {letter.kind}: {letter.reason}")
        for schedule in schedules:
            next_run = schedule.next_run_at.astimezone(ZoneInfo(schedule.timezone))
            self.stdout.write(
                f"  schedule: {schedule.name} enqueues {schedule.kind} next at "
                f"{next_run:%Y-%m-%d %H:%M} {schedule.timezone}"
            )
        for collection in Collection.objects.exclude(indexed_at=None).order_by("name"):
            self.stdout.write(
                f"  {collection.name}'s index: built once, after its batch of "
                f"{collection.indexed_documents + collection.index_failures} summaries "
                f"({collection.index_failures} failed)"
            )
