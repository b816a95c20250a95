"""`manage.py runjobs` for real, in subprocesses: draining, crashes, stalls, lost
connections and signals (S16, S21, S25, S26)."""

from __future__ import annotations

import signal
import time
import uuid

import psycopg
import pytest
from django.db import connection
from psycopg import sql as pgsql

from django_pgjobs.models import Job
from tests import jobs
from tests.helpers import conninfo, count, dead_row, execute, other_connection, row
from tests.spawn import WORKER_APPLICATION_NAME, Workers, wait_for

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]


def running_on(job_id: int) -> str | None:
    rows = execute("SELECT worker_id FROM pgjobs_job WHERE id = %s AND state = 'running'", [job_id])
    return str(rows[0][0]) if rows else None


def test_burst_drains_and_exits_zero(workers: Workers) -> None:
    ids = [r.id for r in Job.objects.enqueue_many([{"kind": "tests.record"}] * 50)]
    process = workers.start("--burst", "--concurrency", "4")
    assert process.wait(60) == 0, process.output()
    assert count() == 0
    assert sorted(r[0] for r in execute("SELECT job_id FROM tests_note")) == sorted(ids)


def test_s26_four_workers_drain_ten_thousand_jobs_exactly_once(workers: Workers) -> None:
    ids = [
        r.id
        for r in Job.objects.enqueue_many(
            [{"kind": "tests.record", "payload": {"label": str(i)}} for i in range(10_000)]
        )
    ]
    started = [workers.start("--burst", "--concurrency", "8") for _ in range(4)]
    for process in started:
        assert process.wait(240) == 0, process.output()
    executions = execute(
        "SELECT job_id, count(*), count(DISTINCT token) FROM tests_note GROUP BY job_id"
    )
    assert len(executions) == 10_000
    assert {job_id for job_id, _, _ in executions} == set(ids)
    assert all(runs == 1 and tokens == 1 for _, runs, tokens in executions)
    assert count() == 0 and count("pgjobs_dead") == 0
    workers_used = {r[0] for r in execute("SELECT DISTINCT worker FROM tests_note")}
    assert len(workers_used) == 4  # every replica took a share


def test_s26_kill_9_mid_job_loses_nothing(workers: Workers) -> None:
    job_id = jobs.slow_first.using(lease=2).enqueue(seconds=60).id
    doomed = workers.start("--concurrency", "2")
    wait_for(lambda: count("tests_note") == 1, what="the first attempt to start")
    doomed.signal(signal.SIGKILL)
    doomed.wait(10)
    assert row(job_id, "state", "attempts") == ("running", 1)
    rescuer = workers.start("--concurrency", "2", "--poll-interval", "0.5")
    wait_for(lambda: count() == 0, timeout=30, what="the job to run again and finish")
    rescuer.signal(signal.SIGTERM)
    assert rescuer.wait(30) == 0
    attempts = [r[0] for r in execute("SELECT attempt FROM tests_note ORDER BY id")]
    assert attempts == [1, 2]
    assert count("pgjobs_dead") == 0


def test_s16_a_worker_stopped_past_its_lease_cannot_commit_its_late_result(
    workers: Workers,
) -> None:
    job_id = jobs.fenced_record.using(lease=2).enqueue(label="result", sleep=3).id
    stalled = workers.start("--concurrency", "1", "--worker-id", "stalled")
    wait_for(lambda: running_on(job_id) == "stalled", what="the first claim")
    stalled.signal(signal.SIGSTOP)  # no heartbeats now: the lease lapses
    fresh = workers.start("--concurrency", "1", "--worker-id", "fresh", "--poll-interval", "0.5")
    wait_for(lambda: count("tests_note") == 1, timeout=30, what="the newer claim's result")
    stalled.signal(signal.SIGCONT)
    time.sleep(4)  # the stalled worker wakes, finishes its sleep and tries its fenced write
    for process in (stalled, fresh):
        process.signal(signal.SIGTERM)
        assert process.wait(30) == 0, process.output()
    assert execute("SELECT worker, attempt, text FROM tests_note") == [("fresh", 2, "result")]
    assert count() == 0 and count("pgjobs_dead") == 0
    assert "job lost" in stalled.output()


