"""django.tasks to the letter (issue 16): a result reads back the very task it was
enqueued with, from any process; errors name what Django's backends name; task_finished
comes once the outcome is saved, however the attempt ended; a reader without a task's
module still reads its result (docs/tasks.md)."""

from __future__ import annotations

import json
import sys
import uuid
from collections.abc import Iterator, Mapping
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from django.test import override_settings
from django.utils import timezone
from hypothesis import HealthCheck, assume, event, given, settings
from hypothesis import strategies as st

from django_pgjobs import registry
from django_pgjobs.compat import (
    InvalidTask,
    TaskResultDoesNotExist,
    TaskResultMismatch,
    TaskResultStatus,
    normalize_json,
    task_backends,
    task_finished,
)
from django_pgjobs.models import Job
from django_pgjobs.task_payloads import TASK_OPTIONS
from django_pgjobs.worker import Worker
from tests import tasks
from tests.helpers import dead_row, execute, row, scalar

pytestmark = pytest.mark.django_db(transaction=True)

QUEUES = ["default", "tasks"]
UNLOADED = "tests.unloaded_tasks"
TWO_BACKENDS = {
    "default": {
        "BACKEND": "django_pgjobs.backend.PgJobsBackend",
        "QUEUES": [],
        "OPTIONS": {"RESULT_RETENTION": 3600},
    },
    "other": {
        "BACKEND": "django_pgjobs.backend.PgJobsBackend",
        "QUEUES": [],
        "OPTIONS": {"RESULT_RETENTION": 3600},
    },
}


def work() -> Worker:
    worker = Worker(queues=QUEUES, burst=True, concurrency=1, sweep_interval=0)
    assert worker.run() == 0
    return worker


def make_all_due() -> None:
    execute("UPDATE pgjobs_job SET run_after = now() - interval '1 s' WHERE state = 'pending'")


@pytest.fixture
def finished() -> Iterator[list[dict[str, Any]]]:
    """What every task_finished receiver saw: the result sent, and get_result() then."""
    seen: list[dict[str, Any]] = []

    def receiver(sender: type, task_result: Any, **kwargs: Any) -> None:
        try:
            read = task_result.task.get_backend().get_result(task_result.id)
        except TaskResultDoesNotExist:  # not kept (no result retention)
            read = None
        seen.append({"sent": task_result, "read": read, "exc_info": sys.exc_info()[0]})

    task_finished.connect(receiver)
    try:
        yield seen
    finally:
        task_finished.disconnect(receiver)


# 1. TaskResult.task is the task the result was enqueued with ------------------------------


def test_a_result_reads_back_the_variant_it_was_enqueued_with() -> None:
    later = timezone.now() + timedelta(hours=1)
    variant = tasks.note.using(priority=20, run_after=later, queue_name="default")
    enqueued = variant.enqueue("twenty")
    tasks.note.using(priority=-2)  # the latest variant this process made: not the result's
    tasks.note.using(priority=-3).enqueue("minus three")

    read = tasks.note.get_result(enqueued.id)
    assert read.task == variant
    assert (read.task.priority, read.task.queue_name, read.task.run_after) == (
        20,
        "default",
        later,
    )
    assert read == enqueued  # Django's own test_get_result: the same result, field by field
    assert tasks.note.get_result(enqueued.id).task.using() == variant


def test_the_worker_runs_a_task_with_the_variant_it_was_enqueued_with() -> None:
    just_now = timezone.now() - timedelta(seconds=1)
    variant = tasks.describe_variant.using(priority=20, run_after=just_now, queue_name="tasks")
    enqueued = variant.enqueue()
    tasks.describe_variant.using(priority=-2)  # a later variant must not leak into the run
    work()
    read = tasks.describe_variant.get_result(enqueued.id)
    assert read.status == TaskResultStatus.SUCCESSFUL, read.errors
    assert read.return_value == {
        "priority": 20,
        "queue_name": "tasks",
        "run_after": just_now.isoformat(),
        "backend": "default",
        "result_backend": "default",
    }
    assert read.task == variant


