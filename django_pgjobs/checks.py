"""System checks: the database must be PostgreSQL, the PGJOBS settings and the declared
schedules valid, and no other app's command may hide ours."""

from __future__ import annotations

import contextlib
import sys
from typing import Any

from django.conf import settings
from django.core import checks
from django.core.exceptions import ImproperlyConfigured
from django.db import DatabaseError

from django_pgjobs import registry
from django_pgjobs.conf import pgjobs_settings
from django_pgjobs.exceptions import InvalidCron
from django_pgjobs.models import Job
from django_pgjobs.schedules import declared_schedules


@checks.register(checks.Tags.database, checks.Tags.compatibility)
def check_database(app_configs: Any = None, **kwargs: Any) -> list[checks.CheckMessage]:
    """pgjobs.E001: the jobs database alias exists and is PostgreSQL."""
    alias = pgjobs_settings.DATABASE
    if not isinstance(alias, str) or alias not in settings.DATABASES:
        return [
            checks.Error(
                f"PGJOBS['DATABASE'] is {alias!r}, which is not a key of DATABASES.",
                hint=f"Use one of {sorted(settings.DATABASES)}.",
                id="pgjobs.E001",
            )
        ]
    engine = settings.DATABASES[alias].get("ENGINE", "")
    if engine != "django.db.backends.postgresql" and not engine.endswith(".postgresql"):
        return [
            checks.Error(
                f"django_pgjobs needs PostgreSQL, but DATABASES[{alias!r}] uses {engine!r}.",
                hint="Set ENGINE to 'django.db.backends.postgresql' (psycopg 3).",
                id="pgjobs.E001",
            )
        ]
    return []


@checks.register(checks.Tags.compatibility)
def check_queue_databases(app_configs: Any = None, **kwargs: Any) -> list[checks.CheckMessage]:
    """pgjobs.E004: every database of PGJOBS["QUEUE_DATABASES"] exists and is PostgreSQL,
    and no declared schedule's queue is moved there (schedules live in the jobs database).
    pgjobs.I002: the queues moved say that their enqueues leave the caller's transaction."""
    routes = pgjobs_settings.QUEUE_DATABASES
    if not isinstance(routes, dict) or not routes:
        return []
    found: list[checks.CheckMessage] = []
    for queue, alias in sorted(routes.items()):
        engine = settings.DATABASES.get(alias, {}).get("ENGINE", "") if alias else ""
        if alias not in settings.DATABASES:
            found.append(
                checks.Error(
                    f"PGJOBS['QUEUE_DATABASES'][{queue!r}] is {alias!r}, which is not a key "
                    "of DATABASES.",
                    hint=f"Use one of {sorted(settings.DATABASES)}.",
                    id="pgjobs.E004",
                )
            )
        elif engine != "django.db.backends.postgresql" and not engine.endswith(".postgresql"):
            found.append(
                checks.Error(
                    f"The jobs of queue {queue!r} live in {alias!r}, which uses {engine!r}.",
                    hint="django_pgjobs needs PostgreSQL (psycopg 3) there.",
                    id="pgjobs.E004",
                )
            )
    try:
        schedules = declared_schedules()
    except (InvalidCron, ImproperlyConfigured):
        schedules = {}  # E003 reports them
    for name, declaration in sorted(schedules.items()):
        queue = (
            declaration.options.get("queue")
            or registry.decorator_defaults(declaration.kind).get("queue")
            or pgjobs_settings.DEFAULT_QUEUE
        )
        if pgjobs_settings.database_of(queue) != pgjobs_settings.DATABASE:
            found.append(
                checks.Error(
                    f"Schedule {name!r} enqueues to queue {queue!r}, whose jobs live in "
                    f"{pgjobs_settings.database_of(queue)!r}: schedules run in the jobs "
                    f"database ({pgjobs_settings.DATABASE!r}) only.",
                    hint="Schedule a job of a queue of the jobs database that enqueues it.",
                    id="pgjobs.E004",
                )
            )
    moved = ", ".join(f"{queue} -> {alias}" for queue, alias in sorted(routes.items()))
    found.append(
        checks.Info(
            f"Queues in databases of their own: {moved}. Their enqueues are written there, "
            "outside a transaction of any other database (an OutsideTransactionWarning "
            "says so when it happens).",
            hint="Wrap such an enqueue in transaction.atomic(using=<its database>); run "
            "one runjobs --database <alias> per database.",
            id="pgjobs.I002",
        )
    )
    return found