def test_worker_reconnects_after_its_connections_are_terminated(workers: Workers) -> None:
    ids = [
        r.id
        for r in Job.objects.enqueue_many(
            [{"kind": "tests.record", "queue": "slow", "payload": {"sleep": 0.02}}] * 300
        )
    ]
    process = workers.start("--queue", "slow", "--concurrency", "4", "--poll-interval", "0.5")
    wait_for(lambda: count("tests_note") >= 30, what="the worker to get going")
    with other_connection() as admin:
        terminated = admin.execute(
            "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity "
            "WHERE datname = current_database() AND application_name = %s",
            [WORKER_APPLICATION_NAME],
        ).fetchone()
    assert terminated[0] >= 2  # the loop's, the listener's, the handlers'
    wait_for(lambda: count() == 0, timeout=60, what="every job to finish after reconnecting")
    process.signal(signal.SIGTERM)
    assert process.wait(30) == 0
    ran = {r[0] for r in execute("SELECT DISTINCT job_id FROM tests_note")}
    assert ran == set(ids)
    assert count("pgjobs_dead") == 0
    assert "database error" in process.output() or "LISTEN connection lost" in process.output()


def test_a_worker_on_a_read_only_server_backs_off_then_resumes(workers: Workers) -> None:
    """After a failover the worker's reconnect may land on a server that refuses writes:
    it says so, backs off instead of spinning, and carries on once writes are accepted."""
    database = connection.settings_dict["NAME"]
    process = workers.start("--poll-interval", "0.2", "--sweep-interval", "0", "--no-schedules")
    jobs.record.enqueue(label="before")
    wait_for(lambda: count("tests_note") == 1, what="the first job")
    try:
        with other_connection() as admin:
            admin.execute(
                pgsql.SQL("ALTER DATABASE {} SET default_transaction_read_only = on").format(
                    pgsql.Identifier(database)
                )
            )
            admin.execute(
                "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                "WHERE datname = current_database() AND application_name = %s",
                [WORKER_APPLICATION_NAME],
            )
        # This session predates the change and still writes.
        waiting = [jobs.record.enqueue(label=f"during {i}").id for i in range(3)]
        wait_for(lambda: "read-only" in process.output(), what="the worker to notice")
        # Backing off, not spinning: each attempt is a fresh connection (the refused one
        # is dropped), and over 3 s they are few.
        backends: set[int] = set()
        deadline = time.monotonic() + 3
        while time.monotonic() < deadline:
            backends.update(
                pid
                for (pid,) in execute(
                    "SELECT pid FROM pg_stat_activity"
                    " WHERE datname = current_database() AND application_name = %s",
                    [WORKER_APPLICATION_NAME],
                )
            )
            time.sleep(0.02)
        assert len(backends) <= 10, process.output()
        assert count("tests_note") == 1
    finally:
        with other_connection() as admin:
            admin.execute("SET default_transaction_read_only = off")  # this session's own
            admin.execute(
                pgsql.SQL("ALTER DATABASE {} RESET default_transaction_read_only").format(
                    pgsql.Identifier(database)
                )
            )
    wait_for(lambda: count() == 0, timeout=45, what="the jobs to run once writes are accepted")
    assert {r[0] for r in execute("SELECT job_id FROM tests_note")} >= set(waiting)
    assert process.process.poll() is None  # it never exited


def test_s25_sigterm_lets_running_jobs_finish_then_exits_zero(workers: Workers) -> None:
    for i in range(4):
        jobs.record.enqueue(label=str(i), sleep=1.5)
    process = workers.start("--concurrency", "4", "--shutdown-grace", "20")
    wait_for(lambda: count("tests_note") == 4, what="all four to start")
    process.signal(signal.SIGTERM)
    assert process.wait(20) == 0, process.output()
    assert count() == 0


def test_s25_claims_still_running_after_the_grace_are_handed_back(workers: Workers) -> None:
    ids = [jobs.record.enqueue(label=str(i), sleep=30).id for i in range(2)]
    process = workers.start("--concurrency", "2", "--shutdown-grace", "0.5")
    wait_for(lambda: count("tests_note") == 2, what="both to start")
    stopped_at = time.monotonic()
    process.signal(signal.SIGINT)
    assert process.wait(20) == 0, process.output()
    assert time.monotonic() - stopped_at < 10
    for job_id in ids:
        assert row(job_id, "state", "attempts", "claimed_by") == ("pending", 0, None)


