"""OpenTelemetry traces across enqueue and run (the `otel` extra), with the SDK's spans
kept in memory: an enqueue inside a trace keeps its W3C context in the job's row, in the
statement that writes it; each run is a CONSUMER span linked to it (and its child when
the job ran straight away), named and attributed after the messaging conventions, with
an event for each way a run can go wrong; what a handler enqueues carries the trace on.
Across a real `runjobs` process: tests/processes/test_tracing.py."""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from opentelemetry import trace

from django_pgjobs import tracing
from django_pgjobs.batches import Callback, batch
from django_pgjobs.models import Job
from tests import jobs
from tests.helpers import count, execute, row, running_worker, wait_until
from tests.otel import Capture, named

pytestmark = pytest.mark.django_db(transaction=True)


def request_span() -> Any:
    """A span as a traced request would make it (the test's own tracer)."""
    return trace.get_tracer("tests").start_as_current_span("GET /orders")


def stored(job_id: int) -> dict[str, str] | None:
    (value,) = row(job_id, "trace_context") or (None,)
    return value if value is None or isinstance(value, dict) else json.loads(value)


def names(span: dict[str, Any]) -> dict[str, str]:
    """The stored context that names `span`: its traceparent, flags aside."""
    return {"traceparent": f"00-{span['trace_id']}-{span['span_id']}"}


def named_by(job_id: int) -> dict[str, str] | None:
    """The job's stored context, flags aside (sampled, random ids: the SDK's to set)."""
    value = stored(job_id)
    if value is None:
        return None
    return {
        key: text.rsplit("-", 1)[0] if key == "traceparent" else text for key, text in value.items()
    }


def drain(**options: Any) -> None:
    with running_worker(**options):
        wait_until(lambda: count() == 0, timeout=20)


class TestEnqueue:
    def test_an_enqueue_inside_a_trace_is_a_send_span_whose_context_the_row_keeps(
        self, spans: Capture
    ) -> None:
        with request_span():
            job_id = jobs.plain.enqueue(value=1).id
        (request,) = named(spans.spans(), "GET /orders")
        (send,) = named(spans.spans(), "send default")
        assert send["kind"] == "PRODUCER"
        assert send["parent_id"] == request["span_id"]
        assert send["trace_id"] == request["trace_id"]
        assert send["attributes"] == {
            "messaging.system": "django_pgjobs",
            "messaging.operation.type": "send",
            "messaging.operation.name": "send",
            "messaging.destination.name": "default",
            "messaging.message.id": str(job_id),
        }
        assert named_by(job_id) == names(send)

    def test_enqueue_many_is_one_send_span_for_the_batch_and_every_row_keeps_it(
        self, spans: Capture
    ) -> None:
        with request_span():
            results = Job.objects.enqueue_many(
                [{"kind": "tests.plain", "payload": {"value": n}} for n in range(5)]
            )
        (send,) = named(spans.spans(), "send default")
        assert send["attributes"]["messaging.batch.message_count"] == 5
        assert "messaging.message.id" not in send["attributes"]
        assert all(named_by(r.id) == names(send) for r in results)

    def test_several_queues_in_one_call_name_the_span_after_the_operation_only(
        self, spans: Capture
    ) -> None:
        with request_span():
            Job.objects.enqueue_many(
                [{"kind": "tests.plain", "queue": "a"}, {"kind": "tests.plain", "queue": "b"}]
            )
        (send,) = named(spans.spans(), "send")
        assert "messaging.destination.name" not in send["attributes"]

    def test_outside_a_trace_nothing_is_kept_and_no_span_starts(self, spans: Capture) -> None:
        job_id = jobs.plain.enqueue(value=1).id
        many = Job.objects.enqueue_many([{"kind": "tests.plain"}] * 3)
        assert stored(job_id) is None
        assert all(stored(r.id) is None for r in many)
        assert spans.spans() == []

    def test_tracing_off_keeps_nothing_and_makes_no_span(
        self, spans: Capture, settings: Any
    ) -> None:
        settings.PGJOBS = {**settings.PGJOBS, "TRACING": False}
        with request_span():
            job_id = jobs.plain.enqueue(value=1).id
        assert stored(job_id) is None
        assert [span["name"] for span in spans.spans()] == ["GET /orders"]

    def test_an_enqueue_refused_writes_nothing_and_sends_nothing(self, spans: Capture) -> None:
        with request_span(), pytest.raises(Exception, match="Priority"):
            Job.objects.enqueue("tests.plain", {}, priority=1000)
        assert count() == 0
        assert named(spans.spans(), "send") == []  # refused before any span (S4)

    def test_a_debounced_trigger_brings_its_own_trace_to_the_pending_job(
        self, spans: Capture
    ) -> None:
        first = jobs.keyed.using(delay=60).enqueue(account=1, version=1).id
        with request_span():
            again = jobs.keyed.using(delay=60).enqueue(account=1, version=2)
        (send,) = named(spans.spans(), "send default")
        assert again.id == first and not again.inserted
        assert named_by(first) == names(send)


