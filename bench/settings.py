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
INSTALLED_APPS = ["django.contrib.contenttypes", "django_pgjobs", "bench"]
# Django's tasks framework on the queue (the tasks benchmark), with its default options.
TASKS = {"default": {"BACKEND": "django_pgjobs.backend.PgJobsBackend"}}
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"
# A worker started with PGJOBS_BENCH_NOTIFY=0 neither listens nor notifies (the cancel
# benchmark's heartbeat-only case).
PGJOBS = {"NOTIFY": os.environ.get("PGJOBS_BENCH_NOTIFY", "1") == "1"}
LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "handlers": {"stderr": {"class": "logging.StreamHandler"}},
    "loggers": {
        "django_pgjobs.worker": {"handlers": ["stderr"], "level": "INFO", "propagate": False},
        "django_pgjobs.jobs": {"handlers": ["stderr"], "level": "ERROR", "propagate": False},
    },
}
