"""`manage.py runjobs`: run a worker until SIGTERM/SIGINT (or until drained with --burst)."""

from __future__ import annotations

import argparse
import importlib
import logging
import sys
import threading
import time
from typing import Any, TextIO

from django.core.management.base import BaseCommand, CommandError, CommandParser
from django.db import DatabaseError, OperationalError, ProgrammingError, connections

from django_pgjobs.conf import pgjobs_settings
from django_pgjobs.exceptions import InvalidJobOption
from django_pgjobs.logs import JsonFormatter
from django_pgjobs.models import Job, QueueControl
from django_pgjobs.worker import Worker, WorkerStats, default_queues, queues_of_database

#: Tries of the database check at start, and the pause between two.
START_CHECKS = 3
START_CHECK_PAUSE_S = 0.5
#: How long the check at start waits for a server that answers but cannot take the
#: worker yet: none of the hosts takes writes (a failover under way: the old primary is
#: read-only, the new one not promoted yet), or the server is starting, in recovery or
#: shutting down (a restart).
START_TRANSIENT_WAIT_S = 60.0
#: What PostgreSQL answers such a server's statements with, in any language: a
#: read-only transaction (25006), and "the database system is starting up / in recovery
#: / shutting down / not yet accepting connections" (57P03, cannot_connect_now).
_TRANSIENT_SQLSTATES = frozenset({"25006", "57P03"})
#: What libpq says of such a server on its own (no SQLSTATE), and the server's words
#: when a connection's refusal comes without one: English messages.
_TRANSIENT = (
    "read-only",
    "hot standby",
    "starting up",
    "in recovery",
    "shutting down",
    "not yet accepting connections",
)


def transient(error: BaseException) -> bool:
    """Whether `error` (a database error, or Django's wrap of one) says the server cannot
    take the worker yet: by its SQLSTATE, whatever the server's lc_messages; else by
    libpq's English words."""
    cause = error.__cause__ if error.__cause__ is not None else error
    if getattr(cause, "sqlstate", None) in _TRANSIENT_SQLSTATES:
        return True
    return any(words in str(error) for words in _TRANSIENT)


def positive_int(text: str) -> int:
    return _whole(text, 1)


def whole_or_zero(text: str) -> int:
    return _whole(text, 0)


def _whole(text: str, minimum: int) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None
    if value < minimum:
        raise argparse.ArgumentTypeError(f"must be at least {minimum}, not {value}")
    return value


def positive_seconds(text: str) -> float:
    value = _seconds(text)
    if value <= 0:
        raise argparse.ArgumentTypeError(f"must be more than 0 seconds, not {value:g}")
    return value


def seconds_or_zero(text: str) -> float:
    value = _seconds(text)
    if value < 0:
        raise argparse.ArgumentTypeError(f"must not be negative, not {value:g}")
    return value


def _seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number of seconds") from None
    if value != value or value in (float("inf"), float("-inf")):
        raise argparse.ArgumentTypeError(f"{text!r} is not a finite number of seconds")
    return value


class StatusLine:
    """Show the worker's counters: a line redrawn in place on a terminal, otherwise a log
    line every `log_every` seconds. On a terminal, a log line first clears it (see
    keep_messages_off_the_status): every message stands on its own line."""

    def __init__(self, stream: TextIO, *, log_every: float = 60.0) -> None:
        self.stream = stream
        self.tty = stream.isatty()
        self.log_every = log_every
        #: Held while the line is drawn or cleared (the loop draws, any thread logs).
        self.lock = threading.RLock()
        #: Whether the line is on the terminal now (a log message clears it first).
        self.shown = False
        self._last_time = time.monotonic()
        self._last_finished = 0
        self._last_log = time.monotonic()
        self._rate = 0.0

    def __call__(self, stats: WorkerStats) -> None:
        now = time.monotonic()
        elapsed = now - self._last_time
        if elapsed > 0:
            current = (stats.finished - self._last_finished) / elapsed
            # Smooth over a few seconds so the figure does not jump with each batch.
            self._rate = current if self._rate == 0 else 0.7 * self._rate + 0.3 * current
        self._last_time, self._last_finished = now, stats.finished
        text = (
            f"processed {stats.succeeded}  failed {stats.dead}  retried {stats.retried}  "
            f"in flight {stats.in_flight}  {self._rate:,.1f} jobs/s"
        )
        if self.tty:
            with self.lock:
                self.stream.write(f"\r\x1b[K{text}")
                self.stream.flush()
                self.shown = True
        elif now - self._last_log >= self.log_every:
            self._last_log = now
            logging.getLogger("django_pgjobs.worker").info("status %s", text)

    def clear(self) -> None:
        """Take the line off the terminal (the next status redraws it)."""
        with self.lock:
            if self.shown:
                self.stream.write("\r\x1b[K")
                self.shown = False

    def close(self) -> None:
        if self.tty:
            with self.lock:
                if self.shown:
                    self.stream.write("\n")
                    self.shown = False
                self.stream.flush()


