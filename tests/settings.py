"""Settings of the test suite (and of the workers the suite starts as subprocesses).

The database comes from DATABASE_URL. Without it the session fixture in conftest.py
starts a private PostgreSQL and points these settings at it; the placeholder below
starts nothing (settings are imported before conftest runs).
"""

import os

from django_pgjobs.localdb import database_settings

SECRET_KEY = "tests-only-not-secret"
DEBUG = False
USE_TZ = True
TIME_ZONE = "UTC"

DATABASES = {
    "default": database_settings(
        os.environ.get("DATABASE_URL", "postgresql://postgres@127.0.0.1:1/postgres")
    )
}

INSTALLED_APPS = [
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.admin",
    "django_pgjobs",
    "tests",
]
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
PGJOBS = {"QUEUES": {"slow": {"LEASE": 120, "MAX_ATTEMPTS": 3, "BACKOFF_BASE": 2}}}
LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "handlers": {"console": {"class": "logging.StreamHandler"}},
    "loggers": {"django_pgjobs": {"handlers": ["console"], "level": "WARNING"}},
}
