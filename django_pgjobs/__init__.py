"""django_pgjobs: a durable job queue in your own PostgreSQL database.

Importing this package touches neither settings nor models; the names below are
resolved on first use, so the package can sit in INSTALLED_APPS.

    from django_pgjobs import Fail, Job, JobHandle, Retry, job
"""

from __future__ import annotations

from importlib import metadata
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # the names below are imported lazily at run time
    from django_pgjobs.claims import JobHandle
    from django_pgjobs.db.watchdog import guarding as guard_connections
    from django_pgjobs.decorators import job
    from django_pgjobs.exceptions import Cancelled, Fail, LeaseLost, Retry
    from django_pgjobs.limits import Rate
    from django_pgjobs.models import DeadJob, Job
    from django_pgjobs.schedules import Cron

try:
    __version__ = metadata.version("django-pgjobs")
except metadata.PackageNotFoundError:  # pragma: no cover - running from a source tree
    __version__ = "0+unknown"

__all__ = [
    "Cancelled",
    "Cron",
    "DeadJob",
    "Fail",
    "Job",
    "JobHandle",
    "LeaseLost",
    "Rate",
    "Retry",
    "__version__",
    "guard_connections",
    "job",
]


def __getattr__(name: str) -> Any:
    if name in ("Cancelled", "Fail", "Retry", "LeaseLost"):
        from django_pgjobs import exceptions

        return getattr(exceptions, name)
    if name == "JobHandle":
        from django_pgjobs.claims import JobHandle

        return JobHandle
    if name in ("Job", "DeadJob"):
        from django_pgjobs import models

        return getattr(models, name)
    if name == "guard_connections":
        from django_pgjobs.db.watchdog import guarding

        return guarding
    if name == "Rate":
        from django_pgjobs.limits import Rate

        return Rate
    if name == "Cron":
        from django_pgjobs.schedules import Cron

        return Cron
    if name == "job":
        from django_pgjobs.decorators import job

        return job
    raise AttributeError(f"module 'django_pgjobs' has no attribute {name!r}")