def test_the_job_stores_the_tasks_own_options_beside_its_arguments() -> None:
    later = timezone.now() + timedelta(minutes=5)
    enqueued = tasks.add.using(priority=7, run_after=later).enqueue(1, b=2)
    (payload,) = row(int(enqueued.id), "payload")
    assert payload == {
        "args": [1],
        "kwargs": {"b": 2},
        "task": {
            "priority": 7,
            "queue_name": "default",
            "run_after": later.isoformat(),
            "backend": "default",
        },
    }


def test_a_job_written_before_tasks_stored_their_options_still_runs_and_reads() -> None:
    """Rows enqueued by an earlier version hold only args and kwargs: the task is the
    decorator's, with the row's own queue and priority."""
    job_id = Job.objects.enqueue(
        "tests.tasks.add",
        {"args": [2, 3], "kwargs": {}},
        queue="tasks",
        priority=9,
        result_retention=3600,
    ).id
    read = tasks.add.get_result(str(job_id))
    assert (read.task.priority, read.task.queue_name, read.backend) == (9, "tasks", "default")
    assert read.status == TaskResultStatus.READY
    work()
    assert tasks.add.get_result(str(job_id)).return_value == 5


# 2. A return value that is not JSON fails with the encoding error itself -----------------


def test_a_return_value_that_is_not_json_fails_at_once_with_the_encoding_error() -> None:
    enqueued = tasks.returns_a_set.enqueue()
    work()
    read = tasks.returns_a_set.get_result(enqueued.id)
    assert (read.status, read.attempts) == (TaskResultStatus.FAILED, 1)
    (error,) = read.errors
    assert error.exception_class is TypeError
    assert error.exception_class_path == "builtins.TypeError"
    assert error.traceback.endswith("TypeError: Unsupported type: <class 'set'>\n")
    (reason,) = dead_row(int(enqueued.id), "reason")
    assert reason == "result is not JSON: Unsupported type: <class 'set'>"


# 3. task_finished is sent once the outcome is saved ----------------------------------------


def test_task_finished_is_sent_once_the_outcome_is_saved(
    finished: list[dict[str, Any]],
) -> None:
    succeeded = tasks.add.enqueue(1, 2)
    failed = tasks.explode.enqueue()
    retried = tasks.flaky.enqueue(fail_times=1)
    work()
    by_id = {seen["sent"].id: seen for seen in finished}
    assert set(by_id) == {succeeded.id, failed.id, retried.id}
    for seen in finished:
        assert seen["sent"] == seen["read"]  # what get_result() reads at that moment
    assert by_id[succeeded.id]["sent"].status == TaskResultStatus.SUCCESSFUL
    assert by_id[succeeded.id]["sent"].return_value == 3
    assert by_id[failed.id]["sent"].status == TaskResultStatus.FAILED
    assert by_id[retried.id]["sent"].status == TaskResultStatus.READY  # will be retried
    for done in (succeeded, failed):
        assert by_id[done.id]["sent"].finished_at is not None
    assert by_id[failed.id]["exc_info"] is KeyError  # sent inside the error's handler
    assert by_id[succeeded.id]["exc_info"] is None


def test_task_finished_follows_a_task_that_completes_its_own_claim(
    finished: list[dict[str, Any]],
) -> None:
    """Transaction mode records the outcome in the task's own transaction; the signal
    follows its commit."""
    ok = tasks.atomic_note.enqueue("kept")
    failing = tasks.atomic_note.enqueue("undone", explode=True)
    work()
    by_id = {seen["sent"].id: seen for seen in finished}
    assert by_id[ok.id]["sent"].status == TaskResultStatus.SUCCESSFUL
    assert by_id[ok.id]["sent"] == by_id[ok.id]["read"]
    assert by_id[failing.id]["sent"].status == TaskResultStatus.READY
    assert by_id[failing.id]["sent"].errors[0].exception_class is RuntimeError