@checks.register(checks.Tags.compatibility)
def check_router(app_configs: Any = None, **kwargs: Any) -> list[checks.CheckMessage]:
    """pgjobs.W002: a jobs database other than 'default' has a router sending the models."""
    alias = pgjobs_settings.DATABASE
    if not isinstance(alias, str) or alias == "default" or alias not in settings.DATABASES:
        return []  # E001 reports a missing alias
    if _routed():
        return []
    return [
        checks.Warning(
            f"PGJOBS['DATABASE'] is {alias!r}, but no database router sends "
            "django_pgjobs' models there: the admin and migrate would use 'default'.",
            hint="Add 'django_pgjobs.routers.JobsRouter' to DATABASE_ROUTERS.",
            id="pgjobs.W002",
        )
    ]


def _routed() -> bool:
    """True when the configured routers send django_pgjobs' models to PGJOBS['DATABASE']."""
    from django.db import router

    return router.db_for_read(Job) == pgjobs_settings.DATABASE and bool(
        router.allow_migrate(pgjobs_settings.DATABASE, "django_pgjobs", model_name="job")
    )


@checks.register(checks.Tags.compatibility)
def check_settings(app_configs: Any = None, **kwargs: Any) -> list[checks.CheckMessage]:
    """pgjobs.E002: every PGJOBS setting has a usable value."""
    try:
        pgjobs_settings.validate()
    except ImproperlyConfigured as error:
        return [
            checks.Error(
                str(error),
                hint="The settings and their defaults: docs/reference/settings.md.",
                id="pgjobs.E002",
            )
        ]
    return []


@checks.register(checks.Tags.compatibility)
def check_commands(app_configs: Any = None, **kwargs: Any) -> list[checks.CheckMessage]:
    """pgjobs.W001: another app's `runjobs` or `sweepjobs` command hides ours."""
    from django.core.management import get_commands

    commands = get_commands()
    ours = {
        "runjobs": "django_pgjobs",
        "sweepjobs": "django_pgjobs",
        "jobsctl": "django_pgjobs",
        "chaosjobs": "django_pgjobs.chaos",
    }
    hidden = [
        f"{name} (from {commands[name]})"
        for name, app in ours.items()
        if commands.get(name) not in (None, app)
    ]
    if not hidden:
        return []
    return [
        checks.Warning(
            f"Another app's management command hides django_pgjobs': {', '.join(hidden)}.",
            hint="List 'django_pgjobs' before that app in INSTALLED_APPS "
            "(django-extensions ships a `runjobs` of its own).",
            id="pgjobs.W001",
        )
    ]


@checks.register(checks.Tags.compatibility)
def check_schedules(app_configs: Any = None, **kwargs: Any) -> list[checks.CheckMessage]:
    """pgjobs.E003: every declared schedule is valid (and croniter is installed)."""
    try:
        declared_schedules()
    except (InvalidCron, ImproperlyConfigured) as error:
        return [
            checks.Error(
                str(error),
                hint="How to declare schedules: docs/how-to/schedules.md.",
                id="pgjobs.E003",
            )
        ]
    return []


@checks.register(checks.Tags.security, deploy=True)
def check_metrics_exposure(app_configs: Any = None, **kwargs: Any) -> list[checks.CheckMessage]:
    """pgjobs.W010: metrics served to anyone; pgjobs.W011: the worker's metrics bound to
    another address than loopback without a token."""
    from django_pgjobs.metrics import is_loopback

    messages: list[checks.CheckMessage] = []
    if pgjobs_settings.METRICS_PUBLIC is True:
        messages.append(
            checks.Warning(
                "PGJOBS['METRICS_PUBLIC'] is True: anyone who reaches the metrics sees your "
                "queue names, job kinds and counts, and each scrape costs the database.",
                hint="Set PGJOBS['METRICS_TOKEN'] and send it from Prometheus "
                "(authorization: credentials), then remove METRICS_PUBLIC.",
                id="pgjobs.W010",
            )
        )
    addr = pgjobs_settings.METRICS_ADDR
    if isinstance(addr, str) and not is_loopback(addr) and not pgjobs_settings.METRICS_TOKEN:
        messages.append(
            checks.Warning(
                f"PGJOBS['METRICS_ADDR'] is {addr!r} and no METRICS_TOKEN is set: a worker's "
                "metrics would be open to the network (runjobs refuses to serve them so "
                "unless METRICS_PUBLIC is set).",
                hint="Set PGJOBS['METRICS_TOKEN'], or bind 127.0.0.1.",
                id="pgjobs.W011",
            )
        )
    return messages


