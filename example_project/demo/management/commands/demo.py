"""`python manage.py demo`: a database, an admin user, a realistic mix of jobs, workers
until the work is done, and a summary."""

from __future__ import annotations

import logging
import os
import secrets
import sys
import threading
import time
from typing import Any

from django.contrib.auth import get_user_model
from django.core.management import call_command
from django.core.management.base import BaseCommand, CommandParser

from django_pgjobs.models import DeadJob, Job
from django_pgjobs.worker import Worker, default_queues
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
        self.enqueue_mix()
        self.step("Running workers until the work is done")
        worker, took = self.work(options["concurrency"], options["timeout"])
        self.summarise(worker, took)
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
        live = Job.objects.count()
        self.stdout.write(f"{live} jobs waiting across {len(default_queues())} queues")

    def work(self, concurrency: int, timeout: float) -> tuple[Worker, float]:
        # One progress line instead of a log line per job; the summary lists the outcome.
        logging.getLogger("django_pgjobs").setLevel(logging.ERROR)
        logging.getLogger("django_pgjobs.jobs").setLevel(logging.CRITICAL)
        worker = Worker(concurrency=concurrency, poll_interval=0.5, sweep_interval=0)
        thread = threading.Thread(target=worker.run, daemon=True)
        started = time.monotonic()
        thread.start()
        try:
            while time.monotonic() - started < timeout:
                left = Job.objects.filter(state__in=("pending", "running")).count()
                self.progress(worker, left)
                if left == 0:
                    break
                time.sleep(0.2)
            else:
                self.stderr.write(f"\nGave up after {timeout:g} s with work left.")
        finally:
            worker.stop()
            thread.join(30)
            sys.stderr.write("\n")
        return worker, time.monotonic() - started

    def progress(self, worker: Worker, left: int) -> None:
        """A bar redrawn in place on a terminal; a line every 2 s otherwise."""
        stats = worker.stats
        done = stats.succeeded + stats.dead
        total = max(done + left, 1)
        width = 30
        filled = int(width * done / total)
        line = (
            f"[{'#' * filled}{'.' * (width - filled)}] {done}/{total} finished, "
            f"{stats.retried} retried, {stats.dead} dead"
        )
        if sys.stderr.isatty():
            sys.stderr.write(f"\r{line} ")
        elif time.monotonic() - self._last_line >= 2 or left == 0:
            self._last_line = time.monotonic()
            sys.stderr.write(line + "\n")
        sys.stderr.flush()

    _last_line = 0.0

    def summarise(self, worker: Worker, took: float) -> None:
        stats = worker.stats
        rows = [
            ("done", stats.succeeded),
            ("retried (attempts that failed and ran again)", stats.retried),
            ("dead letters", DeadJob.objects.count()),
            ("time", f"{took:.1f} s"),
            ("jobs/s", f"{(stats.succeeded + stats.dead) / took:.1f}" if took else "-"),
        ]
        self.step("Summary")
        width = max(len(name) for name, _ in rows)
        for name, value in rows:
            self.stdout.write(f"  {name.ljust(width)}  {value}")
        for letter in DeadJob.objects.order_by("id"):
            self.stdout.write(f"  dead: #{letter.id} {letter.kind}: {letter.reason}")
        for collection in Collection.objects.exclude(indexed_at=None).order_by("name"):
            self.stdout.write(
                f"  {collection.name}'s index: built once, after its batch of "
                f"{collection.indexed_documents + collection.index_failures} summaries "
                f"({collection.index_failures} failed)"
            )
