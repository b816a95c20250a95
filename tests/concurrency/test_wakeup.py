"""What wakes an idle worker (S23): a notification of one of its queues from another
connection does; one its own connection sent does not (the loop looks again after each
of its own statements), nor one of a queue it does not claim from."""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator

import pytest
from django.db import connection

from django_pgjobs.conf import pgjobs_settings
from django_pgjobs.db import connection as db
from django_pgjobs.models import Job
from django_pgjobs.worker import Worker
from django_pgjobs.worker.wakeup import Wakeup
from django_pgjobs.workflows import workflow
from tests.helpers import other_connection

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def wakeup() -> Iterator[Wakeup]:
    line = Wakeup(using="default", listen=True, poll_interval=30)
    line.connect()
    assert line.connected
    try:
        yield line
    finally:
        line.close()


def notify_from_this_connection(queue: str) -> None:
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_notify(%s, %s)", [pgjobs_settings.CHANNEL, queue])


def test_s23_a_notification_from_another_connection_wakes_the_loop_for_its_queues(
    wakeup: Wakeup,
) -> None:
    own = db.backend_pid("default")
    with other_connection() as conn:
        conn.execute("SELECT pg_notify(%s, 'mail')", [pgjobs_settings.CHANNEL])
    assert wakeup.wait(5, ["mail", "default"], (own,)) is True
    with other_connection() as conn:
        conn.execute("SELECT pg_notify(%s, 'reports')", [pgjobs_settings.CHANNEL])
    started = time.monotonic()
    assert wakeup.wait(0.5, ["mail"], (own,)) is False  # not one of its queues
    assert time.monotonic() - started < 5


def test_s23_a_notification_one_of_its_own_connections_sent_wakes_nothing(
    wakeup: Wakeup,
) -> None:
    own = db.backend_pid("default")
    assert own is not None
    # The loop's connection, or the recorder's (another process id, listed beside it).
    notify_from_this_connection("mail")
    assert wakeup.wait(0.5, ["mail"], (None, own)) is False
    notify_from_this_connection("mail")
    assert wakeup.wait(0.5, ["mail"], (own, None)) is False
    # The same notification, when the connection is none of the worker's, wakes it.
    notify_from_this_connection("mail")
    assert wakeup.wait(5, ["mail"], (own + 1, None)) is True


def test_s32_a_cancellation_is_heard_whoever_sent_it(wakeup: Wakeup) -> None:
    own = db.backend_pid("default")
    token = uuid.uuid4()
    notify_from_this_connection(f"pgjobs.cancel:5:{token}")
    with other_connection() as conn:
        conn.execute(
            "SELECT pg_notify(%s, %s)", [pgjobs_settings.CHANNEL, f"pgjobs.cancel:6:{token}"]
        )
    deadline = time.monotonic() + 5
    heard: list[tuple[int, uuid.UUID]] = []
    while len(heard) < 2 and time.monotonic() < deadline:
        assert wakeup.wait(0.2, ["mail"], (own,)) is False  # a cancellation wakes no claim
        heard += wakeup.take_cancels()
    assert sorted(heard) == [(5, token), (6, token)]


def test_s23_s29_a_worker_runs_the_child_its_own_ack_frees_at_once_with_notify_on() -> None:
    """Its own ack's NOTIFY no longer wakes it: the look after every flush must. With a
    poll interval of a minute, a chain of ten runs only if each link is claimed as its
    parent's ack frees it."""
    with workflow() as wf:
        step = wf.add("tests.noop")
        for _ in range(9):
            step = wf.add("tests.noop", after=[step])
    worker = Worker(queues=["default"], burst=True, sweep_interval=0, poll_interval=60)
    started = time.monotonic()
    assert worker.run() == 0
    assert worker.stats.succeeded == 10  # a burst worker that missed a link leaves it
    assert time.monotonic() - started < 20
    assert not Job.objects.exists()
