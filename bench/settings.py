"""Settings of the benchmark processes: django_pgjobs at its default settings.

The harness (`python -m bench`) creates the database and always sets DATABASE_URL.
"""

import os

from django_pgjobs.testing.localdb import database_settings

SECRET_KEY = "bench-not-a-secret"
USE_TZ = True
TIME_ZONE = "UTC"
DATABASES = {"default": database_settings(os.environ["DATABASE_URL"])}
# Persistent connections, as production sites run them (and as preparing statements needs).
DATABASES["default"]["CONN_MAX_AGE"] = 60
INSTALLED_APPS = [
    "django.contrib.contenttypes",
    # The admin, for the console benchmark (its dashboard and lists, as a browser asks).
    "django.contrib.auth",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.admin",
    "django_pgjobs",
    "bench",
]
MIDDLEWARE = [
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
]
ROOT_URLCONF = "bench.urls"
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
STATIC_URL = "static/"
ALLOWED_HOSTS = ["testserver", "localhost", "127.0.0.1"]
# Django's tasks framework on the queue (the tasks benchmark), with its default options.
TASKS = {"default": {"BACKEND": "django_pgjobs.backend.PgJobsBackend"}}
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"
# A worker started with PGJOBS_BENCH_NOTIFY=0 neither listens nor notifies (the cancel
# benchmark's heartbeat-only case).
# PGJOBS_BENCH_HEARTBEAT sets the worker registry's heartbeat (the console benchmark's
# drain with the registry beating 50 times as often as by default, against almost never).
# PGJOBS_BENCH_PREPARE=0: workers behind PgBouncer in transaction mode (many_workers).
# PGJOBS_BENCH_VACUUM_INTERVAL=0: workers that leave the job table to autovacuum (the
# pressure benchmark's "before").
# PGJOBS_BENCH_HUNG_SERVER_TIMEOUT=none: workers without the hung-server guard (S43).
# PGJOBS_BENCH_DEAD_PARTITION_SPAN=604800: dead-letter partitions a week each (history).
_hung = os.environ.get("PGJOBS_BENCH_HUNG_SERVER_TIMEOUT", "5")
_span = os.environ.get("PGJOBS_BENCH_DEAD_PARTITION_SPAN")
PGJOBS = {
    "VACUUM_INTERVAL": float(os.environ.get("PGJOBS_BENCH_VACUUM_INTERVAL", "5")),
    "NOTIFY": os.environ.get("PGJOBS_BENCH_NOTIFY", "1") == "1",
    "WORKER_HEARTBEAT": float(os.environ.get("PGJOBS_BENCH_HEARTBEAT", "5")),
    "PREPARE": os.environ.get("PGJOBS_BENCH_PREPARE", "1") == "1",
    "HUNG_SERVER_TIMEOUT": None if _hung == "none" else float(_hung),
    **({"DEAD_PARTITION_SPAN": float(_span)} if _span else {}),
}
LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "handlers": {"stderr": {"class": "logging.StreamHandler"}},
    "loggers": {
        "django_pgjobs.worker": {"handlers": ["stderr"], "level": "INFO", "propagate": False},
        # The table's care: its VACUUMs, and when claims read from floors (pressure).
        "django_pgjobs.maintenance": {
            "handlers": ["stderr"],
            "level": "INFO",
            "propagate": False,
        },
        "django_pgjobs.jobs": {"handlers": ["stderr"], "level": "ERROR", "propagate": False},
    },
}
