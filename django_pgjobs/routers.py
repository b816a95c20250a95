"""Keep django_pgjobs' tables on the jobs database, `PGJOBS["DATABASE"]` (and on the
databases of PGJOBS["QUEUE_DATABASES"], where `migrate --database <alias>` creates them).

    DATABASES = {"default": {...}, "jobs": {...}}
    DATABASE_ROUTERS = ["django_pgjobs.routers.JobsRouter"]
    PGJOBS = {"DATABASE": "jobs"}

The queue's own calls name the jobs database themselves; the router is for the rest of
Django: the admin's lists, `Job.objects.filter(...)` in your code, and `migrate`, which
creates the tables only there (`python manage.py migrate --database jobs`).

A job is enqueued in the same transaction as your writes only when they are on the same
database: with a database of its own, `transaction.atomic(using="jobs")` covers the
enqueue, not your `default` writes.
"""

from __future__ import annotations

from typing import Any

from django_pgjobs.conf import pgjobs_settings
from django_pgjobs.db import connection as db

#: The apps whose tables live in the jobs database: the queue's, and the chaos run's.
APP_LABELS = frozenset({"django_pgjobs", "pgjobs_chaos"})


class JobsRouter:
    """Route django_pgjobs' models to PGJOBS["DATABASE"] and no other database."""

    def db_for_read(self, model: type[Any], **hints: Any) -> str | None:
        # In a view of the console, the database its selector chose (QUEUE_DATABASES).
        return db.default_alias() if model._meta.app_label in APP_LABELS else None

    def db_for_write(self, model: type[Any], **hints: Any) -> str | None:
        return db.default_alias() if model._meta.app_label in APP_LABELS else None

    def allow_relation(self, obj1: Any, obj2: Any, **hints: Any) -> bool | None:
        return None

    def allow_migrate(
        self, db: str, app_label: str, model_name: str | None = None, **hints: Any
    ) -> bool | None:
        if app_label in APP_LABELS:
            return db in pgjobs_settings.databases()  # QUEUE_DATABASES' databases too
        return None
