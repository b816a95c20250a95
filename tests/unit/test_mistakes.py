"""The newcomer's mistakes explain themselves (issue 31): each test pins the exact words
a user reads — a payload that does not fit (every wrong name at once, with the likely
one), a positional call, a job kept where workers do not look, an enqueue before
`migrate`, and the system checks that say so first."""

from __future__ import annotations

import logging
from collections.abc import Iterator

import pytest

from django_pgjobs import job, registry
from django_pgjobs.checks import check_job_modules, check_migrations_applied
from django_pgjobs.exceptions import InvalidPayload, JobTablesMissing
from django_pgjobs.models import Job
from django_pgjobs.payloads import encode_payload
from tests import jobs
from tests.helpers import count, execute

pytestmark = pytest.mark.django_db


class TestPayloadMistakes:
    def test_a_misspelt_argument_is_named_with_the_likely_one_and_the_missing_one_too(
        self,
    ) -> None:
        with pytest.raises(InvalidPayload) as caught:
            Job.objects.enqueue("tests.keyed", {"acount": 1, "version": 2})
        assert str(caught.value) == (
            "Payload does not fit the handler of tests.keyed: unexpected keyword argument "
            "'acount' (did you mean 'account'?); missing a required argument: 'account'. "
            "Nothing was written."
        )
        assert count() == 0

    def test_every_mistake_of_one_payload_is_named_at_once(self) -> None:
        with pytest.raises(InvalidPayload) as caught:
            jobs.shaped.enqueue(aa=1, zz=2)
        assert str(caught.value) == (
            "Payload does not fit the handler of tests.shaped: unexpected keyword argument "
            "'aa' (did you mean 'a'?); unexpected keyword argument 'zz'; missing a required "
            "argument: 'a'; missing a required argument: 'c'. Nothing was written."
        )

    def test_a_positional_call_says_the_payload_is_keyword_arguments(self) -> None:
        with pytest.raises(InvalidPayload) as caught:
            jobs.keyed.enqueue(1, 2)  # type: ignore[call-arg]
        assert str(caught.value) == (
            "tests.keyed.enqueue() takes the payload as keyword arguments, not 2 "
            "positional: keyed.enqueue(account=..., version=...). Nothing was written."
        )
        assert count() == 0

    def test_a_value_that_is_not_json_is_named_with_its_article(self) -> None:
        with pytest.raises(InvalidPayload, match=r"payload\['when'\] is an object, which"):
            encode_payload({"when": object()})
        with pytest.raises(InvalidPayload, match=r"payload\['at'\] is a set, which"):
            encode_payload({"at": {1}})


@pytest.fixture
def stray_kind() -> Iterator[str]:
    """A kind registered after the app was ready, as a view importing shop/tasks.py
    registers one: the workers, which import what ready() does, never see it."""

    @job(name="tests.stray")
    def stray(order_id: int) -> None:
        return None

    try:
        yield "tests.stray"
    finally:
        registry.unregister("tests.stray")


