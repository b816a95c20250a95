"""Traces across processes (the `otel` extra): a job enqueued inside a trace in this
process runs in a real `manage.py runjobs` process whose span is the child of the
enqueue's span and linked to it, in the same trace, with the messaging attributes; a
failure's events cross too. The worker's SDK writes its spans to a file (tests/otel.py)."""

from __future__ import annotations

import signal
from pathlib import Path

import pytest
from opentelemetry import trace

from tests import jobs
from tests.helpers import count
from tests.otel import Capture, named, read
from tests.spawn import Workers, wait_for

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]


def test_a_run_in_a_worker_process_continues_the_trace_of_its_enqueue(
    workers: Workers, spans: Capture, tmp_path: Path
) -> None:
    exported = tmp_path / "spans.jsonl"
    with trace.get_tracer("tests").start_as_current_span("POST /checkout"):
        done_id = jobs.plain.enqueue(value=7).id
        dead_id = jobs.misbehave.enqueue(how="fail").id
    sent = {
        span["attributes"]["messaging.message.id"]: span
        for span in named(spans.spans(), "send default")
    }
    worker = workers.start(
        "--concurrency", "2", extra_env={"PGJOBS_TEST_SPANS_FILE": str(exported)}
    )
    wait_for(lambda: count() == 0, timeout=60, what="both jobs to end")
    wait_for(lambda: len(named(read(exported), "process default")) == 2, what="both spans")
    worker.signal(signal.SIGTERM)
    assert worker.wait(30) == 0
    runs = {span["attributes"]["messaging.message.id"]: span for span in read(exported)}
    for job_id in (str(done_id), str(dead_id)):
        run, send = runs[job_id], sent[job_id]
        assert run["kind"] == "CONSUMER"
        assert (run["trace_id"], run["parent_id"]) == (send["trace_id"], send["span_id"])
        assert run["links"] == [{"trace_id": send["trace_id"], "span_id": send["span_id"]}]
        assert run["attributes"]["messaging.destination.name"] == "default"
    assert runs[str(done_id)]["attributes"]["pgjobs.job.outcome"] == "succeeded"
    dead = runs[str(dead_id)]
    assert dead["attributes"]["pgjobs.job.outcome"] == "dead"
    assert dead["status"] == "ERROR"
    assert dead["events"][-1]["name"] == "pgjobs.dead_letter"