def test_task_finished_without_result_retention_carries_the_attempts_own_result(
    finished: list[dict[str, Any]],
) -> None:
    """With RESULT_RETENTION None a success leaves no row: task_finished carries the
    attempt's own result, finished by the database's clock."""
    config = {"default": {**TWO_BACKENDS["default"], "OPTIONS": {"RESULT_RETENTION": None}}}
    with override_settings(TASKS=config):
        first, second = tasks.add.enqueue(1, 2), tasks.add.enqueue(3, 4)
        before = scalar("SELECT now()")
        work()
        with pytest.raises(TaskResultDoesNotExist):
            tasks.add.get_result(first.id)
    sent = {seen["sent"].id: seen["sent"] for seen in finished}
    assert [sent[r.id].return_value for r in (first, second)] == [3, 7]
    assert all(sent[r.id].status == TaskResultStatus.SUCCESSFUL for r in (first, second))
    assert all(sent[r.id].finished_at >= before for r in (first, second))


REFUSE_THIRTEEN = """
CREATE FUNCTION pgjobs_test_refuse_13() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    RAISE EXCEPTION 'refused by a test trigger' USING ERRCODE = '22023';
END $$;
CREATE TRIGGER pgjobs_test_refuse_13 BEFORE UPDATE ON pgjobs_job FOR EACH ROW
WHEN (NEW.state = 'done' AND OLD.payload @> '{"args": [13]}')
EXECUTE FUNCTION pgjobs_test_refuse_13();
"""
DROP_REFUSE_THIRTEEN = """
DROP TRIGGER IF EXISTS pgjobs_test_refuse_13 ON pgjobs_job;
DROP FUNCTION IF EXISTS pgjobs_test_refuse_13();
"""


def test_task_finished_follows_outcomes_saved_one_by_one_and_dead_letters(
    finished: list[dict[str, Any]], caplog: pytest.LogCaptureFixture
) -> None:
    """A batch the database refuses is saved job by job, and the job it refuses is
    dead-lettered (S27): each sends task_finished once its own outcome is saved."""
    results = [tasks.add.enqueue(a, 1) for a in (1, 13, 2, 3)]
    execute(REFUSE_THIRTEEN)
    try:
        worker = Worker(queues=QUEUES, burst=True, concurrency=4, sweep_interval=0)
        assert worker.run() == 0
    finally:
        execute(DROP_REFUSE_THIRTEEN)
    assert "recording them one by one" in caplog.text
    by_id = {seen["sent"].id: seen["sent"] for seen in finished}
    assert set(by_id) == {result.id for result in results}
    refused = results[1].id
    assert by_id[refused].status == TaskResultStatus.FAILED
    assert by_id[refused] == tasks.add.get_result(refused)
    assert dead_row(int(refused), "reason")[0].startswith("the outcome could not be stored")
    others = [result.id for result in results if result.id != refused]
    assert [by_id[job_id].return_value for job_id in others] == [2, 3, 4]


def test_a_task_finished_receiver_that_raises_is_logged_and_the_worker_goes_on(
    caplog: pytest.LogCaptureFixture,
) -> None:
    def broken(sender: type, task_result: Any, **kwargs: Any) -> None:
        raise RuntimeError("a broken receiver")

    task_finished.connect(broken)
    try:
        first, second = tasks.add.enqueue(1, 1), tasks.add.enqueue(2, 2)
        worker = work()
    finally:
        task_finished.disconnect(broken)
    assert worker.stats.succeeded == 2
    assert [tasks.add.get_result(r.id).return_value for r in (first, second)] == [2, 4]
    assert "a broken receiver" in caplog.text


# 4. task_finished after KeyboardInterrupt and SystemExit ----------------------------------


