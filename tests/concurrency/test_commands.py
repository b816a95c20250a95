"""`sweepjobs` and `runjobs` through call_command, and the status line."""

from __future__ import annotations

import io
import time

import pytest
from django.core.management import call_command
from django.core.management.base import CommandError
from django.test import override_settings

from django_pgjobs.management.commands.runjobs import StatusLine
from django_pgjobs.models import Job, Schedule
from django_pgjobs.worker import WorkerStats
from tests import jobs
from tests.helpers import count, execute, lapse, other_connection

pytestmark = pytest.mark.django_db(transaction=True)


def test_sweepjobs_runs_the_sweeper_once_and_says_what_it_did() -> None:
    Job.objects.enqueue("demo.t", expires=60)
    execute("UPDATE pgjobs_job SET expires_at = now() - interval '1 s'")
    Job.objects.enqueue("demo.t", queue="q", max_attempts=1)
    lapse(Job.objects.claim_one("q", "w1").id)
    out = io.StringIO()
    call_command("sweepjobs", stdout=out)
    assert "expired 1, lapsed claims requeued 0 and dead-lettered 1" in out.getvalue()
    assert count("pgjobs_dead") == 2


def test_runjobs_burst_through_call_command() -> None:
    for i in range(5):
        jobs.record.enqueue(label=str(i))
    call_command("runjobs", burst=True, concurrency=2, no_status=True, sweep_interval=0)
    assert count() == 0 and count("tests_note") == 5


def test_runjobs_refuses_an_invalid_queue() -> None:
    with pytest.raises(CommandError, match="Queue name"):
        call_command("runjobs", queues=["white space"], burst=True, no_status=True)


class FakeTerminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_status_line_redraws_in_place_on_a_terminal() -> None:
    stream = FakeTerminal()
    status = StatusLine(stream)
    status(WorkerStats(claimed=12, succeeded=9, retried=2, dead=1, in_flight=3))
    status.close()
    text = stream.getvalue()
    assert text.startswith("\r\x1b[K")
    assert "processed 9  failed 1  retried 2  in flight 3" in text
    assert "jobs/s" in text and text.endswith("\n")


def test_status_line_logs_periodically_when_not_a_terminal(caplog) -> None:
    stream = io.StringIO()
    status = StatusLine(stream, log_every=0)
    with caplog.at_level("INFO", logger="django_pgjobs.worker"):
        status(WorkerStats(succeeded=4))
    assert stream.getvalue() == ""
    assert "processed 4" in caplog.text


def test_runjobs_no_schedules_leaves_the_schedules_alone() -> None:
    jobs.record.enqueue(label="only")
    declared = {"SCHEDULES": {"s": {"kind": "tests.record", "cron": "* * * * *"}}}
    with override_settings(PGJOBS=declared):
        call_command("runjobs", max_jobs=1, no_schedules=True, no_status=True, sweep_interval=0)
    assert count("tests_note") == 1
    assert not Schedule.objects.exists()  # neither synced nor fired


def test_runjobs_start_check_outlives_a_connection_cut_under_it() -> None:
    """A worker restarting while its first connection is terminated (a failover, an
    operator's pg_terminate_backend) reconnects rather than exiting."""
    from django.db import connection

    from django_pgjobs.management.commands.runjobs import Command

    connection.ensure_connection()
    pid = connection.connection.info.backend_pid
    with other_connection() as other:
        other.execute("SELECT pg_terminate_backend(%s)", [pid])
    Command()._check_database(["default"], "default")
    assert connection.connection.info.backend_pid != pid


def test_the_start_check_waits_for_a_server_that_takes_no_writes_yet_then_says_why(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A worker started during a failover finds every host read-only, or not promoted
    yet: libpq says "session is read-only" (target_session_attrs=read-write). The check
    at start waits for a primary, up to START_TRANSIENT_WAIT_S, rather than exiting at
    once as for a server that does not answer; past it, it says what it met."""
    from django.db import connections

    from django_pgjobs.management.commands import runjobs

    default = connections["default"]
    options = default.settings_dict.setdefault("OPTIONS", {})
    saved = dict(options)
    options["target_session_attrs"] = "read-write"
    options["options"] = "-c default_transaction_read_only=on"  # a standby, as libpq sees it
    default.close()
    pauses: list[float] = []
    monkeypatch.setattr(runjobs, "START_TRANSIENT_WAIT_S", 3.0)
    real_sleep = time.sleep

    def pause(seconds: float) -> None:
        pauses.append(seconds)
        real_sleep(seconds)

    monkeypatch.setattr(time, "sleep", pause)
    try:
        with pytest.raises(CommandError, match="session is read-only"):
            runjobs.Command()._check_database(["default"], "default")
        # It waited the 3 s, past the 3 tries given a server that does not answer.
        assert len(pauses) > runjobs.START_CHECKS
    finally:
        default.close()
        options.clear()
        options.update(saved)


@pytest.mark.parametrize(
    ("error", "expected"),
    [
        # A server whose lc_messages is not English: known by its SQLSTATE.
        ("ReadOnlySqlTransaction", True),
        ("CannotConnectNow", True),
        ("UndefinedTable", False),
        ("QueryCanceled", False),
    ],
)
def test_a_server_that_cannot_take_the_worker_yet_is_known_in_any_language(
    error: str, expected: bool
) -> None:
    import psycopg
    from django.db import OperationalError

    from django_pgjobs.management.commands import runjobs

    cause = getattr(psycopg.errors, error)("FEHLER: eine übersetzte Meldung")
    try:
        raise OperationalError(str(cause)) from cause
    except OperationalError as wrapped:
        assert runjobs.transient(wrapped) is expected
    assert runjobs.transient(OperationalError("session is read-only")) is True
