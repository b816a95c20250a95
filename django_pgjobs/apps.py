"""Django app configuration."""

from __future__ import annotations

from django.apps import AppConfig


class PgJobsConfig(AppConfig):
    name = "django_pgjobs"
    label = "django_pgjobs"
    verbose_name = "Job queue"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        from django.utils.module_loading import autodiscover_modules

        from django_pgjobs import checks  # noqa: F401  (registers the system checks)
        from django_pgjobs.conf import pgjobs_settings

        # Register every app's jobs.py, so that the decorator defaults of a kind (S2)
        # apply wherever it is enqueued, and so that workers know every kind.
        autodiscover_modules("jobs")
        if pgjobs_settings.tasks_backends():
            # django.tasks has no registry of its own: a task is known once its module is
            # imported. Workers run only known kinds, so load every app's tasks.py.
            autodiscover_modules("tasks")