@pytest.mark.parametrize(
    ("how", "exception"), [("keyboard", KeyboardInterrupt), ("exit", SystemExit)]
)
def test_task_finished_is_sent_when_a_task_raises_what_ends_processes(
    finished: list[dict[str, Any]], how: str, exception: type[BaseException]
) -> None:
    enqueued = tasks.interrupt.enqueue(how)
    neighbour = tasks.add.enqueue(3, 4)
    work()
    make_all_due()
    work()
    mine = [seen for seen in finished if seen["sent"].id == enqueued.id]
    assert [seen["sent"].status for seen in mine] == [
        TaskResultStatus.READY,
        TaskResultStatus.FAILED,
    ]
    assert all(seen["exc_info"] is exception for seen in mine)
    final = mine[-1]["sent"]
    assert [error.exception_class for error in final.errors] == [exception, exception]
    assert tasks.add.get_result(neighbour.id).return_value == 7  # the worker went on


# 5. TaskResult.backend is the alias the task was enqueued with -----------------------------


def test_a_results_backend_is_the_alias_it_was_enqueued_with() -> None:
    with override_settings(TASKS=TWO_BACKENDS):
        enqueued = tasks.describe_variant.using(backend="other").enqueue()
        assert enqueued.backend == "other"
        read = task_backends["default"].get_result(enqueued.id)
        assert (read.backend, read.task.backend) == ("other", "other")
        work()
        ran = task_backends["default"].get_result(enqueued.id)
    assert ran.return_value["backend"] == "other"
    assert ran.return_value["result_backend"] == "other"


# 6. A reader that has not imported the task's module ---------------------------------------


def test_a_reader_without_the_tasks_module_gets_a_stand_in_and_imports_nothing() -> None:
    from django_pgjobs.exceptions import TaskNotLoaded

    assert UNLOADED not in sys.modules
    kind = f"{UNLOADED}.greet"
    later = timezone.now() + timedelta(hours=1)
    stored_task = {
        "priority": 3,
        "queue_name": "tasks",
        "run_after": later.isoformat(),
        "backend": "default",
    }
    payload = {"args": [], "kwargs": {"name": "ada"}, "task": stored_task}
    job_id = str(Job.objects.enqueue(kind, payload, run_after=later, queue="tasks").id)

    read = task_backends["default"].get_result(job_id)
    assert (read.status, read.kwargs) == (TaskResultStatus.READY, {"name": "ada"})
    assert (read.task.module_path, read.task.name) == (kind, "greet")
    assert (read.task.priority, read.task.queue_name, read.task.run_after) == (3, "tasks", later)
    with pytest.raises(TaskNotLoaded, match=r"tests\.unloaded_tasks\.greet is not loaded"):
        read.task.call(name="ada")
    with pytest.raises(InvalidTask, match="not loaded in this process"):
        read.task.enqueue(name="ada")
    with pytest.raises(TaskResultMismatch):
        tasks.add.get_result(job_id)
    read.refresh()
    assert UNLOADED not in sys.modules
    assert registry.get_definition(kind) is None  # the stand-in is never a handler
    make_all_due()
    work()  # a worker without the module leaves the job to one that has it (S25)
    state, error = row(int(job_id), "state", "last_error")
    assert state == "pending" and error.startswith(f"unknown job kind '{kind}': ")


def test_a_plain_jobs_id_is_no_tasks_result() -> None:
    """A registered plain job, or an unknown kind whose payload is not a task's call,
    reads as no task result at all (never as a stand-in)."""
    from tests import jobs

    plain = str(jobs.noop.enqueue().id)
    unknown = str(Job.objects.enqueue("elsewhere.plain_job", {"label": "x"}).id)
    for job_id in (plain, unknown):
        with pytest.raises(TaskResultDoesNotExist, match="is not a task's"):
            task_backends["default"].get_result(job_id)


