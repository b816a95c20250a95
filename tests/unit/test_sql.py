"""Every statement in sql.py runs against the real schema and names its real tables."""

from __future__ import annotations

import re
import uuid
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from django.db import connection, transaction
from psycopg import sql as pgsql

from django_pgjobs.db import sql
from django_pgjobs.models import (
    Batch,
    BatchCallback,
    CancelRequest,
    DeadJob,
    Dependency,
    Job,
    JobStats,
    JobStatsHour,
    KindStats,
    KindStatsHour,
    QueueControl,
    RateClaim,
    Schedule,
    Worker,
)
from tests.helpers import reads_index

pytestmark = pytest.mark.django_db

TOKEN = uuid.uuid4()
# A cron tick (computed by the caller from the database's clock, never from Python's).
TICK = datetime(2026, 1, 1, 3, 0, tzinfo=UTC)
WAKE = {"channel": "pgjobs", "notify": True}
#: What a statement that writes jobs takes beside WAKE: the trace context they keep.
TRACE = {"trace": '{"traceparent": "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"}'}
ONE_JOB = {
    "queue": "default",
    "kind": "demo.t",
    "key": None,
    "payload": "{}",
    "priority": 0,
    "delay_s": None,
    "run_after": None,
    "max_attempts": 3,
    "lease_s": 30,
    "expires_s": None,
    "result_ttl_s": None,
    "timeout_s": None,
    "limit_key": None,
    "concurrency_limit": None,
    "rate_limit": None,
    "rate_period_s": None,
    "on_conflict": "replace",
}
# A listing's filters of dead letters: a kind prefix (LIKE), a queue, a category.
DEAD_FILTERS = {
    "kind_pattern": "demo.%",
    "queue": "default",
    "category": "dependency",
    "dependency_prefix": "dependency failed: ",
}
SAMPLE_PARAMS: dict[str, dict[str, Any]] = {
    "ENQUEUE_JOB": {**ONE_JOB, **WAKE, **TRACE},
    "INSERT_JOB": {**ONE_JOB, **WAKE, **TRACE},
    "ENQUEUE_JOBS": {
        "jobs": '[["default", "demo.t", 0, null, null, 3, 30, null, null, 5.0, 2, 10, 60.0,'
        ' "tenant:1", "k", {}]]',
        "on_conflict": "replace",
        **WAKE,
        **TRACE,
    },
    "ENQUEUE_KEYLESS_JOBS": {
        "jobs": '[["default", "demo.t", 0, null, null, 3, 30, null, null, null, null, null,'
        " null, null, null, {}]]",
        **WAKE,
        **TRACE,
    },
    "CLAIM_JOBS": {
        "synchronous_commit": "off",
        "queues": ["default"],
        "floors": [None],
        "tops": [0],
        "lease_floor": None,
        "limit": 5,
        "worker_id": "w",
        "due": True,
        "only_kinds": None,
        "not_kinds": ["tests.async_sleep"],
    },
    "ACK_JOBS": {
        "synchronous_commit": "off",
        "ids": [1],
        "tokens": [TOKEN],
        "results": [None],
        **WAKE,
    },
    "RETRY_JOBS": {
        "synchronous_commit": "off",
        "ids": [1],
        "tokens": [TOKEN],
        "errors": ["e"],
        "tracebacks": [None],
        "exceptions": [None],
        "delays_s": [1.0],
        "categories": ["max_attempts"],
        "errors_kept": 10,
        **WAKE,
    },
    "FAIL_JOBS": {
        "synchronous_commit": "off",
        "ids": [1],
        "tokens": [TOKEN],
        "errors": ["e"],
        "tracebacks": [None],
        "exceptions": [None],
        "categories": ["failed"],
        "errors_kept": 10,
        **WAKE,
    },
    "RELEASE_JOBS": {"synchronous_commit": "off", "ids": [1], "tokens": [TOKEN], **WAKE},
    "HEARTBEAT_JOBS": {
        "synchronous_commit": "off",
        "ids": [1],
        "tokens": [TOKEN],
        "extends_s": [10.0],
    },
    "HEARTBEAT_UNLOCKED_JOBS": {
        "synchronous_commit": "off",
        "ids": [1],
        "tokens": [TOKEN],
        "extends_s": [10.0],
        "progress": ['{"fraction": 0.5, "message": null, "data": {}}'],
    },
    "RECORD_PROGRESS": {"id": 1, "token": TOKEN, "progress": '{"fraction": 1}'},
    "TIME_OUT_JOBS": {
        "synchronous_commit": "off",
        "ids": [1],
        "tokens": [TOKEN],
        "errors": ["timed out after 1 s"],
        "tracebacks": [None],
        "exceptions": [None],
        "delays_s": [1.0],
        "categories": ["max_attempts"],
        "errors_kept": 10,
        **WAKE,
    },
    "LOCK_KEYS": {
        "queues": ["default", "other"],
        "keys": 64,
        "afters": ["", "k"],
        "only_kinds": None,
        "not_kinds": ["tests.async_sleep"],
    },
    "CLAIM_KEYED_JOBS": {
        "lease_floor": None,
        "synchronous_commit": None,
        "queues": ["default"],
        "pair_queues": ["default"],
        "pair_keys": ["tenant:1"],
        "limited": ["default"],
        "limit": 5,
        "worker_id": "w",
        "due": False,
        "only_kinds": None,
        "not_kinds": ["tests.async_sleep"],
    },
    "PRUNE_RATE_CLAIMS": {"limit": 10},
    "PRUNE_CANCEL_REQUESTS": {"limit": 10},
    "REQUESTED_IN_LINE": {"limit": 10},
    "LIMIT_STATEMENT_TIME": {"timeout": "1500ms"},
    "CANCEL_STATEMENT": {"pid": 0, "xact": "0"},
    "END_BACKEND": {"pid": 0, "xact": "0"},
    "PLAN_KEYED_CLAIM": {},
    "RUNNING_JOBS": {"queues": ["default"], "limit": 50},
    "RUNNING_JOBS_OF_WORKERS": {"workers": ["w1"], "per_worker": 5},
    "LOCK_CURRENT_CLAIM": {"id": 1, "token": TOKEN},
    "CANCEL_JOB": {"ids": [1], "reason": "cancelled", **WAKE},
    "REQUEUE_DEAD_JOB": {"id": 1, **WAKE},
    "NEXT_DUE_IN": {"queues": ["default"], "lease_floor": None},
    # Floors are the database's own readings, handed back to it (S22).
    "CLAIM_FLOORS": {"queues": ["default", "other"], "floors": [None, None], "lease_floor": None},
    "JOB_TABLE_UPKEEP": {},
    "VACUUM_JOB_TABLE": {},
    "ANALYZE_JOB_TABLE": {},
    "JOB_TABLE_PAGES": {},
    "SWEEP_EXPIRED": {"limit": 10, "errors_kept": 10, **WAKE},
    "RESCUE_LAPSED_JOBS": {"queues": None, "limit": 10, "errors_kept": 10, **WAKE},
    "PRUNE_DONE": {"limit": 10},
    "PRUNE_DEAD_IN_QUEUES": {"queues": ["default"], "retention_s": 60.0, "limit": 10},
    "PRUNE_DEAD_OUTSIDE_QUEUES": {"queues": ["default"], "retention_s": 60.0, "limit": 10},
    "PRUNE_STRAY_DEAD_IN_QUEUES": {"queues": ["default"], "retention_s": 60.0, "limit": 10},
    "PRUNE_STRAY_DEAD_OUTSIDE_QUEUES": {
        "queues": ["default"],
        "retention_s": 60.0,
        "limit": 10,
    },
    "PARTITION_FUNCTIONS": {},
    "MAKE_DEAD_PARTITIONS": {"span_s": 86400.0, "ahead": 2, "lock_timeout": "1s"},
    "DROP_DEAD_PARTITIONS": {"horizon_s": 86400.0 * 400, "lock_timeout": "1s"},
    "DEAD_PARTITIONS": {},
    "SWEEP_LOCK": {"lock_id": 1},
    "LISTEN_CHANNEL": {},
    "TUNE_WORKER_SESSION": {},
    "TUNE_WORKER_TRANSACTION": {},
    "HOLD_XID": {},
    "READ_JOBS_IN_SNAPSHOT": {},
    "COUNT_JOBS": {},
    "RUN_JOBS_NOW": {"ids": [1], **WAKE},
    "DELETE_DEAD_JOBS": {"ids": [1]},
    "FILE_DEAD_LETTERS": {"after": 0, "limit": 10},
    "DEAD_LETTERS": {**DEAD_FILTERS, "limit": 10},
    "DEAD_LETTER_IDS": {**DEAD_FILTERS, "after": 0, "died_by": TICK, "limit": 10},
    "FIRST_EDGES_OF_JOB": {"id": 1, "limit": 20},
    "EDGE_COUNTS_OF_JOB": {"id": 1, "cap": 1000},
    "READ_JOBS": {"ids": [1, 2]},
    "CANCEL_JOBS": {"ids": [1], "reason": "cancelled", **WAKE},
    "LIVE_QUEUE_NAMES": {},
    "DEAD_QUEUE_NAMES": {},
    "QUEUE_OVERVIEW": {"queues": ["default"], "cap": 100},
    "ESTIMATE_RUNNABLE": {"queue": "default"},
    "ESTIMATE_SCHEDULED": {"queue": "default"},
    "ESTIMATE_DEAD": {"queue": "default"},
    "ESTIMATE_DEAD_QUEUES": {"queues": ["default", "q1"]},
    "ESTIMATE_RETRYING": {"queue": "default"},
    "ESTIMATE_RUNNING": {"queue": "default"},
    "ESTIMATE_DONE": {"queue": "default"},
    "HEARTBEAT_WORKER": {
        "id": "host:1:abc",
        "host": "host",
        "pid": 1,
        "queues": '["default"]',
        "concurrency": 4,
        "version": "1.0",
        "heartbeat_s": 5.0,
        "running": 0,
        "succeeded": 0,
        "failed": 0,
        "abandoned": 0,
        "claims_from_floors": False,
    },
    "STOP_WORKER": {"id": "host:1:abc", "succeeded": 1, "failed": 0},
    "LIST_WORKERS": {},
    "WORKER_STATUS": {"id": "vm:1:abc"},
    "ASK_WORKERS": {"ids": ["vm:1:abc"], "asked": "quiet", "by": "alice"},
    "PAUSE_ON_WORKERS": {"ids": ["vm:1:abc"], "queue": "mail", "paused": True, "by": "alice"},
    "PRUNE_WORKERS": {"limit": 10},
    "RECORD_STATS": {
        "queues": ["default"],
        "succeeded": [1],
        "retried": [0],
        "dead": [0],
        "cancelled": [0],
    },
    "THROUGHPUT": {"buckets": 5, "bucket_min": 15, "queue": None},
    "THROUGHPUT_HOURS": {"hours": 168, "queue": "default"},
    "SUM_STATS_HOURS": {},
    "SUM_KIND_STATS_HOURS": {},
    "PRUNE_STATS_HOURS": {"limit": 10, "hours": 192},
    "PRUNE_KIND_STATS_HOURS": {"limit": 10, "hours": 192},
    "SPAN_START": {"minutes": 1440, "hours": True},
    "PRUNE_STATS": {"limit": 10},
    "RECORD_KIND_STATS": {
        "kinds": '[{"queue": "q", "kind": "k", "runs": 1, "wait": [1, 0], "run": [0, 1]}]',
    },
    "KIND_STATS_HOURS": {
        "since": datetime(2026, 12, 6, tzinfo=UTC),
        "until": datetime(2026, 12, 6, 1, tzinfo=UTC),
        "queue": None,
        "kind": "k",
    },
    "KIND_STATS_MINUTES": {
        "minutes_from": datetime(2026, 12, 6, 1, tzinfo=UTC),
        "queue": "q",
        "kind": None,
    },
    "PRUNE_KIND_STATS": {"limit": 10},
    "ROLE_PRIVILEGES": {},
    "BUSY_JOBS": {"queues": ["default"]},
    "DATABASE_CLOCK": {},
    "TERMINATE_BACKENDS": {"application_name": "pgjobs-test-nobody", "limit": 1},
    "APPLIED_MIGRATIONS": {"app": "django_pgjobs"},
    "LOCK_LIMITED_QUEUES": {"queues": ["default"]},
    "CLAIM_LIMITED_JOBS": {
        "lease_floor": None,
        "synchronous_commit": None,
        "queues": ["default"],
        "limited": ["default"],
        "limit": 5,
        "worker_id": "w",
        "due": False,
        "only_kinds": None,
        "not_kinds": ["tests.async_sleep"],
    },
    "LIMITED_QUEUES": {},
    "PAUSE_QUEUES": {"queues": ["default"]},
    "RESUME_QUEUES": {"queues": ["default"], **WAKE},
    "SET_QUEUE_LIMIT": {"queue": "default", "max_running": 2, "from_settings": False, **WAKE},
    "QUEUES_HOLDING_ANYTHING": {"queues": ["default", "emails"]},
    "LIFT_SETTINGS_LIMITS": {"queues": ["default"]},
    "SET_QUEUE_RATE": {"queue": "default", "rate_limit": 10, "rate_period_s": 60.0, **WAKE},
    "DUE_SCHEDULES": {"limit": 10},
    "ADVANCE_SCHEDULE": {
        "name": "s",
        "seen": TICK,
        "next_run_at": TICK + timedelta(minutes=1),
        "last_tick": TICK,
        "ticks": 1,
    },
    "RECORD_SCHEDULE_JOB": {"name": "s", "job_id": 1},
    "NEXT_SCHEDULE_IN": {},
    "UPSERT_SCHEDULE": {
        "name": "s",
        "kind": "demo.t",
        "cron": "* * * * *",
        "timezone": "UTC",
        "payload": "{}",
        "options": "{}",
        "on_missed": "skip",
        "backfill_limit": 10,
        "next_run_at": TICK,
    },
    "LIMIT_LOCK_WAIT": {"timeout": "2000ms"},
    "RETIRE_SCHEDULES": {"names": ["s"]},
    "PROBE_LISTENER": {"channel": "pgjobs", "token": "pgjobs-probe:x"},
    "UNLISTEN_ALL": {},
    "END_PARENTS_FUNCTION": {},
    "END_PARENTS_FUNCTION_0006": {},
    "EDGES_FILLFACTOR": {},
    "RESET_EDGES_FILLFACTOR": {},
    "DROP_END_PARENTS_FUNCTION": {},
    "LOCK_PARENTS": {"parents": [1, 2]},
    "LOCK_FREE_PARENTS": {"parents": [1, 2]},
    "WAIT_FOR_PARENT": {"id": 1},
    "PARENT_STANDING": {"parents": [1, 2]},
    "ENQUEUE_DEPENDENT_JOBS": {
        "jobs": '[["default", "demo.t", 0, null, null, 3, 30, null, null, null, null, null,'
        " null, null, null, {}], "
        '["default", "demo.t", 0, null, null, 3, 30, null, null, null, null, null,'
        " null, null, null, {}]]",
        "edges": '[[2, null, 1, "cancel", "open"], [2, 999999999, null, "run", "done"]]',
        **WAKE,
        **TRACE,
    },
    "REVIVE_DEPENDENTS": {"id": 1},
    "LOCK_LOST_EDGES": {"id": 1},
    "PARENT_RESULTS": {"id": 1},
    "JOB_DEPENDENCIES": {"id": 1},
    "WRITE_BATCH": {
        "jobs": '[["default", "demo.t", 0, null, null, 3, 30, null, null, null, null, null,'
        " null, null, null, {}], "
        '["default", "demo.t", 0, null, null, 3, 30, null, null, null, null, null,'
        " null, null, null, {}]]",
        "members": 1,
        "fires_on": ["complete"],
        **WAKE,
        **TRACE,
    },
    "LOCK_BATCH_CALLBACKS": {"batch": 1},
    "ADD_BATCH_MEMBERS": {
        "batch": 1,
        "callbacks": [1, 2],
        "jobs": '[["default", "demo.t", 0, null, null, 3, 30, null, null, null, null, null,'
        " null, null, null, {}]]",
        **WAKE,
        **TRACE,
    },
    "SEAL_BATCH": {"batch": 1},
    "END_BATCH_SEAL": {"batch": 1, **WAKE},
    "BATCH_MEMBERS": {"batch": 1, "after": 0, "limit": 50},
    "BATCH": {"batch": 1},
    "BATCH_OF_JOB": {"id": 1},
    "PRUNE_BATCHES": {"older_than_s": 60.0, "limit": 10},
}
# Statements formatted with identifiers (psycopg.sql) before they run.
IDENTIFIERS = {"LISTEN_CHANNEL": {"channel": "pgjobs"}}


