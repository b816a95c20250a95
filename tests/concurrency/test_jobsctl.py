"""`manage.py jobsctl` as wide as the admin's actions (issue 31.5): `dead` lists and filters
the dead letters, `requeue` brings them back by id or by filter, `schedules enable`,
`disable` and `run`, `status` with retrying and done, `--json` documents, a pause of a
queue nothing names refused, and a command that matched nothing fails with what it looked
for. Hostile arguments get a CommandError or a correct empty answer, never a traceback.
With several job databases: processes/test_queue_databases.py."""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from datetime import datetime
from io import StringIO
from typing import Any

import pytest
from django.core.management import call_command, load_command_class
from django.core.management.base import CommandError
from django.test import override_settings
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from django_pgjobs.management.commands import jobsctl as jobsctl_module
from django_pgjobs.management.jobsctl.dead import REASON_CHARS
from django_pgjobs.management.jobsctl.queues import known_queues
from django_pgjobs.managers import dead as dead_manager
from django_pgjobs.models import Job, QueueControl, Schedule, Worker
from django_pgjobs.scheduler import Scheduler
from tests.helpers import count, dead_row, execute, row
from tests.spawn import ROOT, database_url_for_workers, suite_env

pytestmark = pytest.mark.django_db(transaction=True)


def jobsctl(*args: str) -> str:
    out = StringIO()
    call_command("jobsctl", *args, stdout=out)
    return out.getvalue()


def refused(*args: str) -> str:
    """The message of the CommandError `jobsctl ARGS` raises."""
    with pytest.raises(CommandError) as raised:
        jobsctl(*args)
    return str(raised.value)


def document(*args: str) -> dict[str, Any]:
    parsed: dict[str, Any] = json.loads(jobsctl(*args, "--json"))
    return parsed


def table(text: str) -> dict[str, list[str]]:
    """A table's rows by their first cell, each split on runs of two spaces or more."""
    lines = text.split("\n\n")[0].splitlines()
    assert set(lines[1]) <= {"-", " "}, text
    return {
        line.split()[0]: [cell.strip() for cell in line.split("  ") if cell.strip()]
        for line in lines[2:]
        if not line.startswith("(")
    }


def aware(text: str) -> datetime:
    moment = datetime.fromisoformat(text)
    assert moment.tzinfo is not None, text
    return moment


def letter(
    kind: str = "billing.charge",
    queue: str = "emails",
    *,
    error: str = "card declined",
    key: str | None = None,
    died_ago: str | None = None,
) -> int:
    """A dead letter its handler failed (category "failed"), dead `died_ago` if given."""
    job_id = Job.objects.enqueue(kind, {}, queue=queue, key=key).id
    handle = Job.objects.claim_one(queue, "w")
    assert handle is not None and handle.id == job_id
    assert handle.fail(error)
    if died_ago is not None:
        execute(
            f"UPDATE pgjobs_dead SET died_at = now() - interval '{died_ago}' WHERE id = %s",
            [job_id],
        )
    return job_id


def exhausted(kind: str = "billing.charge", queue: str = "emails") -> int:
    """A dead letter whose last attempt failed (category "max_attempts")."""
    job_id = Job.objects.enqueue(kind, {}, queue=queue, max_attempts=1).id
    handle = Job.objects.claim_one(queue, "w")
    assert handle is not None and handle.retry("boom")
    return job_id


