"""The example project, end to end, in a database of its own: sessions (keyed jobs),
ingestion (lease mode, fenced results), purge (transaction mode, bounded batches), replay
(debounced watermarks), a reindex (a batch, then one callback), and `manage.py demo`."""

from __future__ import annotations

import re
import subprocess
import sys

import psycopg
import pytest

from tests.example import example_env, manage
from tests.spawn import ROOT

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


def run_demo(url: str) -> tuple[str, str]:
    """Run `manage.py demo` on the example's database; return its stdout and stderr (the
    progress lines)."""
    result = subprocess.run(
        [sys.executable, "manage.py", "demo", "--timeout", "90"],
        cwd=ROOT,
        env=example_env(url),
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    return result.stdout, result.stderr


def test_the_demo_runs_on_a_fresh_database_and_its_numbers_agree_with_the_database(
    example_database: str,
) -> None:
    """It exits 0, and every number it prints counts one thing. The jobs it enqueues add
    up wherever it counts them (enqueued = runnable + scheduled + waiting; ended = done +
    dead letters, out of the same total from the first progress line to the last;
    enqueued = done + dead letters + left in the summary), and what the database holds
    says the same: the dead letters and their ids, nothing left to run, the retries and
    dead-lettering runs the worker counted, the queues, the schedules."""
    output, progress = run_demo(example_database)
    assert "Created the admin user 'admin'" in output
    assert "card declined" in output
    assert "runbooks's index: built once, after its batch of 4 summaries (0 failed)" in output
    enqueued, queues, runnable, scheduled, waiting = map(
        int,
        re.search(
            r"^(\d+) jobs enqueued in (\d+) queues: (\d+) runnable now, (\d+) scheduled a "
            r"few seconds ahead, (\d+) waiting for other jobs$",
            output,
            re.M,
        ).groups(),
    )
    assert enqueued == runnable + scheduled + waiting > 0
    lines = re.findall(
        r"\] (\d+)/(\d+) jobs ended: (\d+) done, (\d+) dead letters; (\d+) retries", progress
    )
    bars = [tuple(map(int, line)) for line in lines]
    assert bars and all(
        total == enqueued and ended == done + dead for ended, total, done, dead, _ in bars
    )
    summary = {
        name: int(value)
        for name, value in re.findall(
            r"^  (jobs enqueued|done|dead letters|left to run|retries|schedules) +(\d+)",
            output,
            re.M,
        )
    }
    assert summary["jobs enqueued"] == enqueued
    assert summary["done"] + summary["dead letters"] + summary["left to run"] == enqueued
    assert bars[-1] == (
        enqueued,
        enqueued,
        summary["done"],
        summary["dead letters"],
        summary["retries"],
    )
    listed = [int(id_) for id_ in re.findall(r"^  dead: #(\d+) ", output, re.M)]
    with psycopg.connect(example_database) as conn:
        dead_ids = [row[0] for row in conn.execute("SELECT id FROM pgjobs_dead ORDER BY id")]
        left = conn.execute("SELECT count(*) FROM pgjobs_job WHERE state <> 'done'").fetchone()
        runs = conn.execute(
            "SELECT sum(retried), sum(dead), count(DISTINCT queue) FROM pgjobs_stats"
        ).fetchone()
        schedules = conn.execute("SELECT count(*) FROM pgjobs_schedule WHERE enabled").fetchone()
    assert listed == dead_ids and len(dead_ids) == summary["dead letters"]
    assert len(dead_ids) == 4  # two cards declined, two shards broken past their attempts
    assert left == (summary["left to run"],) == (0,)
    assert runs == (summary["retries"], summary["dead letters"], queues)
    assert schedules == (summary["schedules"],)