class TestRun:
    def test_a_run_straight_after_its_enqueue_is_its_child_and_linked_to_it(
        self, spans: Capture
    ) -> None:
        with request_span():
            job_id = jobs.plain.enqueue(value=2).id
        drain()
        (send,) = named(spans.spans(), "send default")
        (run,) = named(spans.spans(), "process default")
        assert run["kind"] == "CONSUMER"
        assert run["trace_id"] == send["trace_id"]
        assert run["parent_id"] == send["span_id"]
        assert run["links"] == [{"trace_id": send["trace_id"], "span_id": send["span_id"]}]
        assert run["attributes"] == {
            "messaging.system": "django_pgjobs",
            "messaging.operation.type": "process",
            "messaging.operation.name": "process",
            "messaging.destination.name": "default",
            "messaging.message.id": str(job_id),
            "pgjobs.job.kind": "tests.plain",
            "pgjobs.job.attempt": 1,
            "pgjobs.job.max_attempts": 10,
            "pgjobs.job.outcome": "succeeded",
        }
        assert run["status"] == "UNSET" and run["events"] == []
        assert run["scope"] == "django_pgjobs"

    def test_a_job_scheduled_for_later_starts_a_trace_of_its_own_linked_to_its_enqueue(
        self, spans: Capture
    ) -> None:
        with request_span():
            jobs.plain.using(delay=0.3).enqueue(value=3)
        drain(poll_interval=0.1)
        (send,) = named(spans.spans(), "send default")
        (run,) = named(spans.spans(), "process default")
        assert run["parent_id"] is None and run["trace_id"] != send["trace_id"]
        assert run["links"] == [{"trace_id": send["trace_id"], "span_id": send["span_id"]}]

    def test_a_job_enqueued_outside_a_trace_runs_in_a_span_with_no_link(
        self, spans: Capture
    ) -> None:
        jobs.plain.enqueue(value=4)
        drain()
        (run,) = named(spans.spans(), "process default")
        assert run["parent_id"] is None and run["links"] == []

    def test_a_retry_is_an_error_with_its_exception_and_the_next_attempt_is_linked_only(
        self, spans: Capture
    ) -> None:
        with request_span():
            job_id = jobs.misbehave.enqueue(how="error").id
        with running_worker():
            # The retry recorded (pending again), not merely the claim (attempts 1): a
            # run_after set before the retry's own write would be overwritten by it.
            wait_until(lambda: row(job_id, "state", "attempts") == ("pending", 1), timeout=10)
            execute("UPDATE pgjobs_job SET run_after = now() WHERE id = %s", [job_id])
            wait_until(lambda: len(named(spans.spans(), "process default")) >= 2, timeout=10)
        first, second = named(spans.spans(), "process default")[:2]
        assert first["attributes"]["pgjobs.job.outcome"] == "retried"
        assert first["status"] == "ERROR" and first["description"] == "ValueError: bad value"
        assert first["attributes"]["error.type"] == "builtins.ValueError"
        assert [event["name"] for event in first["events"]] == ["exception", "pgjobs.retry"]
        exception = first["events"][0]["attributes"]
        assert exception["exception.type"] == "builtins.ValueError"
        assert "Traceback" in exception["exception.stacktrace"]
        assert second["attributes"]["pgjobs.job.attempt"] == 2
        assert second["parent_id"] is None  # not run straight away: linked, not a child
        assert second["links"] == first["links"]

    def test_a_dead_letter_says_why(self, spans: Capture) -> None:
        jobs.misbehave.enqueue(how="fail")
        drain()
        (run,) = named(spans.spans(), "process default")
        assert run["attributes"]["pgjobs.job.outcome"] == "dead"
        assert run["status"] == "ERROR"
        assert run["events"][-1] == {
            "name": "pgjobs.dead_letter",
            "attributes": {"pgjobs.dead_letter.reason": "hopeless"},
        }

    def test_a_cancel_while_it_runs_is_an_event_not_an_error(self, spans: Capture) -> None:
        job_id = jobs.cooperative.enqueue(seconds=10).id
        with running_worker(queues=["long"]):
            wait_until(lambda: count("tests_note", "text = 'started'") == 1)
            assert Job.objects.cancel_many([job_id], reason="operator said so") == 1
            wait_until(lambda: bool(named(spans.spans(), "process long")), timeout=10)
        (run,) = named(spans.spans(), "process long")
        assert run["attributes"]["pgjobs.job.outcome"] == "cancelled"
        assert run["status"] == "UNSET"
        # What its worker was told: the dead letter keeps the operator's words.
        assert run["events"][-1] == {
            "name": "pgjobs.cancelled",
            "attributes": {"pgjobs.cancel.reason": "cancelled"},
        }
        assert execute("SELECT reason FROM pgjobs_dead WHERE id = %s", [job_id]) == [
            ("operator said so",)
        ]

    def test_a_handler_abandoned_at_its_timeout_ends_its_span_then(self, spans: Capture) -> None:
        jobs.stubborn.enqueue(seconds=1.5)
        with running_worker(queues=["long"]):
            wait_until(lambda: bool(named(spans.spans(), "process long")), timeout=10)
            (run,) = named(spans.spans(), "process long")  # ended while it still sleeps
            assert count("tests_note", "text = 'late write'") == 0
        assert run["attributes"]["pgjobs.job.outcome"] == "timed_out"
        assert run["status"] == "ERROR" and run["description"] == "timed out after 0.5 s"
        assert run["events"] == [
            {"name": "pgjobs.timeout", "attributes": {"pgjobs.timeout_s": 0.5}}
        ]

    def test_an_async_handler_runs_in_its_span_on_the_event_loop(self, spans: Capture) -> None:
        with request_span():
            jobs.async_double.enqueue(value=21)
        drain()
        (send,) = named(spans.spans(), "send default")
        (run,) = named(spans.spans(), "process default")
        assert run["parent_id"] == send["span_id"]
        assert run["attributes"]["pgjobs.job.outcome"] == "succeeded"


