"""The first hour of a project: mistakes caught where they are made (S28), kinds that no
worker would run, queues that no worker serves, schedules across a change of the clocks,
and the helper that runs a test's jobs in the test."""

from __future__ import annotations

import itertools
import logging
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from django.core import checks
from django.test import override_settings
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from django_pgjobs.exceptions import InvalidKind, InvalidPayload
from django_pgjobs.models import Job
from django_pgjobs.schedules import due_ticks, next_tick, runs_at_wall_time
from django_pgjobs.testing import run_jobs
from django_pgjobs.worker import default_queues
from django_pgjobs.worker.executor import unknown_kind_error
from tests import jobs
from tests.helpers import count, dead_row, execute, row

pytestmark = pytest.mark.django_db


class TestS28APayloadThatDoesNotFitIsRefusedAtEnqueue:
    def test_s28_a_misspelt_argument_is_refused_and_nothing_is_written(self) -> None:
        with pytest.raises(InvalidPayload, match="unexpected keyword argument 'lable'"):
            jobs.record.enqueue(lable="x")
        with pytest.raises(InvalidPayload, match="missing a required argument: 'version'"):
            Job.objects.enqueue("tests.keyed", {"account": 1})
        assert count() == 0

    def test_s28_enqueue_many_refuses_before_anything_is_sent(self) -> None:
        many: list[dict[str, Any]] = [
            {"kind": "tests.plain", "payload": {"value": n}} for n in range(10)
        ]
        many[5]["payload"] = {"valeu": 5}
        with pytest.raises(InvalidPayload, match=r"jobs\[5\]: .*'valeu'"):
            Job.objects.enqueue_many(many)
        assert count() == 0

    def test_s28_a_keyword_only_argument_must_be_given_by_name(self) -> None:
        with pytest.raises(InvalidPayload, match="missing a required argument: 'c'"):
            jobs.shaped.enqueue(a=1)
        assert jobs.shaped.enqueue(a=1, c=2).inserted

    @settings(max_examples=60, suppress_health_check=[HealthCheck.function_scoped_fixture])
    @given(st.sets(st.sampled_from(["a", "b", "c", "ctx", "d", "A", "a "]), max_size=5))
    def test_s28_any_set_of_argument_names_fits_or_is_refused(self, names: set[str]) -> None:
        """The oracle: `shaped(a, b=1, *, c)` takes a and c, may take b, takes nothing else."""
        payload = dict.fromkeys(names, 1)
        fits = {"a", "c"} <= names <= {"a", "b", "c"}
        before = count()
        try:
            Job.objects.enqueue("tests.shaped", payload)
        except InvalidPayload as error:
            assert not fits and "does not fit the handler of tests.shaped" in str(error)
            assert count() == before
        else:
            assert fits and count() == before + 1


class TestKindsNoWorkerRuns:
    def test_an_unknown_kind_is_accepted_and_warned_about_once_with_the_likely_name(
        self, caplog: pytest.LogCaptureFixture
    ) -> None:
        with caplog.at_level(logging.WARNING, logger="django_pgjobs.enqueue"):
            first = Job.objects.enqueue("tests.recrod", {"label": "x"})
            Job.objects.enqueue("tests.recrod", {"label": "y"})
            Job.objects.enqueue_many([{"kind": "tests.recrod"}] * 3)
        assert first.inserted and count(where="kind = 'tests.recrod'") == 5
        warnings = [r.getMessage() for r in caplog.records if "tests.recrod" in r.getMessage()]
        assert len(warnings) == 1
        assert "Did you mean 'tests.record'" in warnings[0]

    def test_strict_kinds_refuses_an_unknown_kind_and_writes_nothing(self) -> None:
        with override_settings(PGJOBS={"STRICT_KINDS": True}):
            with pytest.raises(InvalidKind, match=r"Did you mean 'tests\.record'"):
                Job.objects.enqueue("tests.recrod")
            with pytest.raises(InvalidKind, match="STRICT_KINDS"):
                Job.objects.enqueue_many([{"kind": "tests.plain"}, {"kind": "nobody.owns"}])
            assert Job.objects.enqueue("tests.plain", {"value": 1}).inserted
        assert count() == 1

    def test_check_deploy_says_whether_strict_kinds_is_on(self) -> None:
        def said() -> str:
            found = checks.run_checks(include_deployment_checks=True)
            return next(m.msg for m in found if m.id == "pgjobs.I001")

        assert "is off" in said()
        with override_settings(PGJOBS={"STRICT_KINDS": True}):
            assert "is on" in said()

    def test_s25_the_workers_error_for_an_unknown_kind_says_what_to_do(self) -> None:
        error = unknown_kind_error("tests.recrod")
        assert error.startswith("unknown job kind 'tests.recrod': ")
        assert "restart the workers" in error and "did you mean 'tests.record'" in error
        assert "did you mean" not in unknown_kind_error("zzz.qqq.xxx")


