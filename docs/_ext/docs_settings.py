"""The Django settings the documentation is built with.

The reference imports django_pgjobs' modules (models, commands, the tasks backend) and
reads defaults from them; nothing connects to a database, so the one configured here
need not exist. PGJOBS is left out on purpose: the pages show the defaults.
"""

from __future__ import annotations

import django

SECRET_KEY = "the-docs-build-serves-nothing"
USE_TZ = True
INSTALLED_APPS = [
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django_pgjobs",
    "django_pgjobs.chaos",
]
if django.VERSION < (6, 0):  # the django.tasks backport, for the tasks backend's pages
    INSTALLED_APPS.append("django_tasks")
DATABASES = {
    "default": {
        "ENGINE": "django.db.backends.postgresql",
        "NAME": "never_connected_by_the_docs_build",
    }
}
TASKS = {"default": {"BACKEND": "django_pgjobs.backend.PgJobsBackend"}}
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"