class TestJobsWhereWorkersDoNotLook:
    def test_the_check_names_the_kind_and_its_module_and_says_where_to_put_it(
        self, stray_kind: str
    ) -> None:
        (warning,) = [m for m in check_job_modules() if stray_kind in m.msg]
        assert warning.id == "pgjobs.W014"
        assert warning.msg == (
            "Job kind(s) 'tests.stray' live in tests.unit.test_mistakes, a module no app loads "
            "(a view imported it here): a worker knows them only if it happens to import that "
            "module too, and otherwise fails their jobs with 'unknown job kind' (workers know "
            "the @job functions of every installed app's jobs.py, of the modules in "
            "PGJOBS['JOB_MODULES'] and of runjobs --import)."
        )
        assert warning.hint == (
            "Move them to a jobs.py module of their app, or add 'tests.unit.test_mistakes' "
            "to PGJOBS['JOB_MODULES']."
        )

    def test_kinds_of_jobs_modules_raise_no_warning(self) -> None:
        assert check_job_modules() == []

    def test_a_kind_an_apps_ready_imports_is_known_to_every_process(
        self, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        """Registered while the apps load (an app listed after django_pgjobs whose
        ready() imports its job module): every process, a worker too, imports it."""
        from django.apps import apps

        monkeypatch.setattr(apps, "ready", False)

        @job(name="tests.loaded_by_ready")
        def loaded(order_id: int) -> None:
            return None

        monkeypatch.setattr(apps, "ready", True)
        try:
            assert registry.undiscovered_module("tests.loaded_by_ready") is None
            assert not [m for m in check_job_modules() if "tests.loaded_by_ready" in m.msg]
        finally:
            registry.unregister("tests.loaded_by_ready")

    def test_its_first_enqueue_warns_once_that_workers_will_not_know_it(
        self, stray_kind: str, caplog: pytest.LogCaptureFixture
    ) -> None:
        with caplog.at_level(logging.WARNING, logger="django_pgjobs.enqueue"):
            Job.objects.enqueue(stray_kind, {"order_id": 1})
            Job.objects.enqueue(stray_kind, {"order_id": 2})
        (said,) = [r.getMessage() for r in caplog.records if stray_kind in r.getMessage()]
        assert said.startswith(
            "enqueued a job of kind 'tests.stray', defined in tests.unit.test_mistakes, a "
            "module no app loads: a worker knows it only if it happens to import that module "
            "too, and otherwise fails it with 'unknown job kind'"
        )
        assert "add 'tests.unit.test_mistakes' to PGJOBS['JOB_MODULES']" in said


ENQUEUES = {
    "enqueue": lambda: Job.objects.enqueue("tests.plain", {"value": 1}),
    "enqueue_many": lambda: Job.objects.enqueue_many([{"kind": "tests.plain"}] * 3),
}


class TestBeforeMigrate:
    @pytest.mark.parametrize("enqueue", list(ENQUEUES))
    @pytest.mark.parametrize(
        ("change", "said"),
        [
            ("ALTER TABLE pgjobs_job RENAME TO pgjobs_job_elsewhere", 'relation "pgjobs_job"'),
            (
                "ALTER TABLE pgjobs_job DROP COLUMN trace_context",
                'column "trace_context" of relation "pgjobs_job"',
            ),
        ],
        ids=["no-tables", "older-tables"],
    )
    def test_an_enqueue_says_to_migrate_and_stays_a_programming_error(
        self, change: str, said: str, enqueue: str
    ) -> None:
        from django.db import ProgrammingError

        execute(change)  # undone with the test's transaction
        with pytest.raises(JobTablesMissing) as caught:
            ENQUEUES[enqueue]()
        assert isinstance(caught.value, ProgrammingError)
        assert str(caught.value) == (
            "The job tables of this database do not match this version of django_pgjobs "
            f"({said} does not exist): the app's migrations are not applied. Run: python "
            "manage.py migrate django_pgjobs"
        )

    def test_an_error_about_another_table_is_left_as_it_is(self) -> None:
        from django.db import ProgrammingError

        from django_pgjobs.db import connection as db

        with pytest.raises(ProgrammingError) as caught:
            db.fetchall("SELECT * FROM orders_that_do_not_exist", {}, None)
        assert not isinstance(caught.value, JobTablesMissing)

    def test_the_migrations_check_is_silent_when_they_are_applied(self) -> None:
        assert check_migrations_applied() == []

    def test_the_migrations_check_takes_a_connect_timeout_of_the_projects_options(
        self,
    ) -> None:
        from django.db import connections

        options = connections["default"].settings_dict["OPTIONS"]
        options["connect_timeout"] = 10
        try:
            assert check_migrations_applied() == []  # read, not refused: it ran
        finally:
            options.pop("connect_timeout")

    @pytest.mark.django_db(transaction=True)
    def test_the_migrations_check_is_not_said_by_migrate_itself(
        self, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        """(Committed: the check reads on a connection of its own.)"""
        row = execute(
            "DELETE FROM django_migrations WHERE app = 'django_pgjobs' "
            "AND name = '0012_trace_context' RETURNING app, name, applied"
        )
        try:
            self.check_without_the_last(monkeypatch)
        finally:
            execute(
                "INSERT INTO django_migrations (app, name, applied) VALUES (%s, %s, %s)", row[0]
            )

    def check_without_the_last(self, monkeypatch: pytest.MonkeyPatch) -> None:
        (warning,) = check_migrations_applied()
        assert warning.id == "pgjobs.W013"
        assert warning.msg == (
            "django_pgjobs has 1 unapplied migration(s) in database 'default' (the last: "
            "0012_trace_context): enqueues fail until they are applied."
        )
        monkeypatch.setattr("sys.argv", ["manage.py", "migrate"])
        assert check_migrations_applied() == []


def test_a_worker_that_knows_no_kind_says_so_as_it_starts(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    from django_pgjobs.worker import announce

    monkeypatch.setattr(registry, "_definitions", {})
    with caplog.at_level(logging.INFO, logger="django_pgjobs.worker"):
        announce.kinds()
    assert caplog.messages == [
        "this worker knows no job kind: every job it claims fails with 'unknown job kind'. "
        "Workers know the @job functions of every installed app's jobs.py, of the modules in "
        "PGJOBS['JOB_MODULES'] and of runjobs --import; put @job functions in a jobs.py "
        "module of an installed app."
    ]