TABLELESS = {
    "ESTIMATE_DEAD_QUEUES",  # the catalog's statistics of pgjobs_dead's partitions
    "MAKE_DEAD_PARTITIONS",  # the functions of PARTITION_FUNCTIONS name the tables
    "DROP_DEAD_PARTITIONS",
    "DEAD_PARTITIONS",  # the catalog's partitions of pgjobs_dead
    "ROLE_PRIVILEGES",
    "SWEEP_LOCK",
    "LISTEN_CHANNEL",
    "TUNE_WORKER_SESSION",
    "TUNE_WORKER_TRANSACTION",
    "HOLD_XID",
    "READ_JOBS_IN_SNAPSHOT",
    "DATABASE_CLOCK",
    "LIMIT_LOCK_WAIT",
    "LIMIT_STATEMENT_TIME",
    "CANCEL_STATEMENT",
    "END_BACKEND",
    "PLAN_KEYED_CLAIM",
    "TERMINATE_BACKENDS",
    "APPLIED_MIGRATIONS",  # Django's django_migrations
    "PROBE_LISTENER",
    "UNLISTEN_ALL",
    "DROP_END_PARENTS_FUNCTION",
    "END_BATCH_SEAL",
    "JOB_TABLE_UPKEEP",  # the statistics' views, of the job table by its name
    "JOB_TABLE_PAGES",  # the catalog's row of the job table, by its name
}
#: Statements that cannot run inside the test's transaction: a utility statement
#: (TableCare's tests run it), and the first statement of a transaction (the chaos run's
#: reader, tests/processes/test_chaos.py).
UTILITY = {"VACUUM_JOB_TABLE", "ANALYZE_JOB_TABLE", "READ_JOBS_IN_SNAPSHOT"}