class TestQueuesThatAreServed:
    def test_default_queues_include_the_tasks_backends_queues(self) -> None:
        tasks = {
            "default": {"BACKEND": "django_pgjobs.backend.PgJobsBackend", "QUEUES": ["mail"]},
            "other": {"BACKEND": "django.tasks.backends.dummy.DummyBackend", "QUEUES": ["x"]},
        }
        with override_settings(TASKS=tasks):
            queues = default_queues()
        assert "mail" in queues and "x" not in queues
        assert "poison" in default_queues()  # named by a registered job's decorator


PARIS = "Europe/Paris"


class TestSchedulesAcrossAChangeOfTheClocks:
    def test_a_fixed_time_runs_once_on_the_day_the_clocks_go_back(self) -> None:
        after = datetime(2026, 10, 24, 12, tzinfo=UTC)
        ticks = []
        for _ in range(3):
            after = next_tick("30 2 * * *", PARIS, after)
            ticks.append(after)
        # 02:30 happens twice on 25 October (+02:00, then +01:00): only the first runs.
        assert ticks == [
            datetime(2026, 10, 25, 0, 30, tzinfo=UTC),
            datetime(2026, 10, 26, 1, 30, tzinfo=UTC),
            datetime(2026, 10, 27, 1, 30, tzinfo=UTC),
        ]

    def test_a_missing_time_runs_once_when_the_clocks_jump(self) -> None:
        after = datetime(2026, 3, 28, 12, tzinfo=UTC)
        first = next_tick("30 2 * * *", PARIS, after)
        assert first == datetime(2026, 3, 29, 1, 0, tzinfo=UTC)  # 03:00+02:00
        assert next_tick("30 2 * * *", PARIS, first) == datetime(2026, 3, 30, 0, 30, tzinfo=UTC)

    def test_a_backfill_across_the_repeated_hour_runs_each_day_once(self) -> None:
        ticks = due_ticks(
            "30 2 * * *",
            PARIS,
            datetime(2026, 10, 24, 0, 30, tzinfo=UTC),
            datetime(2026, 10, 26, 3, 0, tzinfo=UTC),
            "backfill",
            10,
        )
        assert [tick.date().day for tick in ticks] == [24, 25, 26]

    def test_an_hour_wildcard_keeps_to_real_time(self) -> None:
        after = datetime(2026, 10, 25, 0, 0, tzinfo=UTC)
        ticks = []
        for _ in range(4):
            after = next_tick("*/30 * * * *", PARIS, after)
            ticks.append(after)
        assert [b - a for a, b in itertools.pairwise(ticks)] == [timedelta(minutes=30)] * 3
        assert runs_at_wall_time("0 9 * * 1-5") and runs_at_wall_time("@daily")
        assert not runs_at_wall_time("0 */2 * * *") and not runs_at_wall_time("@hourly")


class TestRunJobsInATest:
    def test_run_jobs_runs_what_the_test_enqueued_in_its_own_transaction(self) -> None:
        done = jobs.plain.using(result_retention=60).enqueue(value=21).id
        doomed = jobs.misbehave.enqueue(how="fail").id
        later = jobs.misbehave.enqueue(how="retry").id
        stats = run_jobs()
        assert row(done, "state", "result") == ("done", 42)
        assert dead_row(doomed, "reason") == ("hopeless",)
        assert row(later, "state", "attempts") == ("pending", 1)  # retried in 30 s: waits
        assert (stats.succeeded, stats.dead, stats.retried) == (1, 1, 1)

    def test_run_jobs_goes_on_while_the_jobs_make_more_work(self) -> None:
        jobs.chain.enqueue(left=3)
        stats = run_jobs()
        notes = execute("SELECT text FROM tests_note ORDER BY id")
        assert notes == [("chain 3",), ("chain 2",), ("chain 1",), ("chain 0",)]
        assert stats.succeeded == 4 and count() == 0

    def test_run_jobs_runs_transaction_mode_and_fenced_jobs_too(self) -> None:
        jobs.atomic_write.enqueue(text="exactly once")
        jobs.fenced_record.enqueue(label="fenced")
        run_jobs()
        texts = {text for (text,) in execute("SELECT text FROM tests_note")}
        assert texts == {"exactly once", "fenced"} and count() == 0
