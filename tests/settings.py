"""Settings of the test suite (and of the workers the suite starts as subprocesses).

The database comes from DATABASE_URL. Without it the session fixture in conftest.py
starts a private PostgreSQL and points these settings at it; the placeholder below
starts nothing (settings are imported before conftest runs).
"""

import os
from typing import Any

from django_pgjobs.testing.localdb import database_settings

SECRET_KEY = "tests-only-not-secret"
DEBUG = False
USE_TZ = True
TIME_ZONE = "UTC"

DATABASES = {
    "default": database_settings(
        os.environ.get("DATABASE_URL", "postgresql://postgres@127.0.0.1:1/postgres")
    )
}

try:
    import django.tasks  # noqa: F401  (Django 6)

    TASKS_APPS: list[str] = []
except ImportError:  # Django 5.2: the backport is an app
    TASKS_APPS = ["django_tasks"]

INSTALLED_APPS = [
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.admin",
    *TASKS_APPS,
    "django_pgjobs",
    "django_pgjobs.chaos",
    "tests",
]
TASKS = {
    "default": {
        "BACKEND": "django_pgjobs.backend.PgJobsBackend",
        "QUEUES": [],
        "OPTIONS": {"RESULT_RETENTION": 3600},
    }
}
MIDDLEWARE = [
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
]
ROOT_URLCONF = "tests.urls"
TEMPLATES = [
    {
        "BACKEND": "django.template.backends.django.DjangoTemplates",
        "APP_DIRS": True,
        "OPTIONS": {
            "context_processors": [
                "django.template.context_processors.request",
                "django.contrib.auth.context_processors.auth",
                "django.contrib.messages.context_processors.messages",
            ]
        },
    }
]
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"
PGJOBS: dict[str, Any] = {"QUEUES": {"slow": {"LEASE": 120, "MAX_ATTEMPTS": 3, "BACKOFF_BASE": 2}}}
# Workers the suite starts behind PgBouncer (tests/processes/test_pgbouncer.py) are told so here.
if os.environ.get("PGJOBS_PREPARE") == "0":
    PGJOBS["PREPARE"] = False
# Workers a test asks things of from the console heartbeat this often.
if os.environ.get("PGJOBS_WORKER_HEARTBEAT"):
    PGJOBS["WORKER_HEARTBEAT"] = float(os.environ["PGJOBS_WORKER_HEARTBEAT"])
# Workers the security tests start with a metrics token are given it here.
if os.environ.get("PGJOBS_METRICS_TOKEN"):
    PGJOBS["METRICS_TOKEN"] = os.environ["PGJOBS_METRICS_TOKEN"]
# Workers of a test run both ways (the `notify` fixture) are told when it is off.
if os.environ.get("PGJOBS_NOTIFY") == "0":
    PGJOBS["NOTIFY"] = False
# Django's own tasks of its tests of django.tasks (tests/upstream_tasks.py) live outside
# the app's jobs.py and tasks.py, as a project's shop/tasks.py might: listed, as it must be.
# Processes the first-hour tests start import more (PGJOBS_JOB_MODULES).
PGJOBS["JOB_MODULES"] = [
    "tests.upstream_tasks",
    *filter(None, os.environ.get("PGJOBS_JOB_MODULES", "").split(",")),
]
# Workers the tracing tests start write their spans to this file (tests/otel.py).
if os.environ.get("PGJOBS_TEST_SPANS_FILE"):
    from tests.otel import write_to

    write_to(os.environ["PGJOBS_TEST_SPANS_FILE"])
if os.environ.get("PGJOBS_HUNG_SERVER_TIMEOUT"):
    PGJOBS["HUNG_SERVER_TIMEOUT"] = float(os.environ["PGJOBS_HUNG_SERVER_TIMEOUT"])
if os.environ.get("PGJOBS_BACKOFF_BASE"):
    PGJOBS["BACKOFF_BASE"] = int(os.environ["PGJOBS_BACKOFF_BASE"])
if os.environ.get("PGJOBS_LISTEN_DSN"):
    PGJOBS["LISTEN_DSN"] = os.environ["PGJOBS_LISTEN_DSN"]
LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "handlers": {"console": {"class": "logging.StreamHandler"}},
    "loggers": {
        "django_pgjobs": {
            "handlers": ["console"],
            # A test whose workers must log every job's end sets INFO.
            "level": os.environ.get("PGJOBS_TEST_LOG_LEVEL", "WARNING"),
        }
    },
}
