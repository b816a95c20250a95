"""Settings, system checks and the DATABASE_URL parser."""

from __future__ import annotations

import json
import re
from datetime import timedelta
from typing import Any

import pytest
from django.core.checks import run_checks
from django.core.exceptions import ImproperlyConfigured
from django.test import override_settings
from hypothesis import given, settings
from hypothesis import strategies as st

from django_pgjobs.conf import Settings, pgjobs_settings
from django_pgjobs.testing.localdb import database_settings
from tests.docs import docs_reference


def test_defaults_are_the_documented_ones() -> None:
    with override_settings(PGJOBS={}):
        options = pgjobs_settings.queue_options("anything")
    assert options.lease_s == 60 and options.max_attempts == 10
    assert (options.backoff_base_s, options.backoff_cap_s) == (10, 3600)
    assert options.expires_s is None and options.result_retention_s is None
    assert options.dead_retention_s == 30 * 86400 and options.priority == 0
    assert Settings.CHANNEL == "pgjobs" and Settings.NOTIFY is True
    assert Settings.CONCURRENCY == 10 and Settings.PREFETCH == 100


def test_queue_limits_come_from_the_queues_max_running() -> None:
    queues = {"a": {"MAX_RUNNING": 3}, "b": {"LEASE": 5}, "c": {"MAX_RUNNING": None}}
    with override_settings(PGJOBS={"QUEUES": queues}):
        pgjobs_settings.validate()
        assert pgjobs_settings.queue_limits() == {"a": 3}
        assert pgjobs_settings.queue_options("a").lease_s == 60


def test_settings_are_read_at_access_time() -> None:
    with override_settings(PGJOBS={"LEASE": timedelta(minutes=2), "QUEUES": {"q": {"LEASE": 5}}}):
        assert pgjobs_settings.queue_options("other").lease_s == 120
        assert pgjobs_settings.queue_options("q").lease_s == 5
    assert pgjobs_settings.queue_options("q").lease_s == 60


@pytest.mark.parametrize(
    ("pgjobs", "message"),
    [
        ({"LEASE": 0}, "LEASE"),
        ({"MAX_ATTEMPTS": 0}, "MAX_ATTEMPTS"),
        ({"BACKOFF_BASE": 10, "BACKOFF_CAP": 5}, "BACKOFF_CAP"),
        ({"PRIORITY": 300}, "PRIORITY"),
        ({"QUEUES": {"q": {"LAESE": 5}}}, "unknown keys"),
        ({"QUEUES": {"q": {"LEASE": "long"}}}, r"\['q'\]\['LEASE'\]"),
        ({"QUEUES": []}, "QUEUES"),
        ({"NOTIFY": "yes"}, "NOTIFY"),
        ({"CHANEL": "x"}, "unknown keys"),
        ({"DEAD_RETENTION": -1}, "DEAD_RETENTION"),
        ({"SWEEP_BATCH": 0}, "SWEEP_BATCH"),
        ({"QUEUES": {"q": {"MAX_RUNNING": 0}}}, "MAX_RUNNING"),
        ({"QUEUES": {"q": {"MAX_RUNNING": "4"}}}, "MAX_RUNNING"),
        ({"SCHEDULER": 1}, "SCHEDULER"),
        ({"LISTEN_DSN": ""}, "LISTEN_DSN"),
        ({"LISTEN_DSN": 5432}, "LISTEN_DSN"),
        ({"PREFETCH": -1}, "PREFETCH"),
        ({"PREFETCH": 2.5}, "PREFETCH"),
        ({"DEAD_PARTITION_SPAN": 0.5}, "DEAD_PARTITION_SPAN"),
        ({"DEAD_PARTITION_SPAN": 1.5}, "whole number of seconds"),
        ({"DEAD_PARTITION_SPAN": "daily"}, "DEAD_PARTITION_SPAN"),
    ],
)
def test_invalid_settings_fail_the_system_check(pgjobs: dict, message: str) -> None:
    with override_settings(PGJOBS=pgjobs):
        with pytest.raises(ImproperlyConfigured, match=message):
            pgjobs_settings.validate()
        errors = [e for e in run_checks() if e.id == "pgjobs.E002"]
    assert len(errors) == 1


@pytest.mark.filterwarnings("ignore:Overriding setting DATABASES")
def test_a_database_that_is_not_postgresql_fails_the_system_check() -> None:
    databases = {"default": {"ENGINE": "django.db.backends.sqlite3", "NAME": ":memory:"}}
    with override_settings(DATABASES=databases):
        from django_pgjobs.checks import check_database

        (error,) = check_database()
    assert error.id == "pgjobs.E001" and "PostgreSQL" in error.msg


def test_an_unknown_jobs_database_fails_the_system_check() -> None:
    from django_pgjobs.checks import check_database

    with override_settings(PGJOBS={"DATABASE": "jobs"}):
        (error,) = check_database()
    assert error.id == "pgjobs.E001" and "'jobs'" in error.msg


def test_the_suites_configuration_passes_every_check() -> None:
    assert [e for e in run_checks() if e.id.startswith("pgjobs.")] == []


def test_database_settings_from_url() -> None:
    parsed = database_settings("postgresql://us%40er:p%2Fw@db.example:6543/app?sslmode=require")
    assert parsed == {
        "ENGINE": "django.db.backends.postgresql",
        "NAME": "app",
        "USER": "us@er",
        "PASSWORD": "p/w",
        "HOST": "db.example",
        "PORT": "6543",
        "OPTIONS": {"sslmode": "require"},
    }
    assert database_settings("postgres://localhost")["NAME"] == "postgres"
    with pytest.raises(ValueError, match="postgresql://"):
        database_settings("mysql://localhost/db")


