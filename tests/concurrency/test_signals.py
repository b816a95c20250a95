"""The signals: what a project can hook into (metrics, tracing) without touching a job."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pytest
from django.dispatch import Signal

from django_pgjobs import signals
from django_pgjobs.models import Job
from tests import jobs
from tests.helpers import count, drain

pytestmark = pytest.mark.django_db(transaction=True)

Event = tuple[str, str, dict[str, Any]]


@contextmanager
def received(*names: str) -> Iterator[list[Event]]:
    """Collect (signal name, sender, kwargs) of the named signals while the block runs."""
    events: list[Event] = []
    connected: list[tuple[Signal, str]] = []
    for name in names:
        signal: Signal = getattr(signals, name)

        def on(sender: str, name: str = name, **kwargs: Any) -> None:
            kwargs.pop("signal", None)
            events.append((name, sender, kwargs))

        uid = f"test-{name}"
        signal.connect(on, weak=False, dispatch_uid=uid)
        connected.append((signal, uid))
    try:
        yield events
    finally:
        for signal, uid in connected:
            signal.disconnect(dispatch_uid=uid)


def outcomes(events: list[Event]) -> dict[int, str]:
    return {
        kwargs["handle"].id: kwargs["outcome"]
        for name, _, kwargs in events
        if name == "job_finished"
    }


def test_enqueue_sends_job_enqueued_with_merges_told_apart() -> None:
    with received("job_enqueued") as events:
        first = jobs.keyed.enqueue(account=1, version=1)
        merged = jobs.keyed.enqueue(account=1, version=2)
        many = Job.objects.enqueue_many(
            [{"kind": "demo.t", "queue": "bulk"}, {"kind": "demo.u", "queue": "bulk"}]
        )
    assert [(sender, kw["job_id"], kw["queue"], kw["inserted"]) for _, sender, kw in events] == [
        ("tests.keyed", first.id, "default", True),
        ("tests.keyed", merged.id, "default", False),
        ("demo.t", many[0].id, "bulk", True),
        ("demo.u", many[1].id, "bulk", True),
    ]


def test_every_way_a_run_ends_is_reported_once() -> None:
    ok = jobs.record.enqueue(label="ok").id
    fenced = jobs.fenced_record.enqueue(label="fenced").id
    retried = jobs.misbehave.enqueue(how="retry").id
    failed = jobs.misbehave.enqueue(how="fail").id
    spent = jobs.misbehave.using(max_attempts=1).enqueue(how="error").id
    with received("job_started", "job_finished", "job_dead") as events:
        drain()
    started = sorted(kw["handle"].id for name, _, kw in events if name == "job_started")
    assert started == sorted([ok, fenced, retried, failed, spent])
    assert outcomes(events) == {
        ok: "succeeded",
        fenced: "succeeded",  # acked by the handler inside its fence
        retried: "retried",
        failed: "dead",
        spent: "dead",
    }
    dead = {kw["handle"].id: kw["reason"] for name, _, kw in events if name == "job_dead"}
    assert dead == {failed: "hopeless", spent: "max attempts exceeded"}
    finished = [kw for name, _, kw in events if name == "job_finished"]
    assert all(kw["duration"] >= 0 for kw in finished)
    assert (
        next(kw for kw in finished if kw["handle"].id == spent)["error"] == "ValueError: bad value"
    )


def test_a_receiver_that_raises_breaks_neither_an_enqueue_nor_a_job(
    caplog: pytest.LogCaptureFixture,
) -> None:
    def broken(sender: str, **kwargs: Any) -> None:
        raise RuntimeError("receiver bug")

    for signal in (signals.job_enqueued, signals.job_started, signals.job_finished):
        signal.connect(broken, weak=False, dispatch_uid="broken")
    try:
        jobs.record.enqueue(label="still runs")
        drain()
    finally:
        for signal in (signals.job_enqueued, signals.job_started, signals.job_finished):
            signal.disconnect(dispatch_uid="broken")
    assert count() == 0 and count("tests_note") == 1
    assert "receiver bug" in caplog.text