class TestTheTraceGoesOn:
    def test_what_a_handler_enqueues_carries_its_runs_trace(self, spans: Capture) -> None:
        with request_span():
            jobs.chain.enqueue(left=2)
        drain()
        sent = named(spans.spans(), "send default")
        runs = named(spans.spans(), "process default")
        assert len(sent) == 3 and len(runs) == 3
        assert len({span["trace_id"] for span in [*sent, *runs]}) == 1  # one trace
        by_id = {span["span_id"]: span for span in [*sent, *runs]}
        for run in runs[1:]:
            parent_send = by_id[run["parent_id"]]
            assert by_id[parent_send["parent_id"]]["name"] == "process default"

    def test_a_batchs_members_and_callback_carry_the_context_of_its_writing(
        self, spans: Capture
    ) -> None:
        with request_span():
            with batch(on_complete=Callback("tests.batch_report", label="done")) as b:
                b.add("tests.plain", value=1)
                b.add("tests.plain", value=2)
            (callback,) = b.callback_jobs
        (send,) = named(spans.spans(), "send default")
        assert send["attributes"]["messaging.batch.message_count"] == 3
        members = execute("SELECT id FROM pgjobs_job WHERE kind = 'tests.plain'")
        for (member_id,) in [*members, (callback.id,)]:
            assert named_by(member_id) == names(send)
        drain()
        (report,) = named(spans.spans(), "process default")[-1:]
        assert report["attributes"]["pgjobs.job.kind"] == "tests.batch_report"
        assert report["links"] == [{"trace_id": send["trace_id"], "span_id": send["span_id"]}]

    def test_a_child_written_after_a_parent_keeps_the_context_of_its_enqueue(
        self, spans: Capture
    ) -> None:
        with request_span():
            parent = jobs.plain.enqueue(value=1)
            child = Job.objects.enqueue("tests.plain", {"value": 2}, after=[parent])
        (_, send_child) = named(spans.spans(), "send default")
        assert named_by(child.id) == names(send_child)


class TestATracerThatFails:
    def test_a_broken_span_processor_changes_no_job_and_is_said_once(
        self, spans: Capture, caplog: pytest.LogCaptureFixture
    ) -> None:
        import logging

        with caplog.at_level(logging.WARNING, logger="django_pgjobs.worker"):
            with request_span():
                spans.broken = True
                job_id = jobs.plain.enqueue(value=1).id  # its send span cannot start
                failing = jobs.misbehave.enqueue(how="fail").id
                spans.broken = False  # (the test's own span ends as any other)
            spans.broken = True  # the runs' spans neither start nor end
            drain()
            spans.broken = False
        assert row(job_id) is None  # acked once: run and gone, not retried
        assert execute("SELECT reason FROM pgjobs_dead WHERE id = %s", [failing]) == [("hopeless",)]
        assert count() == 0
        said = [m for m in caplog.messages if m.startswith("tracing: ")]
        assert len(said) <= 1  # once a process (it may have been said by an earlier test)