def test_every_statement_has_sample_parameters() -> None:
    assert set(sql.STATEMENTS) == set(SAMPLE_PARAMS)


@pytest.mark.parametrize("name", sorted(SAMPLE_PARAMS))
def test_statement_runs_against_the_schema(name: str) -> None:
    statement = sql.STATEMENTS[name]
    used = set(re.findall(r"%\((\w+)\)s", statement))
    assert used <= set(SAMPLE_PARAMS[name])
    if name in UTILITY:
        return
    with transaction.atomic(), connection.cursor() as cursor:
        if name in IDENTIFIERS:
            identifiers = {key: pgsql.Identifier(v) for key, v in IDENTIFIERS[name].items()}
            statement = pgsql.SQL(statement).format(**identifiers).as_string(cursor.connection)
        cursor.execute(statement, SAMPLE_PARAMS[name] or None)
        transaction.set_rollback(True)


@pytest.mark.parametrize(("limit", "loop_limit"), [(3, 2), (0, 2), (3, 0)])
def test_a_claim_in_two_parts_runs_against_the_schema(limit: int, loop_limit: int) -> None:
    """claim_jobs' variants: the threads' part and the event loop's in one statement."""
    statement = sql.claim_jobs(limit, loop_limit)
    assert set(re.findall(r"%\((\w+)\)s", statement)) <= set(SAMPLE_PARAMS["CLAIM_JOBS"])
    with transaction.atomic(), connection.cursor() as cursor:
        cursor.execute(statement, SAMPLE_PARAMS["CLAIM_JOBS"])
        transaction.set_rollback(True)