def keep_messages_off_the_status(status: StatusLine) -> None:
    """Make every log handler that writes to the status line's terminal take the line
    off first, in one step under the status's lock (the loop redraws it between two
    messages, never in the middle of one), whoever configured the handler: no message
    is glued onto the status."""
    loggers = [logging.getLogger(), *logging.Logger.manager.loggerDict.values()]
    wrapped: set[int] = set()
    for logger in loggers:
        for handler in getattr(logger, "handlers", ()):
            if getattr(handler, "stream", None) is not status.stream or id(handler) in wrapped:
                continue
            wrapped.add(id(handler))
            emit = handler.emit

            def emit_clear(record: logging.LogRecord, emit: Any = emit) -> None:
                with status.lock:
                    status.clear()
                    emit(record)

            handler.emit = emit_clear


class Command(BaseCommand):
    help = (
        "Run a worker: claim jobs of the given queues and run them on a pool of threads "
        "until SIGTERM or SIGINT (a second signal exits at once)."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument(
            "--queue",
            action="append",
            dest="queues",
            metavar="QUEUE",
            help="A queue to work (repeatable). Default: every configured queue.",
        )
        parser.add_argument(
            "--concurrency",
            type=positive_int,
            help=f"Handler threads (default PGJOBS['CONCURRENCY'], {pgjobs_settings.CONCURRENCY}).",
        )
        parser.add_argument(
            "--async-concurrency",
            type=positive_int,
            help="Async handlers running at once on the worker's event loop (default "
            f"PGJOBS['ASYNC_CONCURRENCY'], {pgjobs_settings.ASYNC_CONCURRENCY}).",
        )
        parser.add_argument(
            "--prefetch",
            type=whole_or_zero,
            help="Most jobs claimed ahead of free threads while jobs are short, 0 for none "
            f"(default PGJOBS['PREFETCH'], {pgjobs_settings.PREFETCH}).",
        )
        parser.add_argument(
            "--burst", action="store_true", help="Run what is runnable now, then exit 0."
        )
        parser.add_argument(
            "--max-jobs", type=positive_int, help="Exit after this many jobs have run."
        )
        parser.add_argument("--worker-id", help="Stamped on claims (default host:pid:random).")
        parser.add_argument(
            "--database",
            help="The database alias whose jobs to run (default PGJOBS['DATABASE']); with "
            "PGJOBS['QUEUE_DATABASES'], one worker per database, each serving its queues.",
        )
        parser.add_argument(
            "--poll-interval",
            type=positive_seconds,
            help="Seconds between polls without a notification (PGJOBS['POLL_INTERVAL']).",
        )
        parser.add_argument(
            "--shutdown-grace",
            type=seconds_or_zero,
            help="Seconds running jobs get after SIGTERM before their claims are handed back.",
        )
        parser.add_argument(
            "--sweep-interval",
            type=seconds_or_zero,
            help="Seconds between sweeps from this worker, 0 for none (PGJOBS['SWEEP_INTERVAL']).",
        )
        parser.add_argument(
            "--import",
            action="append",
            dest="imports",
            default=[],
            metavar="MODULE",
            help="Import this module first, so that its @job kinds are known (repeatable). "
            "Every installed app's jobs.py is imported anyway.",
        )
        parser.add_argument(
            "--metrics-port",
            type=positive_int,
            help="Serve Prometheus metrics on this port (needs django-pgjobs[prometheus]).",
        )
        parser.add_argument(
            "--metrics-addr",
            help="Address the metrics server listens on (default PGJOBS['METRICS_ADDR'], "
            f"{pgjobs_settings.METRICS_ADDR}). Another address needs PGJOBS['METRICS_TOKEN'] "
            "or PGJOBS['METRICS_PUBLIC'].",
        )
        parser.add_argument(
            "--no-schedules",
            action="store_true",
            help="Run no periodic schedule from this worker (PGJOBS['SCHEDULER']).",
        )
        parser.add_argument(
            "--no-status",
            action="store_true",
            help="No live status line (one is shown on a terminal).",
        )
        parser.add_argument(
            "--log-format",
            choices=("text", "json"),
            default="text",
            help="text: lines for people (the default); json: one JSON object a line for "
            "log shippers (time, level, worker, job id, kind, queue, attempt, outcome, "
            "duration, trace id), which also switches the status line off.",
        )

    def handle(self, *args: Any, **options: Any) -> None:
        json_logs = options["log_format"] == "json"
        console = _configure_logging(options["verbosity"], json_logs=json_logs)
        for module in options["imports"]:
            _import(module)
        database = self._database(options["database"], options["queues"])
        queues = options["queues"] or queues_of_database(database)
        if not queues:
            raise CommandError(
                f"No queue lives in database {database!r}: PGJOBS['QUEUE_DATABASES'] sends "
                "none there. Name them with --queue, or map them in QUEUE_DATABASES."
            )
        self._check_database(queues, database)
        if options["queues"]:
            _warn_of_unnamed(queues)
        if options["metrics_port"]:
            addr = options["metrics_addr"] or pgjobs_settings.METRICS_ADDR
            self._serve_metrics(options["metrics_port"], addr)
        status = None if options["no_status"] or json_logs else StatusLine(sys.stderr)
        if status is not None and status.tty:
            keep_messages_off_the_status(status)
        try:
            worker = Worker(
                queues=queues,
                concurrency=options["concurrency"],
                async_concurrency=options["async_concurrency"],
                prefetch=options["prefetch"],
                worker_id=options["worker_id"],
                burst=options["burst"],
                max_jobs=options["max_jobs"],
                poll_interval=options["poll_interval"],
                shutdown_grace=options["shutdown_grace"],
                sweep_interval=options["sweep_interval"],
                schedules=False if options["no_schedules"] else None,
                on_status=status,
                using=database,
            )
        except (InvalidJobOption, ValueError) as error:
            raise CommandError(str(error)) from None
        if console is not None and isinstance(console.formatter, JsonFormatter):
            console.formatter.worker_id = worker.worker_id
        try:
            code = worker.run()
        finally:
            if status is not None:
                status.close()
        if code:
            sys.exit(code)

    def _database(self, given: str | None, queues: list[str] | None) -> str:
        """The database alias to serve: `given`, else the jobs database; refused when it
        holds no jobs, or when a --queue lives in another one."""
        databases = pgjobs_settings.databases()
        database = given or pgjobs_settings.DATABASE
        if database not in databases:
            raise CommandError(
                f"--database {database}: no jobs live there; the jobs databases are "
                f"{', '.join(databases)} (PGJOBS['DATABASE'] and PGJOBS['QUEUE_DATABASES'])."
            )
        for queue in queues or []:
            home = pgjobs_settings.database_of(queue)
            if home != database:
                raise CommandError(
                    f"--queue {queue}: its jobs live in database {home!r} "
                    f"(PGJOBS['QUEUE_DATABASES']); run: manage.py runjobs --database {home} "
                    f"--queue {queue}"
                )
        return database

    def _check_database(self, queues: list[str], database: str) -> None:
        """Fail fast on what the worker cannot recover from: no database, no tables.

        A connection cut while the check runs (a restart, pg_terminate_backend) is tried
        again, START_CHECKS times in all, as the worker's loop would; a server that
        answers but cannot take the worker yet (a failover or a restart under way) is
        waited for, up to START_TRANSIENT_WAIT_S.
        """
        waited_since = time.monotonic()
        attempt = 0
        while True:
            attempt += 1
            try:
                Job.objects.next_due_in(queues, using=database)
                return
            except InvalidJobOption as error:
                raise CommandError(str(error)) from None
            except ProgrammingError as error:
                raise CommandError(
                    f"The job tables are missing ({str(error).splitlines()[0]}). "
                    "Run: python manage.py migrate django_pgjobs"
                ) from None
            except (OperationalError, DatabaseError) as error:
                connections[database].close()
                if transient(error) and time.monotonic() - waited_since < START_TRANSIENT_WAIT_S:
                    time.sleep(START_CHECK_PAUSE_S)
                    continue
                if attempt >= START_CHECKS:
                    raise CommandError(
                        f"Cannot reach the jobs database '{database}': "
                        f"{str(error).strip().splitlines()[0]}. Check DATABASES and that "
                        "PostgreSQL runs."
                    ) from None
                time.sleep(START_CHECK_PAUSE_S)

    def _serve_metrics(self, port: int, addr: str) -> None:
        from django.core.exceptions import ImproperlyConfigured

        try:
            from django_pgjobs import metrics

            metrics.serve(port, addr)
        except ImproperlyConfigured as error:
            raise CommandError(str(error)) from None
        except OSError as error:
            raise CommandError(
                f"--metrics-port {port}: cannot listen on {addr}:{port} ({error}). "
                "Pick a free port."
            ) from None
        logging.getLogger("django_pgjobs.worker").info(
            "metrics served at http://%s:%s/metrics", addr, port
        )


def _warn_of_unnamed(queues: list[str]) -> None:
    """Warn of a --queue that nothing names: no registered job or task, no setting, no
    job, dead letter or queue row. Such a worker would wait for nothing (a typo?)."""
    named = set(default_queues())
    try:
        named.update(status.queue for status in QueueControl.objects.status())
    except DatabaseError:
        return  # the start check reports an unreachable database
    for queue in queues:
        if queue not in named:
            logging.getLogger("django_pgjobs.worker").warning(
                "--queue %s: no registered job or task, setting, job or queue row names this "
                "queue; this worker will wait for jobs nothing sends there (check the "
                "spelling: known queues are %s)",
                queue,
                ", ".join(sorted(named)) or "none",
            )


def _import(module: str) -> None:
    try:
        importlib.import_module(module)
    except ImportError as error:
        raise CommandError(
            f"--import {module}: cannot import it ({error}). Is it on the Python path?"
        ) from None


def _configure_logging(verbosity: int, *, json_logs: bool = False) -> logging.Handler | None:
    """Give django_pgjobs' loggers a console handler unless the project configured one;
    return it (None: the project's handlers write the lines). With `json_logs`, the
    handler writes JSON lines (django_pgjobs.logs) whatever the project configured, and
    the package's lines go to it alone.

    Verbosity 0: errors. 1: worker lifecycle, retries and dead letters. 2: every job's
    finish. 3: every job's start too.
    """
    package = logging.getLogger("django_pgjobs")
    if not json_logs and (package.handlers or logging.getLogger().handlers):
        return None
    handler = logging.StreamHandler(sys.stderr)
    if json_logs:
        handler.setFormatter(JsonFormatter())
        for existing in list(package.handlers):
            package.removeHandler(existing)
        package.propagate = False
    else:
        handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s %(message)s"))
    package.addHandler(handler)
    package.setLevel(logging.DEBUG)
    worker_level, jobs_level = {
        0: (logging.ERROR, logging.ERROR),
        1: (logging.INFO, logging.WARNING),
        2: (logging.INFO, logging.INFO),
    }.get(verbosity, (logging.DEBUG, logging.DEBUG))
    logging.getLogger("django_pgjobs.worker").setLevel(worker_level)
    logging.getLogger("django_pgjobs.maintenance").setLevel(worker_level)
    logging.getLogger("django_pgjobs.jobs").setLevel(jobs_level)
    return handler
