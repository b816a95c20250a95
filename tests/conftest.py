"""Fixtures: a real PostgreSQL for the session, and helpers for concurrency tests."""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator
from typing import Any

import pytest

from django_pgjobs.testing.localdb import EmbeddedPostgres, database_settings
from tests.proxy import FreezableProxy, freezable_proxy


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
        keep_log = os.environ.get("PGJOBS_EMBEDDED_LOG")  # CI shows it when a run fails
        if keep_log:
            shutil.copyfile(server.base / "server.log", keep_log)
        server.stop()


@pytest.fixture(scope="session")
def django_db_modify_db_settings(
    django_db_modify_db_settings_parallel_suffix: None, postgres_url: str
) -> None:
    from django.conf import settings

    settings.DATABASES["default"].update(database_settings(postgres_url))


@pytest.fixture(autouse=True)
def _limits_learnt_afresh() -> None:
    """Each test's claims learn which queues have a limit anew: what a process learnt is
    kept for its life, and a test's tables are not the last test's."""
    from django_pgjobs.managers.queues import forget_limits

    forget_limits()


@pytest.fixture(params=[True, False], ids=["notify", "poll-only"])
def notify(request: pytest.FixtureRequest, settings: Any) -> bool:
    """Run the test twice: with NOTIFY, and without (PGJOBS["NOTIFY"] = False, the
    PgBouncer setup: no enqueue notifies, workers poll). The `workers` a test starts
    are set the same way."""
    if not request.param:
        settings.PGJOBS = {**settings.PGJOBS, "NOTIFY": False}
    return bool(request.param)


@pytest.fixture
def workers(request: pytest.FixtureRequest) -> Iterator[object]:
    """Start `manage.py runjobs` processes; any left running are killed afterwards. In
    a test that takes `notify`, they notify and listen, or not, as it says."""
    from tests.spawn import Workers

    poll_only = "notify" in request.fixturenames and not request.getfixturevalue("notify")
    started = Workers(extra_env={"PGJOBS_NOTIFY": "0"} if poll_only else None)
    try:
        yield started
    finally:
        started.close()


@pytest.fixture
def spans() -> Iterator[Any]:
    """The spans that end during the test, kept in memory by the OpenTelemetry SDK (a
    tracer provider set once for the process; spans outside such a test are dropped)."""
    from tests.otel import capture

    recorder = capture()
    recorder.start()
    try:
        yield recorder
    finally:
        recorder.stop()


@pytest.fixture
def example_database() -> Iterator[str]:
    """A fresh database for the example project (its URL), dropped afterwards."""
    from tests.example import scratch_database

    with scratch_database() as url:
        yield url


@pytest.fixture
def proxy() -> Iterator[FreezableProxy]:
    """A TCP proxy in front of the test database that can freeze, as a hung server does
    (tests/proxy.py)."""
    from django.db import connection

    settings = connection.settings_dict
    with freezable_proxy(settings["HOST"] or "127.0.0.1", int(settings["PORT"] or 5432)) as p:
        yield p
