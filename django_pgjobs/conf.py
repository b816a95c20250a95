"""Settings: one `PGJOBS` dict in the Django settings, read at access time.

Every default lives on `Settings` below; its `#:` comment is its description, and the
settings reference (docs/reference/settings.md) is generated from both. Durations accept
seconds (int or float) or a `datetime.timedelta`. Per-queue overrides go under
`PGJOBS["QUEUES"][<queue name>]` and take the same keys as the queue options here.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

from django.conf import settings as django_settings
from django.core.exceptions import ImproperlyConfigured
from django.core.signals import setting_changed

DAY = 86_400
#: The django.tasks backend of django_pgjobs, as TASKS names it.
TASKS_BACKEND = "django_pgjobs.backend.PgJobsBackend"
#: The largest MAX_PAYLOAD_BYTES accepted: half of what one jsonb value may hold.
MAX_PAYLOAD_BYTES_LIMIT = 128 * 1024 * 1024

#: Keys a queue may override, with the global defaults they fall back to.
QUEUE_OPTION_KEYS = (
    "PRIORITY",
    "LEASE",
    "MAX_ATTEMPTS",
    "BACKOFF_BASE",
    "BACKOFF_CAP",
    "EXPIRES",
    "RESULT_RETENTION",
    "DEAD_RETENTION",
)


@dataclass(frozen=True, slots=True)
class QueueOptions:
    """The resolved options of one queue: its override, else the global default."""

    priority: int
    lease_s: int
    max_attempts: int
    backoff_base_s: int
    backoff_cap_s: int
    expires_s: float | None
    result_retention_s: int | None
    dead_retention_s: int | None


class Settings:
    """Typed view of `settings.PGJOBS`; each attribute's class value is its default."""

    #: Django database alias that holds the job tables.
    DATABASE: str = "default"
    #: Queues whose jobs live in a database of their own, by Django alias:
    #: {"ingestion": "jobs_a", "purge": "jobs_b"}. Their enqueues go there (outside the
    #: transaction of writes on any other database); `runjobs --database jobs_a` serves
    #: them. Every other queue lives in DATABASE.
    QUEUE_DATABASES: dict[str, str] = {}
    #: Queue used when neither the call nor the job names one.
    DEFAULT_QUEUE: str = "default"
    #: Send a NOTIFY when a runnable job is enqueued (switch off for poll-only operation).
    NOTIFY: bool = True
    #: The LISTEN/NOTIFY channel.
    CHANNEL: str = "pgjobs"
    #: Per-queue overrides: {"emails": {"LEASE": 120, "MAX_ATTEMPTS": 3}, ...}, and a
    #: queue's limit on its running jobs across every worker: {"MAX_RUNNING": 5}.
    QUEUES: dict[str, dict[str, Any]] = {}
    #: Periodic jobs: {"nightly": {"kind": "reports.nightly", "cron": "0 3 * * *",
    #: "timezone": "UTC", "payload": {}, "on_missed": "skip", ...enqueue options}}.
    SCHEDULES: dict[str, dict[str, Any]] = {}
    #: Run the schedules in every worker (each tick still enqueues one job in all).
    SCHEDULER: bool = True
    #: Refuse to enqueue a kind this process has no handler for (False: accept it, and
    #: warn once per kind: another service's workers may own it).
    STRICT_KINDS: bool = False
    #: Modules of @job functions to import in every process, beside every installed
    #: app's jobs.py: ["shop.tasks", "reports.exports"]. A kind defined anywhere else is
    #: known only to the processes that happen to import it: not to the workers.
    JOB_MODULES: list[str] = []

    # Queue options (overridable per queue)
    #: Priority of a job whose enqueue and decorator give none (-100..100, higher first).
    PRIORITY: int = 0
    #: Seconds a claim stays valid without a heartbeat (the visibility timeout).
    LEASE: float | timedelta = 60
    #: Claims a job may have before it is dead-lettered.
    MAX_ATTEMPTS: int = 10
    #: Backoff of the first retry, in whole seconds (doubles each attempt, equal jitter).
    BACKOFF_BASE: int = 10
    #: Longest backoff, in whole seconds.
    BACKOFF_CAP: int = 3600
    #: Dead-letter a job not finished this long after its enqueue (None: never).
    EXPIRES: float | timedelta | None = None
    #: Keep an acked job and its result this long as `done` (None or 0: delete on ack).
    RESULT_RETENTION: float | timedelta | None = None
    #: Prune dead letters this long after they died (None: keep forever).
    DEAD_RETENTION: float | timedelta | None = 30 * DAY
    #: The time each partition of the dead-letter table spans (S44), in whole seconds:
    #: the sweeper makes the next day's ahead (at least one span, at most seven) and drops
    #: each whole once all its letters are older than the longest dead retention, so a
    #: letter outlives its retention by up to one span. Shorter spans keep closer to the
    #: retention, at more partitions to plan over (the retention's days over the span:
    #: keep that under a few hundred).
    DEAD_PARTITION_SPAN: float | timedelta = DAY

    # Database
    #: Workers prepare their claim and completion statements once per connection and plan
    #: them once (session settings on their own connection). Switch off behind a pooler
    #: in transaction mode, which cannot keep either.
    PREPARE: bool = True
    #: Claims, heartbeats and completions made outside a transaction commit without
    #: waiting for the WAL flush; a database crash may lose their last moments, and those
    #: jobs run again, as after a worker crash. Enqueues are never affected.
    ASYNC_BOOKKEEPING: bool = True
    #: Seconds a statement of a worker's process may hear nothing from its server before
    #: the worker asks the server, on a new connection, whether it answers at all (S43).
    #: A server that does not (a primary that hangs: a paused VM, a stopped process) is
    #: given up: the worker cuts its every connection to it and reconnects, which after a
    #: failover finds the new primary. A server that answers is only slow, and its
    #: statement runs on. It also sets the libpq timeouts of the worker's connections
    #: where DATABASES' OPTIONS set none (connect_timeout, keepalives, tcp_user_timeout).
    #: TCP connections on Linux; behind PgBouncer it guards the link to the pooler only.
    #: None: wait as long as TCP does.
    HUNG_SERVER_TIMEOUT: float | timedelta | None = 5
    #: A connection string for the worker's LISTEN connection, straight to PostgreSQL,
    #: when DATABASES points at a transaction-mode pooler (PgBouncer), which cannot carry
    #: LISTEN. None: connect as the jobs database's settings say.
    LISTEN_DSN: str | None = None

    # Metrics
    #: The secret a scraper of the metrics sends: `Authorization: Bearer <token>`, or
    #: basic auth with the token as the password. None: only staff sessions may read them.
    METRICS_TOKEN: str | None = None
    #: Serve the metrics to anyone (no token, no login). A system check warns about it.
    METRICS_PUBLIC: bool = False
    #: Seconds a scrape's answer is reused, so that a flood of scrapes costs the database
    #: one overview per interval.
    METRICS_CACHE: float = 5.0
    #: `runjobs --metrics-addr` default: the address the worker's metrics server binds.
    METRICS_ADDR: str = "127.0.0.1"

    # Traces
    #: OpenTelemetry spans for enqueues and runs, and the trace context kept with each
    #: job enqueued inside a trace (needs django-pgjobs[otel] and a tracer provider set
    #: by the project; without them nothing is done, whatever this says).
    TRACING: bool = True

    # Limits
    #: Largest payload accepted, in bytes of its JSON text.
    MAX_PAYLOAD_BYTES: int = 1_048_576
    #: Failed attempts kept in a job's `errors` history (the oldest are dropped).
    ERRORS_KEPT: int = 10

    # Workers (runjobs options default to these)
    #: Handler threads per worker process.
    CONCURRENCY: int = 10
    #: Async handlers running at once on a worker's event loop, beside its threads.
    ASYNC_CONCURRENCY: int = 100
    #: The most jobs a worker claims ahead of its free threads, while its jobs are short:
    #: only as many as its threads start within PREFETCH_WAIT_S at the recent run time
    #: (0: claim for free threads only).
    PREFETCH: int = 100
    #: Seconds between polls when no notification arrives (the safety net).
    POLL_INTERVAL: float = 2.0
    #: Seconds in-flight jobs get to finish after SIGTERM before their claims go back.
    SHUTDOWN_GRACE: float = 30.0
    #: Seconds between two heartbeats of a worker's row in the registry (the admin's
    #: Workers, `jobsctl status`); a worker 3 heartbeats late shows as gone.
    WORKER_HEARTBEAT: float = 5.0

    # Maintenance
    #: Rows moved or deleted per statement by the sweeper.
    SWEEP_BATCH: int = 1000
    #: Seconds between sweeps in each worker (replicas take turns; 0 switches it off).
    SWEEP_INTERVAL: float = 60.0
    #: Seconds between two looks of each worker at the job table: a VACUUM when its dead
    #: rows outnumber the live ones or reach 50,000 (at least 1000) and can be removed (0
    #: switches it off).
    VACUUM_INTERVAL: float = 5.0

    def __getattribute__(self, name: str) -> Any:
        if name.isupper():
            configured = _configured()
            if name in configured:
                return configured[name]
            return getattr(Settings, name)
        return super().__getattribute__(name)

    def database_of(self, queue: str) -> str:
        """The database alias of `queue`'s jobs: its QUEUE_DATABASES entry, else DATABASE."""
        mapped: str | None = self.QUEUE_DATABASES.get(queue)
        return mapped or self.DATABASE

    def databases(self) -> list[str]:
        """Every database that holds jobs: DATABASE, then QUEUE_DATABASES' others."""
        others = sorted(set(self.QUEUE_DATABASES.values()) - {self.DATABASE})
        return [self.DATABASE, *others]

    def queue_options(self, queue: str) -> QueueOptions:
        """Resolve a queue's options: its entry in `QUEUES`, else the global defaults.

        Resolved once per queue and kept until the PGJOBS setting changes.

        Raises:
            ImproperlyConfigured: a value is of the wrong type or out of range.
        """
        options = _resolved_queues.get(queue)
        if options is None:
            options = self._resolve_options(
                self.QUEUES.get(queue, {}), f"PGJOBS['QUEUES'][{queue!r}]"
            )
            _resolved_queues[queue] = options
        return options

    def queue_limits(self) -> dict[str, int]:
        """The queues whose settings limit their running jobs (MAX_RUNNING), by name."""
        limits = {}
        for queue, overrides in self.QUEUES.items():
            limit = overrides.get("MAX_RUNNING") if isinstance(overrides, dict) else None
            if limit is not None:
                limits[queue] = limit
        return limits

    def tasks_backends(self) -> list[dict[str, Any]]:
        """The parameters of each TASKS backend that is django_pgjobs' (django.tasks)."""
        configured = getattr(django_settings, "TASKS", None) or {}
        if not isinstance(configured, dict):
            return []
        return [
            params
            for params in configured.values()
            if isinstance(params, dict) and params.get("BACKEND") == TASKS_BACKEND
        ]

    def default_options(self) -> QueueOptions:
        """Return the options of a queue that has no entry in `QUEUES`."""
        return self._resolve_options({}, "PGJOBS['QUEUES']")

    def _resolve_options(self, overrides: dict[str, Any], where: str) -> QueueOptions:

        def pick(key: str) -> tuple[Any, str]:
            if key in overrides:
                return overrides[key], f"{where}[{key!r}]"
            return getattr(self, key), f"PGJOBS[{key!r}]"

        priority, at = pick("PRIORITY")
        if not _is_int(priority) or not -100 <= priority <= 100:
            raise ImproperlyConfigured(f"{at} must be a whole number from -100 to 100.")
        lease, at = pick("LEASE")
        lease_s = math.ceil(seconds(lease, at))
        if lease_s < 1:
            raise ImproperlyConfigured(f"{at} must be at least 1 second.")
        max_attempts, at = pick("MAX_ATTEMPTS")
        if not _is_int(max_attempts) or max_attempts < 1:
            raise ImproperlyConfigured(f"{at} must be a whole number of at least 1.")
        base, at = pick("BACKOFF_BASE")
        if not _is_int(base) or base < 1:
            raise ImproperlyConfigured(f"{at} must be a whole number of seconds, at least 1.")
        cap, at = pick("BACKOFF_CAP")
        if not _is_int(cap) or cap < base:
            raise ImproperlyConfigured(
                f"{at} must be a whole number of seconds, at least BACKOFF_BASE ({base})."
            )
        expires, at = pick("EXPIRES")
        expires_s = None if expires is None else seconds(expires, at)
        if expires_s is not None and expires_s <= 0:
            raise ImproperlyConfigured(f"{at} must be positive, or None for no expiry.")
        retention, at = pick("RESULT_RETENTION")
        result_retention_s = _optional_whole_seconds(retention, at)
        dead_retention, at = pick("DEAD_RETENTION")
        dead_retention_s = _optional_whole_seconds(dead_retention, at)
        return QueueOptions(
            priority=priority,
            lease_s=lease_s,
            max_attempts=max_attempts,
            backoff_base_s=base,
            backoff_cap_s=cap,
            expires_s=expires_s,
            result_retention_s=result_retention_s or None,
            dead_retention_s=dead_retention_s,
        )

    def validate(self) -> None:
        """Check every setting, raising ImproperlyConfigured for the first bad one."""
        configured = getattr(django_settings, "PGJOBS", None)
        _pgjobs_dict[0] = None  # validate what the settings hold now
        if configured is None:
            return
        if not isinstance(configured, dict):
            raise ImproperlyConfigured("PGJOBS must be a dict.")
        known = {name for name in vars(Settings) if name.isupper()}
        unknown = sorted(set(configured) - known)
        if unknown:
            raise ImproperlyConfigured(
                f"PGJOBS has unknown keys {unknown}; known keys are {sorted(known)}."
            )
        for name in ("DATABASE", "DEFAULT_QUEUE", "CHANNEL"):
            if not isinstance(getattr(self, name), str) or not getattr(self, name):
                raise ImproperlyConfigured(f"PGJOBS[{name!r}] must be a non-empty string.")
        if self.LISTEN_DSN is not None and (
            not isinstance(self.LISTEN_DSN, str) or not self.LISTEN_DSN.strip()
        ):
            raise ImproperlyConfigured(
                "PGJOBS['LISTEN_DSN'] must be a connection string (or None), "
                f"not {self.LISTEN_DSN!r}."
            )
        token = self.METRICS_TOKEN
        if token is not None and (not isinstance(token, str) or len(token) < 16):
            raise ImproperlyConfigured(
                "PGJOBS['METRICS_TOKEN'] must be a string of at least 16 characters (or "
                "None): generate one with python -c 'import secrets; "
                "print(secrets.token_urlsafe())'."
            )
        if not isinstance(self.METRICS_ADDR, str) or not self.METRICS_ADDR:
            raise ImproperlyConfigured("PGJOBS['METRICS_ADDR'] must be an address to bind.")
        if seconds(self.METRICS_CACHE, "PGJOBS['METRICS_CACHE']") < 0:
            raise ImproperlyConfigured("PGJOBS['METRICS_CACHE'] must not be negative.")
        for name in (
            "NOTIFY",
            "PREPARE",
            "ASYNC_BOOKKEEPING",
            "SCHEDULER",
            "METRICS_PUBLIC",
            "STRICT_KINDS",
            "TRACING",
        ):
            if not isinstance(getattr(self, name), bool):
                raise ImproperlyConfigured(f"PGJOBS[{name!r}] must be True or False.")
        for name in (
            "MAX_PAYLOAD_BYTES",
            "ERRORS_KEPT",
            "SWEEP_BATCH",
            "CONCURRENCY",
            "ASYNC_CONCURRENCY",
        ):
            value = getattr(self, name)
            if not _is_int(value) or value < 1:
                raise ImproperlyConfigured(f"PGJOBS[{name!r}] must be a whole number >= 1.")
        if self.MAX_PAYLOAD_BYTES > MAX_PAYLOAD_BYTES_LIMIT:
            raise ImproperlyConfigured(
                f"PGJOBS['MAX_PAYLOAD_BYTES'] must be at most {MAX_PAYLOAD_BYTES_LIMIT:,} "
                "(128 MiB): PostgreSQL's jsonb holds at most 255 MB, and payloads this large "
                "belong in a table of their own."
            )
        if not _is_int(self.PREFETCH) or self.PREFETCH < 0:
            raise ImproperlyConfigured("PGJOBS['PREFETCH'] must be a whole number >= 0.")
        for name in ("POLL_INTERVAL", "WORKER_HEARTBEAT"):
            if seconds(getattr(self, name), f"PGJOBS[{name!r}]") <= 0:
                raise ImproperlyConfigured(f"PGJOBS[{name!r}] must be positive.")
        hung = self.HUNG_SERVER_TIMEOUT
        if hung is not None and seconds(hung, "PGJOBS['HUNG_SERVER_TIMEOUT']") < 1:
            raise ImproperlyConfigured(
                "PGJOBS['HUNG_SERVER_TIMEOUT'] must be at least 1 second (None: wait as "
                "long as TCP does)."
            )
        span = seconds(self.DEAD_PARTITION_SPAN, "PGJOBS['DEAD_PARTITION_SPAN']")
        if span < 1 or span != int(span):
            raise ImproperlyConfigured(
                "PGJOBS['DEAD_PARTITION_SPAN'] must be a whole number of seconds, at least 1 "
                "(a day suits most)."
            )
        for name in ("SHUTDOWN_GRACE", "SWEEP_INTERVAL", "VACUUM_INTERVAL"):
            if seconds(getattr(self, name), f"PGJOBS[{name!r}]") < 0:
                raise ImproperlyConfigured(f"PGJOBS[{name!r}] must not be negative.")
        routes = self.QUEUE_DATABASES
        if not isinstance(routes, dict) or not all(
            isinstance(queue, str) and queue and isinstance(alias, str) and alias
            for queue, alias in routes.items()
        ):
            raise ImproperlyConfigured(
                "PGJOBS['QUEUE_DATABASES'] must be a dict of queue name to database alias, "
                "both non-empty strings."
            )
        job_modules()
        queues = self.QUEUES
        if not isinstance(queues, dict):
            raise ImproperlyConfigured("PGJOBS['QUEUES'] must be a dict of queue name to dict.")
        for queue, overrides in queues.items():
            if not isinstance(overrides, dict):
                raise ImproperlyConfigured(f"PGJOBS['QUEUES'][{queue!r}] must be a dict.")
            bad = sorted(set(overrides) - {*QUEUE_OPTION_KEYS, "MAX_RUNNING"})
            if bad:
                raise ImproperlyConfigured(
                    f"PGJOBS['QUEUES'][{queue!r}] has unknown keys {bad}; "
                    f"a queue may set {[*QUEUE_OPTION_KEYS, 'MAX_RUNNING']}."
                )
            limit = overrides.get("MAX_RUNNING")
            if limit is not None and (not _is_int(limit) or not 1 <= limit <= 2**31 - 1):
                raise ImproperlyConfigured(
                    f"PGJOBS['QUEUES'][{queue!r}]['MAX_RUNNING'] must be a whole number "
                    ">= 1, or None for no limit."
                )
            self.queue_options(queue)
        self.queue_options(self.DEFAULT_QUEUE)