class TestStatus:
    def test_status_shows_retrying_and_done_beside_the_other_counts(self) -> None:
        Job.objects.enqueue("demo.t", queue="mail")
        Job.objects.enqueue("demo.t", queue="mail")
        handle = Job.objects.claim_one("mail", "w")
        assert handle is not None and handle.retry("try later", delay=600)
        kept = Job.objects.enqueue("demo.t", queue="mail", result_retention=3600).id
        execute("UPDATE pgjobs_job SET priority = 9 WHERE id = %s", [kept])
        done = Job.objects.claim_one("mail", "w")
        assert done is not None and done.id == kept and done.ack({"ok": True})
        text = jobsctl("status")
        assert text.splitlines()[0].split() == [
            "queue",
            "runnable",
            "scheduled",
            "retrying",
            "running",
            "done",
            "rate",
            "paused",
            "dead",
            "oldest",
            "runnable",
        ]
        assert table(text)["mail"][:6] == ["mail", "1", "1", "1", "0", "1"]

    def test_status_json_is_one_document_with_the_documented_keys(self) -> None:
        letter(queue="mail")
        Job.objects.enqueue("demo.t", queue="mail")
        QueueControl.objects.set_limit("mail", 3)
        Worker.objects.heartbeat(
            "host:1:abc",
            host="host",
            pid=1,
            queues=["other"],
            concurrency=2,
            version="9",
            heartbeat_s=5,
            running=0,
            succeeded=4,
            failed=1,
        )
        status = document("status")
        assert list(status) == ["databases"]
        (database,) = status["databases"]
        assert list(database) == ["database", "queues", "workers", "unserved"]
        assert database["database"] == "default" and database["unserved"] == ["mail"]
        mail = next(queue for queue in database["queues"] if queue["queue"] == "mail")
        oldest = mail.pop("oldest_runnable_s")
        assert isinstance(oldest, float) and oldest >= 0
        assert mail == {
            "queue": "mail",
            "runnable": 1,
            "scheduled": 0,
            "retrying": 0,
            "running": 0,
            "done": 0,
            "dead": 1,
            "estimated": [],
            "paused": False,
            "max_running": 3,
            "rate": None,
        }
        (worker,) = database["workers"]
        assert worker["id"] == "host:1:abc" and worker["state"] == "live"
        assert (worker["queues"], worker["succeeded"], worker["failed"]) == (["other"], 4, 1)
        assert aware(worker["last_seen_at"]) >= aware(worker["started_at"])
        assert worker["stopped_at"] is None and isinstance(worker["seen_s_ago"], float)

    def test_a_count_past_the_cap_is_listed_as_estimated(self) -> None:
        Job.objects.enqueue_many([{"kind": "demo.t", "queue": "big"}] * 1001)
        execute("ANALYZE pgjobs_job")
        big = next(
            queue
            for queue in document("status")["databases"][0]["queues"]
            if queue["queue"] == "big"
        )
        assert big["estimated"] == ["runnable"] and big["runnable"] > 0


class TestRunning:
    def test_running_json_lists_each_running_job_with_its_start_and_progress(self) -> None:
        first = Job.objects.enqueue("demo.t").id
        Job.objects.enqueue("demo.t")
        handle = Job.objects.claim_one("default", "w-1")
        assert handle is not None and handle.id == first
        handle.progress(0.25, "half way there")
        Job.objects.claim_one("default", "w-2")
        execute(
            "UPDATE pgjobs_job SET started_at = now() - interval '1 hour' WHERE id = %s", [first]
        )
        running = document("running")
        assert list(running) == ["databases", "jobs", "more"]
        assert running["databases"] == ["default"] and running["more"] is False
        longest = running["jobs"][0]
        assert longest["id"] == first and longest["worker_id"] == "w-1"
        assert (longest["attempt"], longest["max_attempts"]) == (1, 10)
        assert 3599 < longest["running_s"] < 3700
        assert longest["progress"]["fraction"] == 0.25
        assert abs((aware(longest["started_at"]) - Job.objects.clock()).total_seconds() + 3600) < 60
        limited = document("running", "--limit", "1")
        assert [job["id"] for job in limited["jobs"]] == [first] and limited["more"] is True
        assert document("running", "nosuch") == {
            "databases": ["default"],
            "jobs": [],
            "more": False,
        }


