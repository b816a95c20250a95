"""The example project, end to end, in a database of its own: sessions (keyed jobs),
ingestion (lease mode, fenced results), purge (transaction mode, bounded batches), replay
(debounced watermarks), a reindex (a batch, then one callback), and `manage.py demo`."""

from __future__ import annotations

import psycopg
import pytest

from tests.example import manage

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]

SEED = """
from example_project.agent_sessions.services import close_session, open_session
from example_project.ingestion.services import add_document, reindex_collection
from example_project.purge.services import log_events, schedule_purge
from example_project.replay.services import write

sessions = [open_session(f"s{n}") for n in range(3)]
close_session(sessions[0].id)
for n in range(3):
    add_document("handbook", f"page {n}", "words " * (n + 1))
for n in range(4):
    add_document("faq", f"question {n}", "answer " * (n + 1))
reindex_collection("faq")
log_events(25, age_days=40)
log_events(5)
schedule_purge(batch=7)
for n in range(10):
    write(1, "memory", f"entry {n}", debounce_s=0)
"""


def test_example_project_flows_with_a_real_worker(example_database: str) -> None:
    manage(example_database, "migrate", "--verbosity", "0")
    manage(example_database, "check", "--fail-level", "WARNING")
    manage(example_database, "shell", "-c", SEED)
    manage(example_database, "runjobs", "--burst", "--no-status", "--concurrency", "3")
    with psycopg.connect(example_database) as conn:
        sessions = conn.execute(
            "SELECT name, status, provisioned_at IS NOT NULL FROM agent_sessions_agentsession "
            "ORDER BY id"
        ).fetchall()
        documents = conn.execute(
            "SELECT dirty, summary, ingested_by_claim IS NOT NULL FROM ingestion_document"
        ).fetchall()
        indexes = conn.execute(
            "SELECT name, indexed_at IS NOT NULL, indexed_documents, index_failures"
            " FROM ingestion_collection ORDER BY name"
        ).fetchall()
        batches = conn.execute("SELECT state, members, done FROM pgjobs_batch").fetchall()
        events = conn.execute("SELECT count(*) FROM purge_event").fetchone()
        watermark = conn.execute(
            "SELECT replayed_to, replays FROM replay_watermark WHERE session_id = 1"
        ).fetchone()
        newest = conn.execute("SELECT max(id) FROM replay_entry").fetchone()
        live = conn.execute("SELECT count(*) FROM pgjobs_job").fetchone()
        dead = conn.execute("SELECT count(*) FROM pgjobs_dead").fetchone()
    assert sessions == [("s1", "ready", True), ("s2", "ready", True)]  # s0 deleted by its job
    assert len(documents) == 3 + 4
    # the faq's reindex: four summaries, then its index built once, from the batch's tally
    assert indexes == [("faq", True, 4, 0), ("handbook", False, 0, 0)]
    assert batches == [("succeeded", 4, 4)]
    assert all(
        not dirty and "fingerprint" in summary and fenced for dirty, summary, fenced in documents
    )
    assert events == (5,)  # the 25 old ones purged in batches of 7, the 5 new ones kept
    assert watermark[0] == newest[0]
    assert watermark[1] <= 2  # ten writes, debounced into one replay (two if one ran early)
    assert (live, dead) == ((0,), (0,))


def test_demo_runs_on_a_fresh_database_and_exits_zero(example_database: str) -> None:
    output = manage(example_database, "demo", "--timeout", "90")
    assert "Created the admin user 'admin'" in output
    assert "== Summary" in output
    assert "dead letters" in output and "card declined" in output
    assert "runbooks's index: built once, after its batch of 4 summaries (0 failed)" in output
    with psycopg.connect(example_database) as conn:
        live = conn.execute("SELECT count(*) FROM pgjobs_job WHERE state <> 'done'").fetchone()
        dead = conn.execute("SELECT count(*) FROM pgjobs_dead").fetchone()
    assert live == (0,)
    assert dead == (4,)