def test_a_claim_asks_for_one_job_at_least() -> None:
    with pytest.raises(ValueError, match="one job at least"):
        sql.claim_jobs(0, 0)
    with pytest.raises(ValueError, match=">= 0"):
        sql.claim_jobs(-1, 2)


@pytest.mark.parametrize("name", sorted(SAMPLE_PARAMS))
def test_statement_names_only_the_models_tables_and_opens_with_a_comment(name: str) -> None:
    statement = sql.STATEMENTS[name]
    assert statement.lstrip().startswith("-- ")
    tables = set(
        re.findall(
            r"\b(?:FROM|INTO|UPDATE|JOIN|TABLE|(?:VACUUM|ANALYZE) \([A-Z_, ]+\))\s+(pgjobs_\w+)",
            statement,
        )
    )
    assert bool(tables) == (name not in TABLELESS)
    models = (
        Job,
        DeadJob,
        JobStats,
        KindStats,
        JobStatsHour,
        KindStatsHour,
        QueueControl,
        Schedule,
        RateClaim,
        Worker,
        Dependency,
        Batch,
        BatchCallback,
        CancelRequest,
    )
    assert tables <= {model._meta.db_table for model in models} | {sql.DEAD_DEFAULT_PARTITION}
    assert Job._meta.db_table == sql.JOB_TABLE and DeadJob._meta.db_table == sql.DEAD_TABLE