class TestDead:
    def test_dead_lists_the_newest_first_with_the_reason_cut_short_and_both_times(self) -> None:
        old = letter(error="card declined: " + "x" * 80, died_ago="2 hours")
        new = exhausted(kind="reports.nightly", queue="reports")
        text = jobsctl("dead")
        assert text.splitlines()[0].split() == ["id", "kind", "queue", "reason", "died"]
        rows = table(text)
        assert list(rows) == [str(new), str(old)]
        assert rows[str(new)][1:4] == ["reports.nightly", "reports", "max attempts exceeded"]
        reason = rows[str(old)][3]
        assert reason.startswith("card declined: xxx") and reason.endswith("…")
        assert len(reason) == REASON_CHARS
        died_at = dead_row(old, "died_at")[0]
        assert rows[str(old)][4] == f"2.0 h ago ({died_at:%Y-%m-%d %H:%M:%S} UTC)"

    def test_dead_filters_by_kind_prefix_queue_and_reason_category(self) -> None:
        failed = letter(kind="billing.charge", queue="emails")
        underscored = letter(kind="bill_x.refund", queue="emails")
        lookalike = letter(kind="billAx.refund", queue="emails")
        spent = exhausted(kind="billing.refund", queue="payments")
        cancelled = Job.objects.enqueue("billing.charge", {}, queue="emails").id
        Job.objects.cancel_many([cancelled])
        parent = Job.objects.enqueue("etl.extract", {}, queue="etl").id
        child = Job.objects.enqueue("etl.load", {}, queue="etl", after=[parent]).id
        handle = Job.objects.claim_one("etl", "w")
        assert handle is not None and handle.id == parent and handle.fail("source gone")
        unrecorded = letter(kind="legacy.job", queue="emails", error="Fail: gone")
        execute("UPDATE pgjobs_dead SET category = NULL WHERE id = %s", [unrecorded])

        def ids(*args: str) -> list[int]:
            return sorted(each["id"] for each in document("dead", *args)["letters"])

        assert ids("--kind", "billing.") == sorted([failed, spent, cancelled])
        assert ids("--kind", "bill_x") == [underscored]  # "_" is no wildcard
        assert ids("--kind", "billA") == [lookalike]
        assert ids("--queue", "payments") == [spent]
        assert ids("--reason", "failed") == sorted([failed, underscored, lookalike, parent])
        assert ids("--reason", "max_attempts") == [spent]
        assert ids("--reason", "cancelled") == [cancelled]
        assert ids("--reason", "dependency") == [child]
        assert ids("--reason", "other") == [unrecorded]
        assert ids("--kind", "billing.", "--queue", "emails", "--reason", "failed") == [failed]
        assert (
            jobsctl("dead", "--kind", "nothing.") == "No dead letter of kind prefix 'nothing.'.\n"
        )
        assert jobsctl("dead", "--queue", "emails", "--reason", "expired") == (
            "No dead letter of queue 'emails', reason 'expired'.\n"
        )

    def test_dead_json_documents_each_letter_and_says_when_there_are_more(self) -> None:
        older = letter(key="invoice:7", died_ago="1 minute")
        newer = exhausted()
        listing = document("dead", "--limit", "1")
        assert list(listing) == ["databases", "filters", "letters", "more"]
        assert listing["filters"] == {"kind": None, "queue": None, "category": None}
        assert listing["more"] is True and [each["id"] for each in listing["letters"]] == [newer]
        (entry,) = document("dead", "--reason", "failed")["letters"]
        died_at, created_at = dead_row(older, "died_at", "created_at")
        assert entry == {
            "id": older,
            "database": "default",
            "queue": "emails",
            "kind": "billing.charge",
            "key": "invoice:7",
            "reason": "card declined",
            "category": "failed",
            "attempts": 1,
            "max_attempts": 10,
            "last_error": "card declined",
            "created_at": created_at.isoformat(),
            "died_at": died_at.isoformat(),
            "died_s_ago": entry["died_s_ago"],
        }
        assert 59 < entry["died_s_ago"] < 120
        assert aware(entry["died_at"]) == died_at
        text = jobsctl("dead", "--limit", "1")
        assert text.splitlines()[-1] == "(the newest 1; --limit N shows more)"
        assert document("dead", "--kind", "nothing.")["letters"] == []

    def test_an_empty_listing_is_an_answer(self) -> None:
        assert jobsctl("dead") == "No dead letter.\n"
        assert document("dead") == {
            "databases": ["default"],
            "filters": {"kind": None, "queue": None, "category": None},
            "letters": [],
            "more": False,
        }

    def test_dead_refuses_filters_no_letter_can_match(self) -> None:
        assert refused("dead", "--reason", "boom") == (
            "'boom' is no category of dead letters: one of failed, max_attempts, expired, "
            "cancelled, dependency, payload, unknown_kind, unstorable, other."
        )
        assert refused("dead", "--kind", "a b") == (
            "Job kind 'a b' may only contain letters, digits and _ . : -"
        )
        assert refused("dead", "--queue", "") == "Queue name must not be empty."
        assert refused("dead", "--limit", "0") == (
            "Error: argument --limit: '0' is not a number of rows: give a whole number from "
            "1 to 100,000."
        )