@checks.register(checks.Tags.security, checks.Tags.database, deploy=True)
def check_database_role(
    app_configs: Any = None, databases: Any = None, **kwargs: Any
) -> list[checks.CheckMessage]:
    """pgjobs.W012: the jobs database's role can do more than read and write rows."""
    from django_pgjobs.db.connection import role_privileges

    alias = pgjobs_settings.DATABASE
    if not databases or alias not in databases:
        return []  # Django asks the database only when a check runs with --database
    try:
        name, superuser, create_role, create_db = role_privileges(alias)
    except DatabaseError:
        return []  # pgjobs.E001 and migrate report an unreachable database
    powers = [
        power
        for power, held in (
            ("is a superuser", superuser),
            ("can create roles", create_role),
            ("can create databases", create_db),
        )
        if held
    ]
    if not powers:
        return []
    return [
        checks.Warning(
            f"The jobs database's role {name!r} {', '.join(powers)}: a worker needs only to "
            "read and write the rows of the app's tables.",
            hint="Run workers and the web process as a role with only those grants (see "
            "docs/explanation/security.md, 'A least-privilege role'); keep the owner role for "
            "migrate.",
            id="pgjobs.W012",
        )
    ]


@checks.register(checks.Tags.compatibility, deploy=True)
def check_strict_kinds(app_configs: Any = None, **kwargs: Any) -> list[checks.CheckMessage]:
    """pgjobs.I001: whether an enqueue of a kind this process has no handler for is
    refused (PGJOBS['STRICT_KINDS']) or accepted with a warning."""
    if pgjobs_settings.STRICT_KINDS is True:
        text = (
            "PGJOBS['STRICT_KINDS'] is on: an enqueue of a kind this process has no handler "
            "for is refused (InvalidKind)."
        )
        hint = "Turn it off if another service's workers own kinds you enqueue by name."
    else:
        text = (
            "PGJOBS['STRICT_KINDS'] is off: an enqueue of a kind this process has no handler "
            "for is accepted, with a warning once per kind."
        )
        hint = "Turn it on when every kind you enqueue is registered where you enqueue it."
    return [checks.Info(text, hint=hint, id="pgjobs.I001")]


#: Seconds the migrations check waits to reach the database: a command run where the
#: database is out of reach (collectstatic in an image build) is delayed this much.
MIGRATIONS_CHECK_TIMEOUT_S = 2


@checks.register(checks.Tags.compatibility)
def check_migrations_applied(
    app_configs: Any = None, databases: Any = None, **kwargs: Any
) -> list[checks.CheckMessage]:
    """pgjobs.W013: the app's migrations are not all applied to the jobs database (an
    enqueue would fail: the tables are missing, or older than the code). Not said by
    `manage.py migrate`, which is about to apply them (call_command skips the checks)."""
    if sys.argv[1:2] == ["migrate"]:
        return []
    from django.db.migrations.loader import MigrationLoader

    from django_pgjobs.db.connection import applied_migrations

    found: list[checks.CheckMessage] = []
    for alias in pgjobs_settings.databases():
        if alias not in settings.DATABASES:
            continue  # pgjobs.E001 and E004 say so
        applied = applied_migrations(alias, "django_pgjobs", MIGRATIONS_CHECK_TIMEOUT_S)
        if applied is None:
            continue  # out of reach: pgjobs.E001 and runjobs say so where it matters
        loader = MigrationLoader(None, ignore_no_migrations=True)
        on_disk = {name for app, name in loader.disk_migrations if app == "django_pgjobs"}
        missing = sorted(on_disk - applied)
        if missing:
            found.append(
                checks.Warning(
                    f"django_pgjobs has {len(missing)} unapplied migration(s) in database "
                    f"{alias!r} (the last: {missing[-1]}): enqueues fail until they are "
                    "applied.",
                    hint=f"Run: python manage.py migrate django_pgjobs --database {alias}",
                    id="pgjobs.W013",
                )
            )
    return found


@checks.register(checks.Tags.compatibility)
def check_job_modules(app_configs: Any = None, **kwargs: Any) -> list[checks.CheckMessage]:
    """pgjobs.W014: a @job function lives in a module workers do not import (known here
    only because something, a view say, imported it after the app was ready)."""
    from django.urls import get_resolver

    # Import the views, as a request would (what they import registers its kinds); a
    # broken URLconf is for Django's own URL checks to report.
    with contextlib.suppress(Exception):
        get_resolver().url_patterns  # noqa: B018
    found: list[checks.CheckMessage] = []
    for module, kinds in registry.kinds_by_module().items():
        stranded = [kind for kind in kinds if registry.undiscovered_module(kind) is not None]
        if stranded:
            found.append(
                checks.Warning(
                    f"Job kind(s) {', '.join(map(repr, stranded))} live in {module}, a "
                    "module no app loads (a view imported it here): a worker knows them "
                    "only if it happens to import that module too, and otherwise fails "
                    f"their jobs with 'unknown job kind' ({registry.HOW_WORKERS_FIND_KINDS}).",
                    hint=f"Move them to a jobs.py module of their app, or add {module!r} to "
                    "PGJOBS['JOB_MODULES'].",
                    id="pgjobs.W014",
                )
            )
    return found
