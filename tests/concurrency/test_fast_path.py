"""The worker's fast path keeps every rule: bookkeeping in a transaction of its own asks for
an asynchronous commit, and the plans a worker's connection makes once stay index-bound.
Inside a caller's transaction: unit/test_fast_path.py."""

from __future__ import annotations

import json
from typing import Any

import pytest
from django.db import connection
from django.test import override_settings

from django_pgjobs.db import sql
from django_pgjobs.models import Job, QueueControl
from tests.helpers import execute, other_connection, scalar

pytestmark = pytest.mark.django_db


@pytest.mark.django_db(transaction=True)
def test_bookkeeping_asks_for_an_asynchronous_commit_of_its_own_transaction() -> None:
    Job.objects.enqueue("demo.t")
    with other_connection(autocommit=True) as conn:
        # Whatever the server's default (a throwaway test cluster runs with it off).
        conn.execute("SET synchronous_commit = on")
        conn.autocommit = False
        params = {
            "queues": ["default"],
            "floors": [None],
            "tops": [None],
            "lease_floor": None,
            "worker_id": "w",
            "synchronous_commit": "off",
            "due": True,
            "only_kinds": None,
            "not_kinds": None,
        }
        rows = conn.execute(sql.claim_jobs(1), params).fetchall()
        assert rows[0][2] is not None
        assert conn.execute("SHOW synchronous_commit").fetchone() == ("off",)
        conn.rollback()
        assert conn.execute("SHOW synchronous_commit").fetchone() == ("on",)


@pytest.mark.django_db(transaction=True)
def test_async_bookkeeping_can_be_switched_off() -> None:
    Job.objects.enqueue("demo.t")
    with override_settings(PGJOBS={"ASYNC_BOOKKEEPING": False}):
        from django_pgjobs.db.connection import commit_mode

        assert commit_mode(None) == {"synchronous_commit": None}
        assert Job.objects.claim_one("default", "w").ack()


@pytest.mark.django_db(transaction=True)
def test_a_tuned_worker_connection_prepares_and_plans_once() -> None:
    Job.objects.enqueue_many([{"kind": "demo.t"}] * 20)
    Job.objects.tune_worker_connection()
    raw = connection.connection
    assert raw.prepare_threshold == 0
    assert scalar("SHOW plan_cache_mode") == "force_generic_plan"
    assert scalar("SHOW jit") == "off"
    for _ in range(4):
        Job.objects.ack_batch(Job.objects.claim_batch("default", 5, "w"))
    prepared = [r[0] for r in execute("SELECT statement FROM pg_prepared_statements")]
    assert any("Claim up to 5 pending jobs" in text for text in prepared)
    assert any("Complete claimed jobs" in text for text in prepared)
    connection.close()  # a fresh connection is tuned again on its next use


@pytest.mark.django_db(transaction=True)
def test_prepare_off_leaves_the_connection_alone() -> None:
    connection.ensure_connection()
    with override_settings(PGJOBS={"PREPARE": False}):
        Job.objects.tune_worker_connection()
        assert connection.connection.prepare_threshold is None
        assert scalar("SHOW plan_cache_mode") == "auto"


@pytest.mark.django_db(transaction=True)
def test_the_generic_claim_plan_walks_indexes_and_never_compiles() -> None:
    """Planned once for any backlog: no sequential scan, no JIT, primary-key updates."""
    execute(
        """
        INSERT INTO pgjobs_job (queue, kind, state, priority, run_after, attempts,
                                max_attempts, lease_s, payload, errors, created_at)
        SELECT 'default', 'bulk', 'pending', g % 2,
               now() + CASE WHEN g % 3 = 0 THEN interval '1 day' ELSE interval '0' END,
               0, 5, 60, '{}', '[]', now()
        FROM generate_series(1, 60000) AS g
        """
    )
    execute("ANALYZE pgjobs_job")
    statement = sql.claim_jobs(32)
    names = (
        "queues",
        "worker_id",
        "synchronous_commit",
        "due",
        "only_kinds",
        "not_kinds",
        "floors",
        "tops",
        "lease_floor",
    )
    for index, name in enumerate(names, start=1):
        statement = statement.replace(f"%({name})s", f"${index}")
    with other_connection() as conn:
        conn.execute(sql.TUNE_WORKER_SESSION)
        conn.execute(
            "PREPARE claim(text[], text, text, boolean, text[], text[], timestamptz[], int[],"
            f" timestamptz) AS {statement}"
        )
        conn.execute("BEGIN")
        (plan,) = conn.execute(
            "EXPLAIN (ANALYZE, FORMAT JSON) "
            "EXECUTE claim('{default}', 'w', 'off', true, NULL, NULL, '{NULL}', '{NULL}', NULL)"
        ).fetchone()
        conn.execute("ROLLBACK")
    text = json.dumps(plan)
    # pgjobs_queue holds a row per paused or limited queue: a handful, read whole.
    assert set(scanned_whole(plan[0]["Plan"])) <= {QueueControl._meta.db_table}
    assert '"JIT"' not in text
    # The claimed rows are updated by primary-key probes, never by a walk of the index.
    assert any("Index Cond" in node for node in scans_of(plan[0]["Plan"], "pgjobs_job_pkey"))
    assert plan[0]["Plan"]["Actual Rows"] == 32


def scans_of(node: dict[str, Any], index: str) -> list[dict[str, Any]]:
    """The plan's scans of `index`."""
    found = [node] if node.get("Index Name") == index else []
    for child in node.get("Plans", []):
        found += scans_of(child, index)
    return found


def scanned_whole(node: dict[str, Any]) -> list[str]:
    """The tables a plan reads with a sequential scan."""
    found = [node["Relation Name"]] if node["Node Type"] == "Seq Scan" else []
    for child in node.get("Plans", []):
        found += scanned_whole(child)
    return found