HOSTILE_CONTEXTS = st.one_of(
    st.none(),
    st.integers(),
    st.text(),
    st.lists(st.text(), max_size=3),
    st.dictionaries(st.text(max_size=20), st.text(max_size=80), max_size=4),
    st.fixed_dictionaries(
        {"traceparent": st.text(max_size=80)},
        optional={"tracestate": st.text(max_size=600)},
    ),
    st.just({"traceparent": "00-" + "0" * 32 + "-" + "0" * 16 + "-01"}),  # all-zero ids
    st.just({"traceparent": "ff-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"}),
    st.just({"traceparent": "00-0AF7651916CD43DD8448EB211C80319C-B7AD6B7169203331-01"}),
    st.just({"traceparent": "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01" + "x"}),
)


class TestHostileRows:
    @settings(max_examples=150, suppress_health_check=[HealthCheck.function_scoped_fixture])
    @given(value=HOSTILE_CONTEXTS)
    def test_any_stored_context_reads_as_a_valid_origin_or_none_never_an_error(
        self, spans: Capture, value: object
    ) -> None:
        origin = tracing.origin_of(value)
        assert origin is None or origin.is_valid

    def test_jobs_whose_rows_were_edited_by_hand_run_and_each_span_ends(
        self, spans: Capture
    ) -> None:
        hostile = [
            "[1, 2]",
            '"00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"',
            '{"traceparent": 7}',
            '{"traceparent": "00-zz-b7ad6b7169203331-01", "tracestate": null}',
            '{"traceparent": "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01",'
            ' "tracestate": "' + "k=v," * 400 + '"}',
        ]
        ids = [jobs.plain.enqueue(value=n).id for n in range(len(hostile))]
        for job_id, value in zip(ids, hostile, strict=True):
            execute(
                "UPDATE pgjobs_job SET trace_context = %s::jsonb WHERE id = %s", [value, job_id]
            )
        drain()
        runs = {int(run["attributes"]["messaging.message.id"]): run for run in spans.spans()}
        assert sorted(runs) == ids
        assert all(run["attributes"]["pgjobs.job.outcome"] == "succeeded" for run in runs.values())
        assert all(runs[job_id]["links"] == [] for job_id in ids[:-1])
        # A tracestate past the W3C's 512 characters is left out; its traceparent stands.
        assert runs[ids[-1]]["links"] == [
            {"trace_id": "0af7651916cd43dd8448eb211c80319c", "span_id": "b7ad6b7169203331"}
        ]
        assert count("pgjobs_dead") == 0


WITHOUT_OTEL = """
import sys
sys.modules["opentelemetry"] = None  # as if the otel extra were not installed
import django
django.setup()
from django_pgjobs import tracing
from django_pgjobs.models import Job
from django_pgjobs.worker import Worker
job_id = Job.objects.enqueue("tests.plain", {"value": 1}).id
assert Worker(queues=["default"], burst=True, sweep_interval=0).run() == 0
assert Job.objects.get_job(job_id) is None  # acked: run and gone
print(tracing.tracer(), tracing._api, [m for m in sys.modules if m.startswith("opentelemetry.")])
"""

WITHOUT_A_PROVIDER = """
import sys
import django
django.setup()
from django_pgjobs import tracing
from django_pgjobs.models import Job
from django_pgjobs.worker import Worker
from opentelemetry import trace
with trace.get_tracer("x").start_as_current_span("request"):
    job_id = Job.objects.enqueue("tests.plain", {"value": 1}).id
assert Worker(queues=["default"], burst=True, sweep_interval=0).run() == 0
assert Job.objects.get_job(job_id) is None  # acked: run and gone
print(tracing.tracer(), "opentelemetry.sdk" in sys.modules)
"""


@pytest.mark.parametrize(
    ("script", "printed"),
    [(WITHOUT_OTEL, "None False []"), (WITHOUT_A_PROVIDER, "None False")],
    ids=["without-the-api", "without-a-tracer-provider"],
)
def test_without_the_otel_extra_or_an_sdk_jobs_run_and_nothing_is_traced(
    script: str, printed: str
) -> None:
    import subprocess
    import sys

    from tests.spawn import ROOT, database_url_for_workers, suite_env

    result = subprocess.run(
        [sys.executable, "-c", script],
        cwd=ROOT,
        env=suite_env(DATABASE_URL=database_url_for_workers()),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip().splitlines()[-1] == printed
    assert execute("SELECT count(*) FROM pgjobs_job WHERE trace_context IS NOT NULL") == [(0,)]
