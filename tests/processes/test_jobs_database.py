"""A dedicated jobs database: PGJOBS["DATABASE"] names it, the router keeps the tables
there, and workers, the admin's queries and migrate follow. Runs in subprocesses with
settings of their own (tests/settings_two_databases.py)."""

from __future__ import annotations

import psycopg
import pytest
from django.conf import settings
from django.core import checks
from django.test import override_settings

from tests.example import scratch_database
from tests.spawn import manage_py, suite_env

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]

ENQUEUE = """
from django.db import transaction
from django_pgjobs.models import Job
from tests import jobs

with transaction.atomic(using="jobs"):
    jobs.record.enqueue(label="kept")
with transaction.atomic(using="jobs"):
    jobs.record.enqueue(label="rolled back")
    transaction.set_rollback(True, using="jobs")
Job.objects.enqueue("tests.record", {"label": "explicit"}, using="jobs")
print("routed", Job.objects.count(), Job.objects.db)
"""


def run(app_url: str, jobs_url: str, *args: str) -> str:
    env = suite_env(
        "tests.settings_two_databases", DATABASE_URL=app_url, JOBS_DATABASE_URL=jobs_url
    )
    return manage_py(env, *args)


def tables(url: str) -> set[str]:
    with psycopg.connect(url) as conn:
        rows = conn.execute("SELECT tablename FROM pg_tables WHERE tablename LIKE 'pgjobs%'")
        return {name for (name,) in rows}


def test_jobs_live_and_run_in_their_own_database() -> None:
    with scratch_database() as app_url, scratch_database() as jobs_url:
        run(app_url, jobs_url, "migrate", "--run-syncdb", "--database", "default")
        run(app_url, jobs_url, "migrate", "--run-syncdb", "--database", "jobs")
        assert tables(app_url) == set()  # the router kept them off the app's database
        assert {"pgjobs_job", "pgjobs_dead", "pgjobs_schedule"} <= tables(jobs_url)
        assert "routed 2 jobs" in run(app_url, jobs_url, "shell", "-c", ENQUEUE)
        run(app_url, jobs_url, "runjobs", "--burst", "--no-status")
        with psycopg.connect(app_url) as conn:
            notes = {text for (text,) in conn.execute("SELECT text FROM tests_note")}
        assert notes == {"kept", "explicit"}  # the handler wrote to the app's database
        with psycopg.connect(jobs_url) as conn:
            assert conn.execute("SELECT count(*) FROM pgjobs_job").fetchone() == (0,)
        run(app_url, jobs_url, "check", "--fail-level", "WARNING")


@pytest.mark.filterwarnings("ignore:Overriding setting DATABASES")
def test_a_jobs_database_without_the_router_is_a_warning() -> None:
    databases = {**settings.DATABASES, "jobs": settings.DATABASES["default"]}
    with override_settings(DATABASES=databases, PGJOBS={"DATABASE": "jobs"}):
        warnings = [m for m in checks.run_checks() if m.id == "pgjobs.W002"]
        assert len(warnings) == 1 and "JobsRouter" in (warnings[0].hint or "")
        with override_settings(DATABASE_ROUTERS=["django_pgjobs.routers.JobsRouter"]):
            assert not [m for m in checks.run_checks() if m.id == "pgjobs.W002"]