def test_s25_a_second_signal_exits_at_once(workers: Workers) -> None:
    job_id = jobs.record.enqueue(label="long", sleep=60).id
    process = workers.start("--concurrency", "1", "--shutdown-grace", "60")
    wait_for(lambda: count("tests_note") == 1, what="the job to start")
    process.signal(signal.SIGTERM)
    time.sleep(0.3)
    process.signal(signal.SIGTERM)
    assert process.wait(10) == 128 + signal.SIGTERM
    assert row(job_id, "state") == ("running",)  # its lease brings it back


def test_s21_a_crash_in_transaction_mode_commits_nothing_and_still_dead_letters(
    workers: Workers,
) -> None:
    job_id = jobs.atomic_write.using(lease=1).enqueue(text="never", crash=True).id
    for attempt in (1, 2):
        process = workers.start("--concurrency", "1", "--poll-interval", "0.3")
        assert process.wait(30) == 17, process.output()
        assert row(job_id, "attempts") == (attempt,)
    assert count("tests_note") == 0
    time.sleep(1.2)  # the second claim's lease lapses: no attempts left
    process = workers.start("--burst", "--concurrency", "1")
    assert process.wait(30) == 0
    assert dead_row(job_id, "reason", "attempts") == ("max attempts exceeded", 2)
    assert count("tests_note") == 0


def test_import_makes_a_modules_kinds_known_to_the_worker(workers: Workers) -> None:
    job_id = Job.objects.enqueue("tests.imported", {"text": "hello"}).id
    without = workers.start("--burst")
    assert without.wait(60) == 0, without.output()
    [last_error] = row(job_id, "last_error")
    assert last_error.startswith("unknown job kind 'tests.imported': this worker has no handler")
    assert "restart the workers" in last_error
    execute("UPDATE pgjobs_job SET run_after = now() WHERE id = %s", [job_id])
    with_import = workers.start("--burst", "--import", "tests.imported_jobs")
    assert with_import.wait(60) == 0, with_import.output()
    assert row(job_id) is None
    assert execute("SELECT text FROM tests_note WHERE job_id = %s", [job_id]) == [("hello",)]
    missing = workers.start("--import", "tests.no_such_module")
    assert missing.wait(30) == 1
    assert "--import tests.no_such_module: cannot import it" in missing.output()


def test_bad_arguments_and_unusable_configuration_exit_non_zero(workers: Workers) -> None:
    bad_concurrency = workers.start("--concurrency", "0")
    assert bad_concurrency.wait(30) == 2
    assert "must be at least 1" in bad_concurrency.output()
    bad_prefetch = workers.start("--prefetch", "-1")
    assert bad_prefetch.wait(30) == 2
    assert "must be at least 0" in bad_prefetch.output()
    bad_queue = workers.start("--queue", "no spaces please")
    assert bad_queue.wait(30) == 1
    assert "Queue name" in bad_queue.output()
    unreachable = workers.start(extra_env={"DATABASE_URL": "postgresql://nobody@127.0.0.1:1/x"})
    assert unreachable.wait(30) == 1
    assert "Cannot reach the jobs database" in unreachable.output()
    empty = f"pgjobs_empty_{uuid.uuid4().hex[:8]}"
    with other_connection() as admin:
        admin.execute(f'CREATE DATABASE "{empty}"')
    try:
        params = conninfo()
        url = psycopg.conninfo.make_conninfo(**{**params, "dbname": empty})
        missing = workers.start(extra_env={"DATABASE_URL": _url(url)})
        assert missing.wait(30) == 1
        assert "python manage.py migrate" in missing.output()
    finally:
        with other_connection() as admin:
            admin.execute(f'DROP DATABASE "{empty}"')


def _url(conninfo_string: str) -> str:
    parts = dict(item.split("=", 1) for item in conninfo_string.split())
    user = parts.get("user", "")
    auth = f"{user}:{parts['password']}@" if "password" in parts else (f"{user}@" if user else "")
    port = f":{parts['port']}" if "port" in parts else ""
    return f"postgresql://{auth}{parts.get('host', '127.0.0.1')}{port}/{parts['dbname']}"


def test_a_queue_nothing_names_is_warned_about(workers: Workers) -> None:
    jobs.record.enqueue(label="served")
    process = workers.start("--burst", "--queue", "defualt", "--queue", "default")
    assert process.wait(60) == 0
    output = process.output()
    assert "--queue defualt: no registered job or task, setting, job or queue row" in output
    assert "--queue default:" not in output
    assert count() == 0
