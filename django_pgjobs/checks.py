"""System checks: the database must be PostgreSQL, the PGJOBS settings and the declared
schedules valid, and no other app's command may hide ours."""

from __future__ import annotations

from typing import Any

from django.conf import settings
from django.core import checks
from django.core.exceptions import ImproperlyConfigured

from django_pgjobs.conf import pgjobs_settings


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

    from django_pgjobs.models import Job

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
                hint="See the Settings section of django_pgjobs' README.",
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
    from django_pgjobs.exceptions import InvalidCron
    from django_pgjobs.schedules import declared_schedules

    try:
        declared_schedules()
    except (InvalidCron, ImproperlyConfigured) as error:
        return [
            checks.Error(
                str(error),
                hint="See the Schedules section of django_pgjobs' README.",
                id="pgjobs.E003",
            )
        ]
    return []