class TestRequeue:
    def test_requeue_by_id_brings_letters_back_and_says_what_the_others_were(self) -> None:
        dead = letter()
        live = Job.objects.enqueue("demo.t").id
        assert jobsctl("requeue", str(dead), str(live), "999999") == (
            "Requeued 1 of 3 job(s): back to pending with fresh attempts.\n"
            f"The others were not dead letters: {live} is pending, 999999 is no job.\n"
        )
        assert row(dead, "state", "attempts") == ("pending", 0)
        assert dead_row(dead) is None

    def test_requeue_into_a_live_key_says_it_merged(self) -> None:
        dead = letter(key="invoice:7")
        live = Job.objects.enqueue(
            "billing.charge", {"again": True}, queue="emails", key="invoice:7"
        )
        assert jobsctl("requeue", str(dead)) == (
            "Requeued 0 of 1 job(s): back to pending with fresh attempts; 1 more merged into "
            "the live job of its key instead.\n"
        )
        assert count() == 1 and row(live.id) is not None and dead_row(dead) is None

    def test_requeue_of_ids_that_are_no_dead_letters_fails_and_says_where_they_are(self) -> None:
        live = Job.objects.enqueue("demo.t").id
        assert refused("requeue", str(live), "424242") == (
            f"Nothing was requeued: {live} is pending, 424242 is no job. Only a dead letter "
            "can be requeued: jobsctl dead lists them."
        )
        assert row(live, "state") == ("pending",)

    def test_requeue_all_takes_every_letter_matching_the_filters_and_no_other(self) -> None:
        failed = [letter() for _ in range(3)]
        other_queue = letter(queue="payments")
        spent = exhausted()
        assert jobsctl("requeue", "--all", "--queue", "emails", "--reason", "failed") == (
            "Requeued 3 dead letters of queue 'emails', reason 'failed': back to pending "
            "with fresh attempts.\n"
        )
        assert all(row(job_id, "state") == ("pending",) for job_id in failed)
        assert dead_row(other_queue) is not None and dead_row(spent) is not None
        assert jobsctl("requeue", "--all", "--kind", "billing.") == (
            "Requeued 2 dead letters of kind prefix 'billing.': back to pending with fresh "
            "attempts.\n"
        )
        assert count("pgjobs_dead") == 0

    def test_requeue_all_walks_batches_and_leaves_letters_that_died_after_it_began(
        self, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        monkeypatch.setattr(dead_manager, "REQUEUE_BATCH", 2)
        taken = [letter() for _ in range(5)]
        later = letter()
        # As if it had died while the requeue walked the others (the database's clock).
        execute("UPDATE pgjobs_dead SET died_at = now() + interval '1 hour' WHERE id = %s", [later])
        assert jobsctl("requeue", "--all").startswith("Requeued 5 dead letters:")
        assert all(row(job_id, "state") == ("pending",) for job_id in taken)
        assert dead_row(later) is not None

    def test_requeue_all_that_matches_nothing_fails_with_what_it_looked_for(self) -> None:
        letter()
        assert refused("requeue", "--all", "--kind", "reports.", "--reason", "expired") == (
            "No dead letter of kind prefix 'reports.', reason 'expired': nothing was "
            "requeued. jobsctl dead lists the dead letters (with the same filters)."
        )
        assert count("pgjobs_dead") == 1

    def test_requeue_says_how_to_name_the_letters(self) -> None:
        dead = letter()
        assert refused("requeue") == (
            "Which dead letters? Give their ids (jobsctl dead lists them), or --all with "
            "filters (--kind, --queue, --reason) for every one that matches."
        )
        assert refused("requeue", "--all", str(dead)) == (
            "Give ids or --all, not both: nothing was requeued."
        )
        assert refused("requeue", "--queue", "emails", str(dead)) == (
            "--kind, --queue and --reason choose the letters of --all; with ids, give the "
            "ids alone. Nothing was requeued."
        )
        assert refused("requeue", "--database", "nosuch", str(dead)) == (
            "'nosuch' holds no jobs: --database is one of default."
        )
        assert dead_row(dead) is not None


class TestCancel:
    def test_cancel_of_ids_that_are_not_live_fails_and_says_where_they_are(self) -> None:
        dead = letter()
        assert refused("cancel", str(dead), "777777") == (
            f"Nothing was cancelled: {dead} is a dead letter (card declined), 777777 is no "
            "job. Only a waiting, pending or running job can be cancelled."
        )
        assert dead_row(dead, "reason") == ("card declined",)

    def test_cancel_says_which_of_the_ids_it_could_not_cancel(self) -> None:
        live = Job.objects.enqueue("demo.t").id
        assert jobsctl("cancel", str(live), "777777").splitlines() == [
            "Cancelled 1 of 2 job(s) in database default: dead-lettered as 'cancelled' "
            "(requeue them with jobsctl requeue); running handlers are told to stop.",
            "The others were not pending or running: 777777 is no job.",
        ]


class TestPauseAndResume:
    def test_a_queue_nothing_names_is_refused_with_the_known_queues(self) -> None:
        Job.objects.enqueue("demo.t", queue="emails")
        with override_settings(PGJOBS={"QUEUES": {"reports": {}}}):
            message = refused("pause", "emials")
            assert message.startswith(
                "Unknown queue 'emials': no registered job or task names it, no setting, and "
                "database default holds no job, dead letter or control of it. Did you mean "
                "'emails' for 'emials'? Known queues: "
            )
            known = message.split("Known queues: ")[1].split(". Nothing")[0].split(", ")
            # Jobs, settings, the default queue, and the queues of registered jobs.
            assert {"emails", "reports", "default", "long", "async"} <= set(known)
            assert message.endswith(
                "Nothing was paused. To pause it anyway (a queue a coming deploy brings), add "
                "--create: jobsctl pause --create emials"
            )
            assert "Nothing was resumed. To resume them anyway" in refused(
                "resume", "emials", "mailz"
            )
        assert QueueControl.objects.count() == 0

    def test_create_pauses_a_queue_nothing_names_yet(self) -> None:
        assert jobsctl("pause", "--create", "coming") == (
            "Paused coming: no worker claims their jobs until resumed (enqueues still land).\n"
        )
        assert QueueControl.objects.get(name="coming").paused
        assert jobsctl("resume", "coming") == "Resumed coming; workers woken.\n"  # a row now

    def test_a_queue_known_by_a_dead_letter_or_a_row_alone_is_known(self) -> None:
        letter(queue="graveyard")
        QueueControl.objects.set_limit("limited", 2)
        assert jobsctl("pause", "graveyard", "limited").startswith("Paused graveyard, limited")
        assert jobsctl("resume", "graveyard").startswith("Resumed graveyard")

    def test_a_queue_whose_jobs_all_wait_or_are_done_is_known(self) -> None:
        Job.objects.enqueue("demo.t", queue="finished", result_retention=3600)
        handle = Job.objects.claim_one("finished", "w")
        assert handle is not None and handle.ack()
        parent = Job.objects.enqueue("demo.t", queue="parents").id
        child = Job.objects.enqueue("demo.t", queue="children", after=[parent]).id
        assert row(child, "state") == ("waiting",)
        assert jobsctl("pause", "finished", "children").startswith("Paused children, finished:")

    def test_a_bad_name_is_refused_before_anything_is_looked_up(self) -> None:
        assert refused("pause", "--create", "white space") == (
            "Queue name 'white space' may only contain letters, digits and _ . : -"
        )


SCHEDULES = {
    "nightly": {"kind": "tests.record", "cron": "0 3 * * *", "payload": {"label": "night"}},
    "hourly": {"kind": "tests.record", "cron": "0 * * * *", "payload": {"label": "hour"}},
}


class TestSchedules:
    @pytest.fixture(autouse=True)
    def declared(self) -> Any:
        with override_settings(PGJOBS={"SCHEDULES": SCHEDULES}):
            Scheduler().sync()
            yield

    def test_disable_then_enable_from_the_next_tick(self) -> None:
        assert jobsctl("schedules", "disable", "nightly") == (
            "Disabled nightly: no tick of it enqueues a job until it is enabled again "
            "(jobsctl schedules enable nightly).\n"
        )
        assert not Schedule.objects.get(name="nightly").enabled
        assert jobsctl("schedules", "disable", "nightly") == "nightly: disabled already.\n"
        assert "disabled" in table(jobsctl("schedules"))["nightly"]
        execute("UPDATE pgjobs_schedule SET next_run_at = now() - interval '2 days'")
        enabled = jobsctl("schedules", "enable", "nightly", "hourly").splitlines()
        schedule = Schedule.objects.get(name="nightly")
        assert schedule.enabled and schedule.next_run_at.hour == 3
        assert schedule.next_run_at > Job.objects.clock()  # the missed ticks are not run
        assert enabled == [
            "hourly: enabled already; next run "
            f"{Schedule.objects.get(name='hourly').next_run_at:%Y-%m-%d %H:%M:%S} UTC.",
            f"Enabled nightly: next run {schedule.next_run_at:%Y-%m-%d %H:%M:%S} UTC (the "
            "ticks missed while disabled are not run).",
        ]

    def test_run_enqueues_one_job_now_and_keeps_the_next_tick(self) -> None:
        before = Schedule.objects.get(name="nightly")
        text = jobsctl("schedules", "run", "nightly")
        after = Schedule.objects.get(name="nightly")
        assert after.last_job_id is not None and after.runs == before.runs + 1
        assert after.next_run_at == before.next_run_at
        assert text == (
            f"Enqueued job {after.last_job_id} (tests.record) for schedule nightly; its next "
            f"tick stays {before.next_run_at:%Y-%m-%d %H:%M:%S} UTC.\n"
        )
        assert row(after.last_job_id, "kind", "payload") == ("tests.record", {"label": "night"})
        Schedule.objects.disable(["hourly"])
        assert "it stays disabled." in jobsctl("schedules", "run", "hourly")

    def test_an_unknown_or_retired_schedule_is_refused_and_nothing_changes(self) -> None:
        assert refused("schedules", "run", "nighly", "nightly") == (
            "No schedule is named 'nighly'. Did you mean 'nightly' for 'nighly'? The "
            "schedules: hourly, nightly. Nothing was run."
        )
        assert count() == 0
        with override_settings(PGJOBS={"SCHEDULES": {"hourly": SCHEDULES["hourly"]}}):
            Scheduler().sync()
        assert refused("schedules", "enable", "nightly") == (
            "Retired (no code or setting declares it any more): nightly. Declare it again "
            "(@job(schedule=...) or PGJOBS['SCHEDULES']) and restart a worker, which enables "
            "it. Nothing was enabled."
        )
        assert jobsctl("schedules", "disable", "nightly") == (
            "nightly: disabled already (retired: no code or setting declares it).\n"
        )
        assert refused("schedules", "disable", "x\x00") == (
            "No schedule is named 'x\\x00'. The schedules: hourly, nightly. Nothing was disabled."
        )


def test_every_subcommand_says_what_it_does_in_its_help() -> None:
    parser = load_command_class("django_pgjobs", "jobsctl").create_parser("manage.py", "jobsctl")

    def subcommands(each: argparse.ArgumentParser) -> list[argparse.ArgumentParser]:
        found = []
        for action in each._actions:
            if isinstance(action, argparse._SubParsersAction):
                for child in action.choices.values():
                    found += [child, *subcommands(child)]
        return found

    everyone = subcommands(parser)
    names = {each.prog.split("jobsctl ", 1)[1] for each in everyone}
    assert names >= {"dead", "requeue", "schedules enable", "schedules disable", "schedules run"}
    for each in everyone:
        assert each.description and len(each.description) > 30, each.prog
        shown = " ".join(each.format_help().split())
        assert " ".join(each.description.split()) in shown, each.prog
    doc = jobsctl_module.__doc__ or ""
    for line in ("jobsctl dead", "jobsctl requeue", "schedules enable", "schedules run", "--json"):
        assert line in doc, line


ID_LIKE = st.one_of(
    st.integers(min_value=-(2**70), max_value=2**70).map(str),
    st.sampled_from(["0", "9223372036854775807", "9223372036854775808", "1e3", "0x10", "١٢"]),
    st.text(max_size=30),
)
HOSTILE = st.one_of(
    st.text(max_size=40),
    st.sampled_from(
        [
            "",
            "\x00",
            "a\x00b",
            "\ud800",
            "emails\udcff",
            "'; DROP TABLE pgjobs_dead; --",
            "% OR 1=1",
            "_",
            "billing.%",
            "x" * 5000,
            "-1",
            "--all",
        ]
    ),
)
TEMPLATES = [
    ("dead", "--json", "--kind", "{}"),
    ("dead", "--json", "--queue", "{}"),
    ("dead", "--json", "--reason", "{}"),
    ("dead", "--limit", "{}"),
    ("requeue", "--all", "--kind", "{}", "--queue", "nothing-here"),
    ("requeue", "--all", "--queue", "{}", "--reason", "expired"),
    ("requeue", "--all", "--reason", "{}", "--kind", "nothing."),
    ("schedules", "enable", "{}"),
    ("schedules", "disable", "{}"),
    ("schedules", "run", "{}"),
    ("pause", "{}"),
    ("resume", "{}"),
    ("running", "--json", "{}"),
]


@settings(
    max_examples=150,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)
@given(value=HOSTILE, template=st.sampled_from(TEMPLATES), id_text=ID_LIKE)
def test_hostile_arguments_get_a_clear_refusal_or_a_correct_empty_answer(
    value: str, template: tuple[str, ...], id_text: str
) -> None:
    """Ids that are no numbers, huge numbers, NUL bytes and lone surrogates, SQL-looking
    text: each command refuses with a CommandError that says why (never the database's
    refusal, never a traceback), or answers correctly, and changes nothing it was not
    asked to. The one dead letter there is matches none of the requeues' filters, and no
    schedule exists."""
    QueueControl.objects.all().delete()
    if not count("pgjobs_dead"):
        letter(kind="billing.charge", queue="emails")
    before = execute("SELECT id, queue FROM pgjobs_dead ORDER BY id")
    ((letter_id, _),) = before
    args = [part.replace("{}", value) for part in template]
    try:
        text = jobsctl(*args)
    except CommandError as error:
        message = str(error)
        assert message and "Traceback" not in message
        assert "refused:" not in message, message  # the database never saw the value
    else:
        if args[0] == "dead" and "--json" in args:
            for entry in json.loads(text)["letters"]:
                assert args[2] != "--kind" or entry["kind"].startswith(value)
                assert args[2] != "--queue" or entry["queue"] == value
        elif args[0] == "dead":  # --limit
            assert value.isascii() and value.isdigit() and 1 <= int(value) <= 100_000
        elif args[0] == "running":
            assert json.loads(text)["jobs"] == []
        else:
            assert args[0] in ("pause", "resume"), (args, text)
            assert value in known_queues(), value
    assert execute("SELECT id, queue FROM pgjobs_dead ORDER BY id") == before
    try:
        text = jobsctl("requeue", id_text)
    except CommandError as error:
        assert "refused:" not in str(error) and "Traceback" not in str(error)
        assert dead_row(letter_id) is not None
    else:  # the one id that names a dead letter
        assert int(id_text) == letter_id and row(letter_id, "state") == ("pending",)
        execute("DELETE FROM pgjobs_job WHERE id = %s", [letter_id])


def test_a_lone_surrogate_from_the_terminal_is_refused_without_a_traceback() -> None:
    """An argument that is not UTF-8 reaches Python as a lone surrogate (surrogateescape):
    a real process refuses it with one line on stderr, never a traceback."""
    env = suite_env(DATABASE_URL=database_url_for_workers(), PYTHONIOENCODING="utf-8")
    for args in (
        [b"dead", b"--kind", b"bill\xff"],
        [b"pause", b"q\xff"],
        [b"schedules", b"run", b"n\xff"],
        [b"requeue", b"\xff"],
    ):
        result = subprocess.run(
            [sys.executable.encode(), b"manage.py", b"jobsctl", *args],
            cwd=ROOT,
            env=env,
            capture_output=True,
            timeout=60,
        )
        stderr = result.stderr.decode("utf-8", "backslashreplace")
        assert result.returncode != 0, (args, stderr)
        assert "Traceback" not in stderr and "\\udcff" in stderr, (args, stderr)
        assert result.stdout == b""


def test_s22_a_letters_age_is_the_database_clocks(monkeypatch: pytest.MonkeyPatch) -> None:
    """S22: the age `dead` shows is read on the database's clock, whatever Python's says."""
    job_id = letter(died_ago="3 hours")
    skewed = time.time() + 6 * 3600
    monkeypatch.setattr(time, "time", lambda: skewed)
    (entry,) = document("dead")["letters"]
    assert entry["id"] == job_id and 3 * 3600 - 60 < entry["died_s_ago"] < 3 * 3600 + 60
    assert table(jobsctl("dead"))[str(job_id)][4].startswith("3.0 h ago (")
