"""The chaos run as an app of its own: add "django_pgjobs.chaos" to INSTALLED_APPS to
get `manage.py chaosjobs` and its ledger table; without it, no chaos table exists."""

from __future__ import annotations

from django.apps import AppConfig


class PgJobsChaosConfig(AppConfig):
    name = "django_pgjobs.chaos"
    label = "pgjobs_chaos"
    verbose_name = "Jobs: chaos runs"
    default_auto_field = "django.db.models.BigAutoField"