def test_no_statement_uses_a_python_timestamp() -> None:
    for name in sql.STATEMENTS:
        params = SAMPLE_PARAMS[name]
        # The only timestamps a caller passes are an explicit run_after chosen by the user,
        # and cron ticks and the dashboard's span starts, read from the database's clock.
        assert {"now", "at", "timestamp"}.isdisjoint(params), name


def test_pruning_batches_walks_an_index_of_their_ends() -> None:
    """Issue 26: PRUNE_BATCHES read every batch (a sequential scan and a sort) to find the
    oldest ended ones."""
    with connection.cursor() as cursor:
        cursor.execute("SET LOCAL enable_seqscan = off")
        cursor.execute("EXPLAIN " + sql.PRUNE_BATCHES, SAMPLE_PARAMS["PRUNE_BATCHES"])
        plan = "\n".join(line for (line,) in cursor.fetchall())
    assert "pgjobs_batch_ended" in plan, plan
    assert "Seq Scan on pgjobs_batch " not in plan, plan


@pytest.mark.parametrize(
    ("filters", "index"),
    [
        ({}, "pgjobs_dead_died_at"),
        ({"queue": "emails"}, "pgjobs_dead_queue"),
        ({"category": "failed"}, "pgjobs_dead_category"),
        ({"category": "dependency"}, "pgjobs_dead_category"),
        ({"kind_pattern": "billing.%"}, "pgjobs_dead_kind"),
    ],
)
def test_a_listing_of_dead_letters_walks_the_index_of_its_filter(
    filters: dict[str, str], index: str
) -> None:
    """`jobsctl dead` reads along the dead table's indexes, as the admin's list does: the
    filters a listing leaves out fold away, never a scan of every letter.

    The planner chooses by the table's statistics, so the test gives it some: 20,000
    letters, analyzed, where each filtered value is one letter in a hundred (an empty
    table analyzed by autovacuum after another test's letters, as on the embedded
    server, can make walking every letter newest first look cheaper). ANALYZE rolls back
    with the test's transaction, all but the table's size in pg_class."""
    nothing = dict.fromkeys(("kind_pattern", "queue", "category"))
    params = {**DEAD_FILTERS, **nothing, **filters, "limit": 50}
    with transaction.atomic(), connection.cursor() as cursor:
        cursor.execute(
            """
            INSERT INTO pgjobs_dead (id, queue, kind, max_attempts, lease_s, reason,
                                     category, died_at)
            SELECT -i,
                   CASE WHEN i % 100 = 3 THEN 'emails' ELSE 'default' END,
                   CASE WHEN i % 100 = 2 THEN 'billing.charge' ELSE 'demo.k' || i % 50 END,
                   3, 60,
                   CASE WHEN i % 100 = 1 THEN 'dependency failed: ' || i
                        WHEN i % 100 = 0 THEN 'failed' ELSE 'max attempts exceeded' END,
                   CASE WHEN i % 100 = 1 THEN NULL
                        WHEN i % 100 = 0 THEN 'failed' ELSE 'max_attempts' END,
                   now() - i * interval '1 second'
            FROM generate_series(1, 20000) AS i
            """
        )
        cursor.execute("ANALYZE pgjobs_dead")
        cursor.execute("SET LOCAL enable_seqscan = off")
        cursor.execute("EXPLAIN " + sql.DEAD_LETTERS, params)
        plan = "\n".join(line for (line,) in cursor.fetchall())
        transaction.set_rollback(True)
    assert reads_index(plan, index), plan
    assert "Seq Scan" not in plan, plan