def job_modules() -> list[str]:
    """PGJOBS["JOB_MODULES"], checked: a list of dotted module paths.

    Raises:
        ImproperlyConfigured: anything else, saying what it must be.
    """
    modules = pgjobs_settings.JOB_MODULES
    if not isinstance(modules, list | tuple) or not all(
        isinstance(module, str) and module.strip() for module in modules
    ):
        raise ImproperlyConfigured(
            "PGJOBS['JOB_MODULES'] must be a list of dotted module paths, such as "
            f"['shop.tasks'], not {modules!r}."
        )
    return list(modules)


def seconds(value: Any, what: str) -> float:
    """Return a duration given as seconds or a timedelta, as float seconds."""
    if isinstance(value, timedelta):
        return value.total_seconds()
    if isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value):
        return float(value)
    raise ImproperlyConfigured(f"{what} must be a number of seconds or a timedelta.")


def _optional_whole_seconds(value: Any, what: str) -> int | None:
    if value is None:
        return None
    whole = math.ceil(seconds(value, what))
    if whole < 0:
        raise ImproperlyConfigured(f"{what} must not be negative (None switches it off).")
    return whole


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


#: Queue options resolved so far; emptied whenever the PGJOBS setting changes.
_resolved_queues: dict[str, QueueOptions] = {}
#: settings.PGJOBS as last read (None: read it again); reset with the cache above.
_pgjobs_dict: list[dict[str, Any] | None] = [None]


def _configured() -> dict[str, Any]:
    configured = _pgjobs_dict[0]
    if configured is None:
        configured = getattr(django_settings, "PGJOBS", None) or {}
        _pgjobs_dict[0] = configured
    return configured


def _forget_resolved(*, setting: str, **kwargs: Any) -> None:
    if setting == "PGJOBS":
        _resolved_queues.clear()
        _pgjobs_dict[0] = None


setting_changed.connect(_forget_resolved)

pgjobs_settings = Settings()
