"""Django app configuration."""

from __future__ import annotations

import importlib

from django.apps import AppConfig
from django.core.exceptions import ImproperlyConfigured


class PgJobsConfig(AppConfig):
    name = "django_pgjobs"
    label = "django_pgjobs"
    verbose_name = "Job queue"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        from django.utils.module_loading import autodiscover_modules

        from django_pgjobs import checks  # noqa: F401  (registers the system checks)
        from django_pgjobs.conf import job_modules, pgjobs_settings

        # Register every app's jobs.py, and the modules PGJOBS["JOB_MODULES"] names, so
        # that the decorator defaults of a kind (S2) apply wherever it is enqueued, and
        # so that workers know every kind.
        autodiscover_modules("jobs")
        for module in job_modules():
            try:
                importlib.import_module(module)
            except ImportError as error:
                raise ImproperlyConfigured(
                    f"PGJOBS['JOB_MODULES'] names {module!r}, which cannot be imported "
                    f"({error}). Give the dotted path of a module on the Python path."
                ) from error
        if pgjobs_settings.tasks_backends():
            # django.tasks has no registry of its own: a task is known once its module is
            # imported. Workers run only known kinds, so load every app's tasks.py.
            autodiscover_modules("tasks")
