"""A handler can never stop a queue (S27).

What a handler raises or returns is made storable before it reaches SQL (NUL and lone
surrogates escaped, texts bounded, Retry delays validated); a database refusal of one
job's data dead-letters that job alone; only connection failures count as an outage; and
the worker loop goes on whatever else is raised in it. Each test runs a real worker
(in-process threads, real PostgreSQL) beside a stream of ordinary jobs.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import timedelta
from decimal import Decimal
from typing import Any

import psycopg
import pytest
from django.db import DataError, InterfaceError, OperationalError, transaction
from django.test import override_settings
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from django_pgjobs import Fail, Retry
from django_pgjobs.exceptions import InvalidSchedule
from django_pgjobs.models import Job
from django_pgjobs.payloads import ERROR_TEXT_MAX_CHARS, TRACEBACK_MAX_CHARS
from django_pgjobs.worker import Worker
from django_pgjobs.worker.faults import is_outage
from tests import jobs
from tests.helpers import count, dead_row, execute, row, wait_until

pytestmark = pytest.mark.django_db(transaction=True)

Behaviour = Callable[[Any], Any]


class Served:
    """A worker of the poison and default queues in a thread, and how its run ended."""

    def __init__(self, worker: Worker) -> None:
        self.worker = worker
        self.error: BaseException | None = None
        self.code: int | None = None
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        try:
            self.code = self.worker.run()
        except BaseException as error:
            self.error = error

    def assert_alive(self) -> None:
        assert self.error is None, f"the worker raised {self.error!r}"
        assert self.thread.is_alive(), f"the worker exited by itself with {self.code}"


@contextmanager
def serving(**options: Any) -> Iterator[Served]:
    options.setdefault("concurrency", 3)
    worker = Worker(queues=["poison", "default"], sweep_interval=0, poll_interval=0.05, **options)
    served = Served(worker)
    served.thread.start()
    try:
        yield served
    finally:
        alive = served.thread.is_alive()
        worker.stop()
        served.thread.join(15)
        assert alive and served.error is None, f"the worker stopped by itself: {served.error!r}"


def enqueue_poison(*behaviours: Behaviour, **options: Any) -> list[int]:
    """Enqueue a tests.poison job per behaviour; it is known before the commit, so no
    worker can claim a job before its behaviour is set."""
    ids = []
    with transaction.atomic():
        for behaviour in behaviours:
            job_id = jobs.poison.using(**options).enqueue().id
            jobs.POISON[job_id] = behaviour
            ids.append(job_id)
    return ids


def enqueue_ordinary(n: int = 20) -> list[int]:
    return [result.id for result in Job.objects.enqueue_many([{"kind": "tests.noop"}] * n)]


def settled(ids: list[int]) -> bool:
    """No job of `ids` is running or waiting to run now: each is done, dead, or retried
    to a later time."""
    return (
        count(
            where="id = ANY(%s) AND (state = 'running' OR (state = 'pending' "
            "AND run_after <= now()))",
            params=[ids],
        )
        == 0
    )


def all_dead(ids: list[int]) -> bool:
    return count("pgjobs_dead", where="id = ANY(%s)", params=[ids]) == len(ids)


def ordinary_done(ids: list[int]) -> bool:
    return count(where="id = ANY(%s)", params=[ids]) == 0 and (
        count("pgjobs_dead", where="id = ANY(%s)", params=[ids]) == 0
    )


def raising(error: BaseException) -> Behaviour:
    def behave(ctx: Any) -> Any:
        raise error

    return behave


def returning(value: Any) -> Behaviour:
    return lambda ctx: value


def first_attempt_raising(error: BaseException) -> Behaviour:
    """Raise `error` on the first attempt; succeed on the next."""

    def behave(ctx: Any) -> Any:
        if ctx.attempt == 1:
            raise error
        return "second time lucky"

    return behave


class Unprintable(Exception):
    def __str__(self) -> str:
        raise ValueError("no text for you")


class TestWhatHandlersRaise:
    def test_s27_nul_in_an_error_text_is_stored_and_the_queue_flows(self) -> None:
        with serving() as served:
            runtime, declined = enqueue_poison(
                raising(RuntimeError("binary reply: \x00\x01")), raising(Fail("declined: \x00"))
            )
            ordinary = enqueue_ordinary()
            wait_until(lambda: ordinary_done(ordinary) and all_dead([runtime, declined]))
            served.assert_alive()
        assert dead_row(declined, "reason", "last_error") == (
            "declined: \\x00",
            "declined: \\x00",
        )
        reason, last_error, errors = dead_row(runtime, "reason", "last_error", "errors")
        assert reason == "max attempts exceeded"
        assert last_error == "RuntimeError: binary reply: \\x00\x01"
        assert "RuntimeError: binary reply: \\x00\x01" in errors[-1]["traceback"]

    def test_s27_a_lone_surrogate_in_an_error_text_does_not_kill_the_worker(self) -> None:
        with serving() as served:
            runtime, declined = enqueue_poison(
                raising(RuntimeError("bad \ud800")), raising(Fail("\udfff declined"))
            )
            ordinary = enqueue_ordinary()
            wait_until(lambda: ordinary_done(ordinary) and all_dead([runtime, declined]))
            served.assert_alive()
        assert dead_row(runtime, "last_error")[0] == "RuntimeError: bad \\ud800"
        assert dead_row(declined, "reason")[0] == "\\udfff declined"

    def test_s27_an_exception_whose_str_raises_is_recorded_by_its_class(self) -> None:
        with serving() as served:
            [job_id] = enqueue_poison(raising(Unprintable()))
            wait_until(lambda: all_dead([job_id]))
            served.assert_alive()
        last_error = dead_row(job_id, "last_error")[0]
        assert last_error.startswith("Unprintable: <str() raised ValueError")

    def test_s27_huge_error_texts_and_tracebacks_are_bounded(self) -> None:
        with serving() as served:
            [job_id] = enqueue_poison(raising(RuntimeError("x" * 5_000_000 + " the end")))
            wait_until(lambda: all_dead([job_id]), timeout=20)
            served.assert_alive()
        last_error, errors = dead_row(job_id, "last_error", "errors")
        assert len(last_error) < ERROR_TEXT_MAX_CHARS + 100
        assert "characters cut" in last_error and last_error.endswith("the end")
        assert all(len(entry["traceback"]) < TRACEBACK_MAX_CHARS + 100 for entry in errors)

    def test_s27_reasons_that_are_not_text_read_as_text(self) -> None:
        with serving() as served:
            nothing, number, empty = enqueue_poison(
                raising(Fail(None)),  # type: ignore[arg-type]
                raising(Fail(404)),  # type: ignore[arg-type]
                raising(Fail("")),
            )
            wait_until(lambda: all_dead([nothing, number, empty]))
            served.assert_alive()
        assert dead_row(nothing, "reason")[0] == "failed"
        assert dead_row(number, "reason")[0] == "404"
        assert dead_row(empty, "reason")[0] == "failed"


class TestRetryDelays:
    @pytest.mark.parametrize("delay", [-1, -0.5, timedelta(seconds=-30), 0])
    def test_s27_a_past_retry_delay_means_now(self, delay: Any) -> None:
        [job_id] = enqueue_poison(
            first_attempt_raising(Retry("rate limited", delay=delay)), result_retention=60
        )
        drain_within(10)
        # Retried at once, in the same burst (a backoff of 1 s would have ended it).
        assert row(job_id, "state", "attempts", "last_error") == ("done", 2, "rate limited")

    @pytest.mark.parametrize(
        ("delay", "said"),
        [
            (float("nan"), "nan"),
            (float("inf"), "inf"),
            (1e15, "century"),
            (timedelta(days=10**6), "century"),
            ("30", "'30'"),
            (True, "True"),
        ],
    )
    def test_s27_an_unusable_retry_delay_takes_the_backoff_and_says_why(
        self, delay: Any, said: str
    ) -> None:
        [job_id] = enqueue_poison(first_attempt_raising(Retry("try later", delay=delay)))
        drain_within(10)
        state, attempts, last_error = row(job_id, "state", "attempts", "last_error")
        assert (state, attempts) == ("pending", 1)
        assert last_error.startswith("try later (")
        assert said in last_error and "backoff" in last_error
        seconds = float(
            execute(
                "SELECT extract(epoch FROM run_after - now()) FROM pgjobs_job WHERE id = %s",
                [job_id],
            )[0][0]
        )
        assert 0 < seconds <= 1.5  # the queue's backoff: (1, 1)

    def test_s27_a_decimal_delay_is_a_number_of_seconds(self) -> None:
        [job_id] = enqueue_poison(first_attempt_raising(Retry("soon", delay=Decimal("120.5"))))
        drain_within(10)
        seconds = float(
            execute(
                "SELECT extract(epoch FROM run_after - now()) FROM pgjobs_job WHERE id = %s",
                [job_id],
            )[0][0]
        )
        assert 119 < seconds <= 120.5

    def test_s27_handle_retry_takes_a_past_delay_as_now_and_refuses_nan(self) -> None:
        job_id = jobs.noop.enqueue().id
        [handle] = Job.objects.claim_batch(["default"], 1, "w")
        with pytest.raises(InvalidSchedule, match="nan"):
            handle.retry("boom", delay=float("nan"))
        assert handle.retry("boom", delay=-5)
        assert execute("SELECT run_after <= now() FROM pgjobs_job WHERE id = %s", [job_id]) == [
            (True,)
        ]


def drain_within(seconds: float, **options: Any) -> Worker:
    """A burst worker that must finish within `seconds` without raising."""
    options.setdefault("concurrency", 2)
    worker = Worker(
        queues=["poison", "default"], burst=True, sweep_interval=0, poll_interval=0.05, **options
    )
    served = Served(worker)
    served.thread.start()
    served.thread.join(seconds)
    if served.thread.is_alive():
        worker.stop()
        served.thread.join(10)
        raise AssertionError(f"the burst did not end within {seconds} s: the worker is wedged")
    assert served.error is None, f"the worker raised {served.error!r}"
    assert served.code == 0
    return worker


class _Hostile(dict):  # type: ignore[type-arg]
    def items(self) -> Any:
        raise RuntimeError("no items")


class TestWhatHandlersReturn:
    @pytest.mark.parametrize(
        ("value", "said"),
        [
            ({"when": object()}, "result is not JSON"),
            ({"text": "half \ud800"}, "not valid Unicode"),
            ({"text": "nul \x00"}, "NUL"),
            (_Hostile(a=1), "result is not JSON"),
            ("y" * 5000, "result is 5002 bytes of JSON; the limit is 4096"),
        ],
    )
    def test_s27_a_result_that_cannot_be_stored_dead_letters_the_job(
        self, value: Any, said: str
    ) -> None:
        with override_settings(PGJOBS={"MAX_PAYLOAD_BYTES": 4096}):
            [job_id] = enqueue_poison(returning(value))
            drain_within(10)
        reason = dead_row(job_id, "reason")[0]
        assert said in reason


REFUSE_DONE = """
CREATE FUNCTION pgjobs_test_refuse() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    RAISE EXCEPTION 'refused by a test trigger' USING ERRCODE = '22023';
END $$;
CREATE TRIGGER pgjobs_test_refuse BEFORE UPDATE ON pgjobs_job FOR EACH ROW
WHEN (NEW.state = 'done' AND OLD.payload @> '{"value": 13}')
EXECUTE FUNCTION pgjobs_test_refuse();
"""
DROP_REFUSE = """
DROP TRIGGER IF EXISTS pgjobs_test_refuse ON pgjobs_job;
DROP FUNCTION IF EXISTS pgjobs_test_refuse();
"""


@pytest.fixture
def refused_ack() -> Iterator[None]:
    """A trigger that refuses the ack of any job whose payload holds value 13."""
    execute(REFUSE_DONE)
    try:
        yield
    finally:
        execute(DROP_REFUSE)


class TestRefusedWrites:
    def test_s27_a_batch_the_database_refuses_for_one_job_dead_letters_that_job_only(
        self, refused_ack: None
    ) -> None:
        ids = [
            jobs.plain.using(result_retention=60).enqueue(value=value).id
            for value in (1, 13, 2, 3, 4, 5)
        ]
        drain_within(15, concurrency=6)
        refused = ids[1]
        reason = dead_row(refused, "reason")[0]
        assert reason.startswith("the outcome could not be stored")
        assert "refused by a test trigger" in reason
        others = [job_id for job_id in ids if job_id != refused]
        assert [row(job_id, "state")[0] for job_id in others] == ["done"] * 5
        # The queue goes on.
        later = jobs.plain.using(result_retention=60).enqueue(value=8).id
        drain_within(10)
        assert row(later, "state", "result") == ("done", 16)

    def test_s27_only_connection_failures_are_an_outage(self) -> None:
        def wrapped(cls: type[Exception], cause: BaseException | None) -> Exception:
            error = cls("x")
            error.__cause__ = cause
            return error

        assert is_outage(wrapped(OperationalError, psycopg.errors.AdminShutdown()))
        assert is_outage(wrapped(OperationalError, psycopg.OperationalError("server closed")))
        assert is_outage(wrapped(InterfaceError, psycopg.InterfaceError("connection closed")))
        assert is_outage(wrapped(DataError, psycopg.errors.ReadOnlySqlTransaction()))
        assert is_outage(wrapped(OperationalError, psycopg.errors.SerializationFailure()))
        assert not is_outage(wrapped(DataError, psycopg.errors.UntranslatableCharacter()))
        assert not is_outage(wrapped(DataError, psycopg.errors.DatetimeFieldOverflow()))
        assert not is_outage(wrapped(OperationalError, psycopg.errors.ProgramLimitExceeded()))
        assert not is_outage(UnicodeEncodeError("utf-8", "\ud800", 0, 1, "surrogates"))
        assert not is_outage(TypeError("not adaptable"))


class TestTheLoopGoesOn:
    def test_s27_a_status_callback_that_raises_is_contained(self) -> None:
        def broken(stats: Any) -> None:
            raise RuntimeError("broken status line")

        with serving(on_status=broken, status_interval=0.01) as served:
            ordinary = enqueue_ordinary()
            wait_until(lambda: ordinary_done(ordinary))
            served.assert_alive()


# -- the property: whatever a handler raises or returns --------------------------------

texts = st.text(alphabet=st.characters(exclude_categories=()), max_size=40) | st.sampled_from(
    ["", "\x00", "\ud800", "\udfff\x00", "x" * 50_000, "%s %(x)s {}"]
)
reasons = texts | st.none() | st.integers() | st.binary(max_size=8)
delays = (
    st.none()
    | st.floats(allow_nan=True, allow_infinity=True)
    | st.integers(-(10**20), 10**20)
    | st.timedeltas()
    | st.decimals(allow_nan=True)
    | st.sampled_from(["30", True, b"1", [1]])
)
json_ish = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | texts,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(texts, inner, max_size=3),
    max_leaves=10,
)


class _Exit(BaseException):
    """A BaseException that is neither SystemExit nor KeyboardInterrupt."""


def _retry_in_handler(reason: Any, delay: Any) -> Behaviour:
    def behave(ctx: Any) -> Any:
        ctx.retry(reason, delay=delay)

    return behave


def _fail_in_handler(reason: Any) -> Behaviour:
    return lambda ctx: ctx.fail(reason)


behaviours = st.one_of(
    texts.map(lambda text: ("RuntimeError", raising(RuntimeError(text)))),
    reasons.map(lambda reason: ("Fail", raising(Fail(reason)))),
    st.tuples(reasons, delays).map(lambda pair: ("Retry", raising(Retry(pair[0], delay=pair[1])))),
    st.just(("Unprintable", raising(Unprintable()))),
    st.sampled_from([SystemExit(3), KeyboardInterrupt(), _Exit(), GeneratorExit()]).map(
        lambda error: (type(error).__name__, raising(error))
    ),
    json_ish.map(lambda value: ("returns", returning(value))),
    st.just(("returns object", returning({"x": object()}))),
    st.tuples(texts, delays).map(lambda pair: ("ctx.retry", _retry_in_handler(*pair))),
    reasons.map(lambda reason: ("ctx.fail", _fail_in_handler(reason))),
)


@pytest.mark.slow
def test_s27_whatever_a_handler_raises_or_returns_every_job_ends_and_the_queue_flows() -> None:
    """Property: every job ends done, retried (pending later, its error recorded) or dead
    with a readable reason; ordinary jobs beside them all finish; the worker lives."""
    with serving() as served:

        @settings(
            max_examples=25,
            deadline=None,
            suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
        )
        @given(st.lists(behaviours, min_size=1, max_size=6))
        def check(chosen: list[tuple[str, Behaviour]]) -> None:
            ids = enqueue_poison(*(behaviour for _, behaviour in chosen))
            ordinary = enqueue_ordinary(10)
            wait_until(lambda: ordinary_done(ordinary) and settled(ids), timeout=20)
            served.assert_alive()
            for job_id in ids:
                live = row(job_id, "state", "attempts", "last_error")
                if live is not None:  # retried to a later time
                    state, attempts, last_error = live
                    assert state == "pending" and attempts >= 1 and last_error
                    continue
                dead = dead_row(job_id, "reason")
                if dead is not None:
                    assert dead[0], "a dead letter needs a readable reason"

        check()


# -- what users send: enqueue_many's documents, the admin's inputs, a claim's size -----


class TestEnqueueManyDocuments:
    def test_s27_documents_are_cut_by_bytes_as_well_as_by_count(
        self, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        from django.db import connection
        from django.test.utils import CaptureQueriesContext

        from django_pgjobs.managers import enqueue as managers

        monkeypatch.setattr(managers, "ENQUEUE_DOCUMENT_BYTES", 10_000)
        many = [{"kind": "demo.blob", "payload": {"blob": "b" * 2_000, "i": i}} for i in range(20)]
        with CaptureQueriesContext(connection) as captured:
            results = Job.objects.enqueue_many(many)
        documents = [
            q
            for q in captured.captured_queries
            if "Insert many jobs" in q["sql"] or "whose jobs have no key" in q["sql"]
        ]
        assert len(documents) == 5  # four jobs of ~2 kB each per 10 kB document
        assert [result.inserted for result in results] == [True] * 20
        stored = execute(
            "SELECT payload->>'i' FROM pgjobs_job WHERE id = ANY(%s) ORDER BY id",
            [[result.id for result in results]],
        )
        assert [int(value) for (value,) in stored] == list(range(20))

    def test_s27_a_job_larger_than_a_document_goes_alone(
        self, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        from django_pgjobs.managers import enqueue as managers

        monkeypatch.setattr(managers, "ENQUEUE_DOCUMENT_BYTES", 1_000)
        many = [{"kind": "demo.blob", "payload": {"blob": "b" * 3_000}}] * 3
        assert len(Job.objects.enqueue_many(many)) == 3
        assert count(where="kind = 'demo.blob'") == 3

    @pytest.mark.slow
    def test_s27_a_batch_of_many_large_valid_payloads_is_written(self) -> None:
        """300 jobs of 1 MB payloads (each under MAX_PAYLOAD_BYTES): one document of
        300 MB would pass PostgreSQL's 255 MB jsonb limit."""
        blob = "x" * (1_048_576 - 100)
        many = [{"kind": "demo.blob", "payload": {"blob": blob, "i": i}} for i in range(300)]
        results = Job.objects.enqueue_many(many)
        assert len(results) == 300
        assert count(where="kind = 'demo.blob'") == 300
        assert execute(
            "SELECT min(octet_length(payload::text)), max((payload->>'i')::int) FROM pgjobs_job"
        ) == [(len(blob) + len('{"blob": "", "i": 0}'), 299)]