def test_every_statement_that_writes_a_dead_letter_names_its_category() -> None:
    """Issue 26: the admin's reason filter reads the stored category, so every statement
    that inserts a dead letter writes it in that statement. The workflows' function
    (its letters read "dependency failed: <id>") is the one that does not."""
    writers = {
        name: statement
        for name, statement in sql.STATEMENTS.items()
        if re.search(r"INSERT INTO pgjobs_dead\b", statement)
    }
    assert {"FAIL_JOBS", "RETRY_JOBS", "TIME_OUT_JOBS", "RESCUE_LAPSED_JOBS"} <= set(writers)
    assert {"CANCEL_JOBS", "SWEEP_EXPIRED"} <= set(writers)
    for name, statement in writers.items():
        columns = re.findall(r"INSERT INTO pgjobs_dead \(([^)]*)\)", statement)
        assert columns, name
        if name.startswith("END_PARENTS_FUNCTION"):
            assert all("category" not in named for named in columns), name
        else:
            assert all("category" in named for named in columns), name


class TestPositionalPlaceholders:
    """The statements go to PostgreSQL with its own placeholders (db.connection.positional),
    numbered once per statement: what psycopg would send for the named ones."""

    def test_each_name_is_one_number_in_its_first_place_and_percent_signs_are_kept(self) -> None:
        from django_pgjobs.db.connection import positional

        query, names = positional(
            "SELECT %(b)s, %(a)s, %(b)s::int, 'x%%', %(a_1)s WHERE n LIKE '%%y'"
        )
        assert query == "SELECT $1, $2, $1::int, 'x%', $3 WHERE n LIKE '%y'"
        assert names == ("b", "a", "a_1")

    @pytest.mark.django_db
    def test_every_statement_runs_with_its_values_where_psycopg_would_put_them(self) -> None:
        from django_pgjobs.db import connection as db

        rows = db.fetchall(
            "SELECT %(text)s::text, %(number)s::int + %(number)s::int, %(ids)s::bigint[], '100%%'",
            {"ids": [3, 1], "number": 20, "text": "it's %(not)s a placeholder", "unused": 1},
            None,
        )
        assert rows == [("it's %(not)s a placeholder", 40, [3, 1], "100%")]
        with pytest.raises(KeyError):
            db.fetchall("SELECT %(missing)s::int", {}, None)