def test_database_settings_from_a_url_of_several_hosts_as_libpq_takes_them() -> None:
    parsed = database_settings(
        "postgresql://postgres@10.0.0.1:5433,[::1]:5434/jobs?target_session_attrs=read-write"
    )
    assert (parsed["HOST"], parsed["PORT"], parsed["USER"], parsed["NAME"]) == (
        "10.0.0.1,::1",
        "5433,5434",
        "postgres",
        "jobs",
    )
    assert parsed["OPTIONS"] == {"target_session_attrs": "read-write"}
    assert database_settings("postgresql://a,b/db")["HOST"] == "a,b"
    assert database_settings("postgresql://a,b/db")["PORT"] == ""
    with pytest.raises(ValueError, match="no number"):
        database_settings("postgresql://a:5432,b:x/db")


@pytest.mark.django_db
def test_a_runjobs_command_of_another_app_listed_first_is_reported() -> None:
    pytest.importorskip("django_extensions")
    from django.conf import settings
    from django.core.management import get_commands

    apps = ["django_extensions", *settings.INSTALLED_APPS]
    try:
        with override_settings(INSTALLED_APPS=apps):
            get_commands.cache_clear()  # type: ignore[attr-defined]
            from django_pgjobs.checks import check_commands

            (warning,) = check_commands()
    finally:
        get_commands.cache_clear()  # type: ignore[attr-defined]
    assert warning.id == "pgjobs.W001" and "runjobs (from django_extensions)" in warning.msg
    from django_pgjobs.checks import check_commands

    assert check_commands() == []


def _as_documented(value: Any) -> str:
    """A default as the settings reference writes it: strings as JSON, durations in
    seconds, anything else as Python writes it."""
    if isinstance(value, str):
        return json.dumps(value)
    if isinstance(value, timedelta):
        return repr(value.total_seconds())
    return repr(value)


def test_the_settings_reference_documents_every_setting_with_its_default() -> None:
    """The docs' settings page (generated by docs/_ext/pgjobs_reference) names every
    setting of conf.Settings, with its default and a description."""
    page = docs_reference("settings").settings_markdown()
    rows = re.findall(r"^\| `([A-Z_]+)` \| `([^`]*)`[^|]*\| (.*) \|$", page, re.MULTILINE)
    documented = {name: default for name, default, _ in rows}
    names = [name for name in vars(Settings) if name.isupper()]
    assert sorted(documented) == sorted(names)
    for name in names:
        assert documented[name] == _as_documented(getattr(Settings, name)), name
    assert all(description.strip() for _, _, description in rows)


@settings(max_examples=300, deadline=None)
@given(netloc=st.text(max_size=60), path=st.text(max_size=20))
def test_database_settings_of_any_url_is_settings_or_a_value_error(netloc: str, path: str) -> None:
    """A hostile DATABASE_URL: a DATABASES entry, or a ValueError saying what is wrong."""
    try:
        parsed = database_settings(f"postgresql://{netloc}/{path}")
    except ValueError:
        return
    assert set(parsed) == {"ENGINE", "NAME", "USER", "PASSWORD", "HOST", "PORT", "OPTIONS"}
    assert all(part.isdecimal() for part in parsed["PORT"].split(",") if part)


class TestQueueDatabases:
    """PGJOBS["QUEUE_DATABASES"] validated, and checked against DATABASES and schedules."""

    @pytest.mark.parametrize("bad", [["ingestion"], {"ingestion": ""}, {"": "jobs"}, {1: "x"}])
    def test_a_bad_mapping_is_refused(self, bad: object) -> None:
        from django.core.exceptions import ImproperlyConfigured

        from django_pgjobs.conf import pgjobs_settings

        with (
            override_settings(PGJOBS={"QUEUE_DATABASES": bad}),
            pytest.raises(ImproperlyConfigured, match="QUEUE_DATABASES"),
        ):
            pgjobs_settings.validate()

    def test_an_unknown_database_and_a_moved_schedule_are_errors(self) -> None:
        from django.core import checks

        routes = {"ingestion": "nowhere", "default": "default"}
        schedules = {"nightly": {"kind": "demo.t", "cron": "0 3 * * *", "queue": "ingestion"}}
        with override_settings(PGJOBS={"QUEUE_DATABASES": routes, "SCHEDULES": schedules}):
            found = [(m.id, m.msg) for m in checks.run_checks() if m.id.startswith("pgjobs.")]
        errors = [msg for found_id, msg in found if found_id == "pgjobs.E004"]
        assert any("'nowhere', which is not a key of DATABASES" in msg for msg in errors)
        assert any("Schedule 'nightly' enqueues to queue 'ingestion'" in msg for msg in errors)
        assert "ingestion -> nowhere" in dict(found)["pgjobs.I002"]

    def test_routes_send_queues_and_leave_the_rest(self) -> None:
        from django_pgjobs.conf import pgjobs_settings

        with override_settings(PGJOBS={"QUEUE_DATABASES": {"purge": "other"}}):
            assert pgjobs_settings.database_of("purge") == "other"
            assert pgjobs_settings.database_of("emails") == "default"
            assert pgjobs_settings.databases() == ["default", "other"]