# Boundaries: rows edited by hand, return values, kinds no process here has loaded -------

JSON_TEXT = st.text(
    alphabet=st.characters(blacklist_categories=("Cs",), blacklist_characters="\x00"),
    max_size=12,
)
JSON_VALUES = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(-(2**40), 2**40)
    | st.floats(allow_nan=False, allow_infinity=False)
    | JSON_TEXT,
    lambda children: (
        st.lists(children, max_size=4) | st.dictionaries(JSON_TEXT, children, max_size=4)
    ),
    max_leaves=8,
)
ISO_TIMES = st.datetimes(
    min_value=datetime(2000, 1, 1), max_value=datetime(2100, 1, 1), timezones=st.just(UTC)
).map(datetime.isoformat)
OPTION_VALUES = (
    st.integers(-150, 150) | st.sampled_from(["default", "tasks", ""]) | ISO_TIMES | JSON_VALUES
)
TASK_DOCUMENTS = JSON_VALUES | st.dictionaries(
    st.sampled_from([*TASK_OPTIONS, "surprise"]), OPTION_VALUES, max_size=5
)
HAND_EDITED_PAYLOADS = JSON_VALUES | st.fixed_dictionaries(
    {},
    optional={
        "args": st.lists(JSON_VALUES, max_size=3) | JSON_VALUES,
        "kwargs": st.dictionaries(JSON_TEXT, JSON_VALUES, max_size=3) | JSON_VALUES,
        "task": TASK_DOCUMENTS,
        "surprise": JSON_VALUES,
    },
)
PROPERTY_SETTINGS = settings(
    max_examples=30,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)


def empty_the_tables() -> None:
    execute("DELETE FROM pgjobs_job; DELETE FROM pgjobs_dead; DELETE FROM tests_note")


def test_a_task_payload_edited_by_hand_reads_and_runs_or_dead_letters_with_its_reason() -> None:
    """Property: whatever JSON a task's payload is edited into, get_result() reads the
    job (before and after a worker meets it), the worker runs it as the payload says or
    dead-letters it with a reason naming what is wrong, and a sound task beside it runs."""
    backend = task_backends["default"]

    @settings(PROPERTY_SETTINGS, max_examples=60)
    @given(HAND_EDITED_PAYLOADS)
    def check(payload: Any) -> None:
        empty_the_tables()
        victim = tasks.echo.enqueue("sound")
        neighbour = tasks.add.enqueue(1, 2)
        execute(
            "UPDATE pgjobs_job SET payload = %s::jsonb WHERE id = %s",
            [json.dumps(payload), int(victim.id)],
        )
        read = backend.get_result(victim.id)
        assert read.status == TaskResultStatus.READY
        assert read.task.func is tasks.echo.func
        work()
        assert tasks.add.get_result(neighbour.id).return_value == 3
        ended = backend.get_result(victim.id)
        event(f"ended {ended.status}")
        if ended.status == TaskResultStatus.SUCCESSFUL:
            assert ended.return_value == {"args": read.args, "kwargs": read.kwargs}
            assert ended.task == read.task  # the variant the payload says
            return
        assert ended.status == TaskResultStatus.FAILED, ended.errors
        (reason,) = dead_row(int(victim.id), "reason")
        assert any(
            said in reason
            for said in (
                "the task's payload cannot be read: payload",
                "payload does not fit the handler",
                "payload is not a JSON object",
            )
        ), reason

    check()


class RaisingMapping(Mapping[str, Any]):
    """A mapping whose items cannot be read: what a hostile return value looks like."""

    def __getitem__(self, key: str) -> Any:
        raise RuntimeError("no item may be read")

    def __iter__(self) -> Iterator[str]:
        raise RuntimeError("no item may be listed")

    def __len__(self) -> int:
        return 1


