"""Periodic schedules: exactly one job per tick across replicas, by the database's clock;
skip and backfill after downtime; declarations synced, retired and validated."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from io import StringIO
from typing import Any

import pytest
import time_machine
from django.core import checks
from django.core.management import call_command
from django.test import override_settings

from django_pgjobs import Cron, job, registry
from django_pgjobs.exceptions import InvalidCron, InvalidJobOption
from django_pgjobs.models import Schedule
from django_pgjobs.scheduler import Scheduler
from django_pgjobs.schedules import declared_schedules, due_ticks, next_tick
from tests.helpers import count, execute, row, run_threads, running_worker, scalar, wait_until

pytestmark = pytest.mark.django_db(transaction=True)

EVERY_MINUTE = {"kind": "tests.record", "cron": "* * * * *", "payload": {"label": "tick"}}
#: A schedule whose own ticks never come during a test (New Year's midnight): the ticks
#: are the ones a test makes by moving next_run_at.
YEARLY = {"kind": "tests.record", "cron": "0 0 1 1 *", "payload": {"label": "tick"}}


def declare(**schedules: dict[str, Any]) -> Any:
    """Settings that declare `schedules` (name -> PGJOBS['SCHEDULES'] entry)."""
    return override_settings(PGJOBS={"SCHEDULES": schedules})


def move_next_run(name: str, expression: str) -> None:
    """Make a schedule due: set its next tick with a SQL expression over now()."""
    execute(f"UPDATE pgjobs_schedule SET next_run_at = {expression} WHERE name = %s", [name])


def jobs_of(kind: str = "tests.record") -> list[tuple[int, datetime]]:
    return [
        (job_id, run_after)
        for job_id, run_after in execute(
            "SELECT id, run_after FROM pgjobs_job WHERE kind = %s ORDER BY run_after, id", [kind]
        )
    ]


def utc(text: str) -> datetime:
    return datetime.fromisoformat(text).replace(tzinfo=UTC)


class TestCronArithmetic:
    def test_next_tick_reads_the_fields_in_the_schedules_timezone(self) -> None:
        winter = utc("2026-01-10 12:00")
        assert next_tick("0 3 * * *", "UTC", winter) == utc("2026-01-11 03:00")
        assert next_tick("0 3 * * *", "Europe/Paris", winter) == utc("2026-01-11 02:00")
        assert next_tick("0 3 * * *", "Europe/Paris", utc("2026-07-10 12:00")) == utc(
            "2026-07-11 01:00"
        )
        assert next_tick("*/5 * * * *", "UTC", utc("2026-01-10 12:05")) == utc("2026-01-10 12:10")

    def test_skip_runs_the_latest_missed_tick_once(self) -> None:
        due, now = utc("2026-01-10 11:00"), utc("2026-01-10 12:07:30")
        assert due_ticks("*/5 * * * *", "UTC", due, now, "skip", 10) == [utc("2026-01-10 12:05")]

    def test_backfill_runs_the_latest_missed_ticks_up_to_the_limit(self) -> None:
        due, now = utc("2026-01-10 11:50"), utc("2026-01-10 12:07:30")
        ticks = due_ticks("*/5 * * * *", "UTC", due, now, "backfill", 10)
        assert ticks == [utc(f"2026-01-10 {t}") for t in ("11:50", "11:55", "12:00", "12:05")]
        assert due_ticks("*/5 * * * *", "UTC", due, now, "backfill", 2) == ticks[-2:]

    def test_a_due_time_off_the_cron_grid_runs_once_at_that_time(self) -> None:
        # A row whose next_run_at was moved by hand between two ticks.
        due, now = utc("2026-01-10 12:06:10"), utc("2026-01-10 12:07:30")
        assert due_ticks("*/5 * * * *", "UTC", due, now, "backfill", 10) == [due]


class TestValidation:
    @pytest.mark.parametrize(
        ("expression", "message"),
        [
            ("* * * *", "five are needed"),
            ("* * * * * *", "five are needed"),
            ("61 * * * *", "not a valid cron"),
            ("@reboot", "not a valid cron"),
            ("0 0 30 2 *", "never fires"),
            ("", "non-empty string"),
            (5, "non-empty string"),
        ],
    )
    def test_bad_cron_expressions_are_refused(self, expression: Any, message: str) -> None:
        with pytest.raises(InvalidCron, match=message):
            Cron(expression)

    @pytest.mark.parametrize(
        ("options", "message"),
        [
            ({"timezone": "Mars/Olympus"}, "Unknown timezone"),
            ({"on_missed": "later"}, "on_missed"),
            ({"on_missed": "backfill", "backfill_limit": 0}, "at least 1"),
            ({"backfill_limit": "3"}, "whole number"),
            ({"delay": 5}, "Unknown schedule options delay"),
        ],
    )
    def test_bad_schedule_options_are_refused(self, options: dict, message: str) -> None:
        with pytest.raises(InvalidCron, match=message):
            Cron("* * * * *", **options)

    def test_aliases_and_spacing_are_accepted(self) -> None:
        assert Cron("@hourly").expression == "@hourly"
        assert Cron("  */5   *  * * * ").expression == "*/5 * * * *"

    def test_a_settings_schedule_is_validated_like_an_enqueue(self) -> None:
        for entry, message in [
            ({"cron": "* * * * *"}, "needs 'kind'"),
            ({"kind": "tests.record", "cron": "* * * * *", "priority": 500}, "'bad': Priority"),
            ({"kind": "", "cron": "* * * * *"}, "kind"),
            ({"kind": "tests.record", "cron": "* * * * *", "payload": {"x": float("nan")}}, "JSON"),
            ("* * * * *", "must be a dict"),
        ]:
            with declare(bad=entry), pytest.raises(InvalidJobOption, match=message):
                declared_schedules()

    def test_the_system_check_reports_a_bad_declaration(self) -> None:
        with declare(bad={"kind": "tests.record", "cron": "* * *"}):
            errors = [e for e in checks.run_checks() if e.id == "pgjobs.E003"]
        assert len(errors) == 1 and "five are needed" in errors[0].msg
        with declare(good=EVERY_MINUTE):
            assert not [e for e in checks.run_checks() if e.id == "pgjobs.E003"]

    def test_a_decorated_schedule_is_checked_at_decoration(self) -> None:
        with pytest.raises(InvalidCron, match="five are needed"):
            job(name="tests.bad_schedule", schedule="* *")(lambda: None)
        with pytest.raises(InvalidCron, match="cron expression or a Cron"):
            job(name="tests.bad_schedule", schedule=60)(lambda: None)  # type: ignore[arg-type]
        assert registry.get_definition("tests.bad_schedule") is None


@pytest.fixture
def decorated() -> Iterator[str]:
    """A job kind with a schedule of its own, unregistered afterwards."""

    @job(name="tests.nightly", schedule=Cron("0 3 * * *", timezone="Europe/Paris", priority=5))
    def nightly() -> None:
        return None

    try:
        yield "tests.nightly"
    finally:
        registry.unregister("tests.nightly")


class TestSync:
    def test_declarations_become_rows_due_at_their_next_tick_by_the_database_clock(
        self, decorated: str
    ) -> None:
        with declare(every_minute=EVERY_MINUTE):
            result = Scheduler().sync()
        assert (result.added, result.changed, result.retired) == (2, 0, 0)
        rows = {s.name: s for s in Schedule.objects.all()}
        assert set(rows) == {"every_minute", decorated}
        assert rows[decorated].kind == decorated and rows[decorated].options == {"priority": 5}
        assert rows["every_minute"].payload == {"label": "tick"}
        until = scalar(
            "SELECT extract(epoch FROM next_run_at - now()) FROM pgjobs_schedule WHERE name = %s",
            ["every_minute"],
        )
        assert 0 < until <= 60
        assert rows["every_minute"].next_run_at.second == 0

    def test_sync_again_changes_nothing_and_keeps_the_next_tick(self) -> None:
        with declare(every_minute=EVERY_MINUTE):
            Scheduler().sync()
            move_next_run("every_minute", "now() + interval '1 hour'")
            before = Schedule.objects.get().next_run_at
            result = Scheduler().sync()
        assert (result.added, result.changed, result.retired) == (0, 0, 0)
        assert Schedule.objects.get().next_run_at == before

    def test_a_new_payload_keeps_the_tick_and_a_new_cron_starts_afresh(self) -> None:
        with declare(s=EVERY_MINUTE):
            Scheduler().sync()
        move_next_run("s", "now() + interval '1 hour'")
        far = Schedule.objects.get().next_run_at
        with declare(s={**EVERY_MINUTE, "payload": {"label": "new"}}):
            assert Scheduler().sync().changed == 1
        schedule = Schedule.objects.get()
        assert schedule.payload == {"label": "new"} and schedule.next_run_at == far
        with declare(s={**EVERY_MINUTE, "cron": "0 * * * *"}):
            assert Scheduler().sync().changed == 1
        schedule = Schedule.objects.get()
        assert schedule.cron == "0 * * * *" and schedule.next_run_at < far
        assert schedule.next_run_at.minute == 0

    def test_a_schedule_no_longer_declared_is_disabled_and_kept(self) -> None:
        with declare(keep=EVERY_MINUTE, drop=EVERY_MINUTE):
            Scheduler().sync()
        execute("UPDATE pgjobs_schedule SET runs = 7 WHERE name = 'drop'")
        with declare(keep=EVERY_MINUTE):
            assert Scheduler().sync().retired == 1
        dropped = Schedule.objects.get(name="drop")
        assert (dropped.enabled, dropped.declared, dropped.runs) == (False, False, 7)
        move_next_run("drop", "now() - interval '1 hour'")
        with declare(keep=EVERY_MINUTE):
            Scheduler().run_due()
        assert count() == 0  # a retired schedule never fires
        with declare(keep=EVERY_MINUTE, drop=EVERY_MINUTE):  # declared again: runs again
            Scheduler().sync()
        dropped = Schedule.objects.get(name="drop")
        assert (dropped.enabled, dropped.declared, dropped.runs) == (True, True, 7)

    def test_a_schedule_disabled_by_an_operator_stays_disabled_across_syncs(self) -> None:
        with declare(s=EVERY_MINUTE):
            Scheduler().sync()
            assert Schedule.objects.disable(["s"]) == 1
            Scheduler().sync()
            assert Schedule.objects.get().enabled is False
            assert Scheduler().enable(["s"]) == 1
        assert Schedule.objects.get().enabled is True

    def test_two_declarations_of_one_name_are_refused(self, decorated: str) -> None:
        with (
            declare(**{decorated: EVERY_MINUTE}),
            pytest.raises(InvalidCron, match="declared both"),
        ):
            declared_schedules()


class TestFiring:
    def test_exactly_one_job_per_tick_across_four_replicas(self, monkeypatch: Any) -> None:
        """Four replicas evaluate the schedule without pause while the test moves its
        next_run_at into the past, tick after tick: each tick enqueues one job. (Every
        minute, the minute's own tick came too when the test crossed a minute: 26 of 25.)"""
        ticks = 25
        fired: list[list[int]] = []
        real_fire = Schedule.objects.fire

        def fire(*args: Any, **kwargs: Any) -> list[int]:
            job_ids = real_fire(*args, **kwargs)
            fired.append(job_ids)
            return job_ids

        monkeypatch.setattr(Schedule.objects, "fire", fire)
        stop = threading.Event()
        with declare(s=YEARLY):
            Scheduler().sync()

            def replica(index: int) -> None:
                if index == 0:  # the driver: one tick at a time
                    try:
                        for tick in range(1, ticks + 1):
                            move_next_run("s", f"now() - interval '{tick} seconds'")
                            wait_until(lambda tick=tick: count() >= tick, timeout=20)
                    finally:
                        stop.set()
                    return
                scheduler = Scheduler()
                while not stop.is_set():
                    scheduler.run_due()

            run_threads(5, replica)
        enqueued = jobs_of()
        assert len(enqueued) == ticks  # one job per tick
        schedule = Schedule.objects.get()
        assert schedule.runs == ticks and schedule.last_job_id == max(i for i, _ in enqueued)
        lost = [ids for ids in fired if not ids]
        assert lost, "the replicas never raced for a tick"
        assert [len(ids) for ids in fired if ids] == [1] * ticks

    @pytest.mark.parametrize("skew", [timedelta(days=3), -timedelta(hours=5)])
    def test_a_skewed_python_clock_changes_nothing(self, skew: timedelta) -> None:
        with (
            declare(s={**EVERY_MINUTE, "cron": "*/5 * * * *"}),
            time_machine.travel(datetime.now(UTC) + skew, tick=True),
        ):
            Scheduler().sync()
            until = scalar("SELECT extract(epoch FROM next_run_at - now()) FROM pgjobs_schedule")
            assert 0 < until <= 300  # the next tick by the database's clock
            run_threads(4, lambda i: Scheduler().run_due())
            assert count() == 0  # not due by the database's clock, whatever Python says
            move_next_run("s", "date_bin('5 minutes', now(), '2000-01-01') - interval '1 hour'")
            run_threads(4, lambda i: Scheduler().run_due())
        [(_, run_after)] = jobs_of()
        latest = scalar("SELECT date_bin('5 minutes', now(), '2000-01-01')")
        assert run_after == latest
        assert scalar("SELECT next_run_at - %s FROM pgjobs_schedule", [latest]) == timedelta(
            minutes=5
        )

    @pytest.mark.parametrize(
        ("on_missed", "limit", "expected"),
        [("skip", 10, 1), ("backfill", 5, 5), ("backfill", 100, 13)],
    )
    def test_after_downtime_skip_runs_once_and_backfill_runs_each_tick(
        self, on_missed: str, limit: int, expected: int
    ) -> None:
        entry = {
            **EVERY_MINUTE,
            "cron": "*/5 * * * *",
            "on_missed": on_missed,
            "backfill_limit": limit,
        }
        with declare(s=entry):
            Scheduler().sync()
            # Down for an hour: due at the tick an hour ago; 13 ticks have passed since.
            move_next_run("s", "date_bin('5 minutes', now(), '2000-01-01') - interval '1 hour'")
            run_threads(4, lambda i: Scheduler().run_due())
        latest = scalar("SELECT date_bin('5 minutes', now(), '2000-01-01')")
        run_afters = [run_after for _, run_after in jobs_of()]
        assert run_afters == [latest - timedelta(minutes=5 * i) for i in reversed(range(expected))]
        schedule = Schedule.objects.get()
        assert schedule.runs == expected and schedule.last_run_at == latest
        assert schedule.next_run_at == latest + timedelta(minutes=5)

    def test_the_jobs_carry_the_schedules_payload_and_options(self) -> None:
        entry = {**EVERY_MINUTE, "queue": "cron", "priority": 7, "max_attempts": 2, "lease": 90}
        with declare(s=entry):
            Scheduler().sync()
            move_next_run("s", "now() - interval '1 second'")
            Scheduler().run_due()
        [(job_id, _)] = jobs_of()
        assert row(job_id, "queue", "priority", "max_attempts", "lease_s", "payload") == (
            "cron",
            7,
            2,
            90,
            {"label": "tick"},
        )

    def test_a_keyed_schedule_coalesces_ticks_whose_job_has_not_run(self) -> None:
        with declare(s={**EVERY_MINUTE, "key": "report"}):
            Scheduler().sync()
            for seconds in (3, 2):
                move_next_run("s", f"now() - interval '{seconds} seconds'")
                Scheduler().run_due()
        assert count() == 1
        assert Schedule.objects.get().runs == 2

    def test_run_due_says_how_long_until_the_next_tick(self) -> None:
        with declare(s=EVERY_MINUTE):
            assert Scheduler().run_due() is None  # nothing synced yet
            Scheduler().sync()
            move_next_run("s", "now() + interval '42 seconds'")
            assert 40 < Scheduler().run_due() <= 42

    def test_a_row_edited_into_nonsense_is_disabled_not_crashed_on(self) -> None:
        with declare(s=EVERY_MINUTE, t=EVERY_MINUTE):
            Scheduler().sync()
            execute("UPDATE pgjobs_schedule SET cron = 'not a cron' WHERE name = 's'")
            execute("UPDATE pgjobs_schedule SET options = '{\"priority\": 1000}' WHERE name = 't'")
            move_next_run("s", "now() - interval '1 second'")
            move_next_run("t", "now() - interval '1 second'")
            Scheduler().run_due()
        assert count() == 0
        assert set(Schedule.objects.filter(enabled=False).values_list("name", flat=True)) == {
            "s",
            "t",
        }

    def test_run_now_enqueues_a_job_and_keeps_the_next_tick(self) -> None:
        with declare(s=EVERY_MINUTE):
            Scheduler().sync()
        before = Schedule.objects.get().next_run_at
        [job_id] = Schedule.objects.run_now(["s"])
        schedule = Schedule.objects.get()
        assert (schedule.next_run_at, schedule.last_job_id, schedule.runs) == (before, job_id, 1)
        assert scalar("SELECT run_after <= now() FROM pgjobs_job WHERE id = %s", [job_id])


class TestInTheWorker:
    def test_the_worker_syncs_and_runs_a_due_schedule(self) -> None:
        with declare(s=EVERY_MINUTE), running_worker(poll_interval=0.3):
            wait_until(lambda: Schedule.objects.filter(name="s").exists())
            move_next_run("s", "now() - interval '1 second'")
            wait_until(lambda: count("tests_note") == 1)
        assert execute("SELECT text FROM tests_note") == [("tick",)]

    def test_a_burst_worker_runs_no_schedule(self) -> None:
        with declare(s=EVERY_MINUTE):
            from django_pgjobs.worker import Worker

            assert Worker(burst=True).options.schedules is False
            assert Worker().options.schedules is True
        with override_settings(PGJOBS={"SCHEDULER": False}):
            assert Worker().options.schedules is False


class TestJobsctlSchedules:
    def test_lists_every_schedule_with_its_state(self) -> None:
        out = StringIO()
        call_command("jobsctl", "schedules", stdout=out)
        assert "No schedules" in out.getvalue()
        with declare(a=EVERY_MINUTE, b={**EVERY_MINUTE, "timezone": "Asia/Tokyo"}):
            Scheduler().sync()
        Schedule.objects.disable(["b"])
        out = StringIO()
        call_command("jobsctl", "schedules", stdout=out)
        lines = out.getvalue().splitlines()
        assert lines[0].split()[:4] == ["schedule", "kind", "cron", "timezone"]
        a = next(line for line in lines if line.startswith("a "))
        b = next(line for line in lines if line.startswith("b "))
        assert "enabled" in a and "UTC" in a
        assert "disabled" in b and "Asia/Tokyo" in b
