"""The example project, end to end, in its own database: lease mode with a fenced result
(ingestion) and transaction mode purging in bounded batches (purge)."""

from __future__ import annotations

import subprocess
import sys
import uuid
from collections.abc import Iterator

import psycopg
import pytest

from tests.helpers import conninfo, other_connection
from tests.processes import ROOT

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]

SEED = """
from datetime import timedelta
from django.db.models.functions import Now
from example_project.ingestion.jobs import ingest_document
from example_project.ingestion.models import Document
from example_project.purge.jobs import purge_old_events
from example_project.purge.models import Event

for i in range(3):
    document = Document.objects.create(title=f"doc {i}", text="words " * (i + 1))
    ingest_document.enqueue(document_id=document.id)
Event.objects.bulk_create([Event(name=f"e{i}") for i in range(25)])
Event.objects.filter(name__in=[f"e{i}" for i in range(20)]).update(
    created_at=Now() - timedelta(days=40)
)
purge_old_events.enqueue(older_than_days=30, batch=7)
"""


@pytest.fixture
def example_database() -> Iterator[str]:
    name = f"pgjobs_example_{uuid.uuid4().hex[:8]}"
    with other_connection() as admin:
        admin.execute(f'CREATE DATABASE "{name}"')
    params = {**conninfo(), "dbname": name}
    user = params.get("user", "")
    password = f":{params['password']}" if "password" in params else ""
    port = f":{params['port']}" if "port" in params else ""
    url = f"postgresql://{user}{password}@{params.get('host', '127.0.0.1')}{port}/{name}"
    try:
        yield url
    finally:
        with other_connection() as admin:
            admin.execute(f'DROP DATABASE "{name}" WITH (FORCE)')


def manage(url: str, *args: str) -> str:
    result = subprocess.run(
        [sys.executable, "manage.py", *args],
        cwd=ROOT,
        env={"PATH": "/usr/bin:/bin", "DATABASE_URL": url, "DJANGO_DEBUG": "0"},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    return result.stdout


def test_example_project_runs_both_modes_with_a_real_worker(example_database: str) -> None:
    manage(example_database, "migrate", "--verbosity", "0")
    manage(example_database, "check", "--fail-level", "WARNING")
    manage(example_database, "shell", "-c", SEED)
    manage(example_database, "runjobs", "--burst", "--no-status", "--concurrency", "3")
    with psycopg.connect(example_database) as conn:
        documents = conn.execute(
            "SELECT summary, ingested_by_claim IS NOT NULL FROM ingestion_document"
        ).fetchall()
        events = conn.execute("SELECT name FROM purge_event ORDER BY id").fetchall()
        live = conn.execute("SELECT count(*) FROM pgjobs_job").fetchone()
        dead = conn.execute("SELECT count(*) FROM pgjobs_dead").fetchone()
    assert len(documents) == 3
    assert all(
        summary.endswith(tuple("0123456789abcdef")) and fenced for summary, fenced in documents
    )
    assert [name for (name,) in events] == [f"e{i}" for i in range(20, 25)]
    assert (live, dead) == ((0,), (0,))
