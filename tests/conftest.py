"""Fixtures: a real PostgreSQL for the session, and helpers for concurrency tests."""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest

from django_pgjobs.testing.localdb import EmbeddedPostgres, database_settings


@pytest.fixture(scope="session")
def postgres_url() -> Iterator[str]:
    """DATABASE_URL if it is set, else a private PostgreSQL removed after the session."""
    url = os.environ.get("DATABASE_URL")
    if url:
        yield url
        return
    server = EmbeddedPostgres().start()
    try:
        yield server.url
    finally:
        server.stop()


@pytest.fixture(scope="session")
def django_db_modify_db_settings(
    django_db_modify_db_settings_parallel_suffix: None, postgres_url: str
) -> None:
    from django.conf import settings

    settings.DATABASES["default"].update(database_settings(postgres_url))


@pytest.fixture
def workers() -> Iterator[object]:
    """Start `manage.py runjobs` processes; any left running are killed afterwards."""
    from tests.spawn import Workers

    started = Workers()
    try:
        yield started
    finally:
        started.close()


@pytest.fixture
def example_database() -> Iterator[str]:
    """A fresh database for the example project (its URL), dropped afterwards."""
    from tests.example import scratch_database

    with scratch_database() as url:
        yield url