class TestBoundaries:
    def test_s27_a_claim_too_large_is_a_clear_error(self) -> None:
        from django_pgjobs.exceptions import InvalidClaimSize

        with pytest.raises(InvalidClaimSize, match="at most"):
            Job.objects.claim_batch(["p"], 10**19, "w")
        with pytest.raises(InvalidClaimSize, match="at most"):
            Job.objects.claim_batch(["p"], 2**31, "w")

    def test_s27_a_payload_limit_past_what_jsonb_holds_is_a_settings_error(self) -> None:
        from django.core.exceptions import ImproperlyConfigured

        from django_pgjobs.conf import pgjobs_settings

        with (
            override_settings(PGJOBS={"MAX_PAYLOAD_BYTES": 2**30}),
            pytest.raises(ImproperlyConfigured, match="MAX_PAYLOAD_BYTES"),
        ):
            pgjobs_settings.validate()


class TestAdminInputs:
    @pytest.mark.parametrize("term", ["²", "٣", "99999999999999999999999", "-1", "0", "1e3"])
    def test_s27_a_search_for_any_text_answers(self, admin_client: Any, term: str) -> None:
        from django.urls import reverse

        job_id = jobs.noop.enqueue().id
        for name in ("job", "deadjob"):
            url = reverse(f"admin:django_pgjobs_{name}_changelist")
            assert admin_client.get(url, {"q": term}).status_code == 200
        found = admin_client.get(reverse("admin:django_pgjobs_job_changelist"), {"q": job_id})
        assert [job.id for job in found.context["cl"].result_list] == [job_id]

    def test_s27_a_queue_added_by_an_invalid_name_is_a_form_error(self, admin_client: Any) -> None:
        from django.urls import reverse

        from django_pgjobs.models import QueueControl

        url = reverse("admin:django_pgjobs_queuecontrol_add")
        response = admin_client.post(url, {"name": "bad name!", "paused": "", "max_running": ""})
        assert response.status_code == 200
        assert "may only contain letters, digits" in response.content.decode()
        assert not QueueControl.objects.exists()

    def test_s27_the_queue_list_writes_nothing_on_a_get(self, admin_client: Any) -> None:
        from django.urls import reverse

        jobs.noop.using(queue="mail").enqueue()
        jobs.noop.using(queue="sync").enqueue()
        response = admin_client.get(reverse("admin:django_pgjobs_queuecontrol_changelist"))
        assert response.status_code == 200
        assert count("pgjobs_queue") == 0
        listed = {control.name for control in response.context["cl"].result_list}
        assert {"mail", "sync"} <= listed
        page = reverse("admin:django_pgjobs_queuecontrol_change", args=["mail"])
        assert admin_client.get(page).status_code == 200
        assert count("pgjobs_queue") == 0