NOT_JSON = st.one_of(
    st.sets(st.integers(), max_size=3),
    st.frozensets(st.integers(), max_size=3),
    st.datetimes(),
    st.decimals(allow_nan=False),
    st.complex_numbers(allow_nan=False),
    st.builds(object),
    st.just(lambda: True),
    st.just(b"\xff\xfe not utf-8"),
    st.just(RaisingMapping()),
)
HOSTILE_RETURNS = NOT_JSON | st.tuples(NOT_JSON, st.lists(JSON_VALUES, max_size=3)).map(
    lambda pair: [*pair[1], {"deep": [pair[0]]}]
)


def raised_by_normalizing(value: object) -> type[BaseException]:
    try:
        normalize_json(value)
    except Exception as error:
        return type(error)
    raise AssertionError(f"{value!r} is JSON")


def test_a_return_value_that_is_not_json_fails_at_once_with_what_encoding_it_raised() -> None:
    """Property: whatever non-JSON value a task returns, it fails on its first attempt
    (of 3) with the encoding error's class as its TaskError, the reason says "result is
    not JSON", and the worker goes on."""

    @PROPERTY_SETTINGS
    @given(HOSTILE_RETURNS)
    def check(value: object) -> None:
        empty_the_tables()
        expected = raised_by_normalizing(value)
        event(f"normalizing raised {expected.__name__}")
        token = uuid.uuid4().hex
        tasks.RETURN_VALUES[token] = value
        try:
            enqueued = tasks.return_stored.enqueue(token)
            neighbour = tasks.add.enqueue(2, 2)
            work()
        finally:
            del tasks.RETURN_VALUES[token]
        read = tasks.return_stored.get_result(enqueued.id)
        assert (read.status, read.attempts) == (TaskResultStatus.FAILED, 1)
        (error,) = read.errors
        assert error.exception_class is expected
        assert error.traceback.rstrip().splitlines()[-1].startswith(expected.__name__)
        (reason,) = dead_row(int(enqueued.id), "reason")
        assert reason.startswith("result is not JSON: ")
        assert tasks.add.get_result(neighbour.id).return_value == 4

    check()


UNLOADED_KINDS = st.sampled_from(
    ["os.system", "builtins.eval", "subprocess.run", "tests.unloaded_tasks.greet"]
) | st.from_regex(r"[a-z_][a-z0-9_]{0,8}(\.[a-z_][a-z0-9_]{0,8}){1,3}", fullmatch=True)


def test_a_result_of_a_kind_this_process_has_not_loaded_reads_with_a_stand_in() -> None:
    """Property: for any task path no task of this process holds (an imported module's
    function or a module that does not exist), get_result() reads the row with a stand-in
    named after it, imports nothing and registers nothing; calling it says what to do."""
    backend = task_backends["default"]

    @PROPERTY_SETTINGS
    @given(UNLOADED_KINDS, st.integers(-100, 100), st.lists(JSON_VALUES, max_size=3))
    def check(kind: str, priority: int, args: list[Any]) -> None:
        from django_pgjobs.exceptions import TaskNotLoaded

        assume(registry.get_definition(kind) is None)
        empty_the_tables()
        stored = {"priority": priority, "queue_name": "default", "run_after": None}
        payload = {"args": args, "kwargs": {}, "task": {**stored, "backend": "default"}}
        modules = set(sys.modules)
        job_id = str(Job.objects.enqueue(kind, payload).id)
        read = backend.get_result(job_id)
        assert (read.task.module_path, read.task.name) == (kind, kind.rpartition(".")[2])
        (stored_payload,) = row(int(job_id), "payload")  # as jsonb gives it back
        assert (read.task.priority, read.backend) == (priority, "default")
        assert read.args == stored_payload["args"]
        with pytest.raises(TaskNotLoaded, match="is not loaded in this process"):
            read.task.call(*args)
        assert read == backend.get_result(job_id)
        assert set(sys.modules) == modules
        assert registry.get_definition(kind) is None

    check()
