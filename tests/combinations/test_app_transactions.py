"""An application transaction held open while a worker runs (S39, S41): the worker's
statements wait for its row locks a bounded time and go on with the other jobs."""

from __future__ import annotations

import threading
import time

import pytest
from django.db import connections, transaction

from django_pgjobs.models import Job
from tests.helpers import count, execute, row_held, running_worker, scalar, wait_until
from tests.jobs import LOCK_WAITS

pytestmark = pytest.mark.django_db(transaction=True)


def state_of(job_id: int) -> str | None:
    rows = execute("SELECT state FROM pgjobs_job WHERE id = %s", [job_id])
    return str(rows[0][0]) if rows else None


@pytest.mark.parametrize("listen", [True, False], ids=["notify", "poll-only"])
def test_s39_s41_a_child_written_after_a_running_job_stalls_nothing_else(listen: bool) -> None:
    """A request writes a child `after=` a running job and keeps its transaction open
    for 6 s: the parent's ack waits for it, but the worker heartbeats a job on a 2 s
    lease all along (it runs once), runs a job enqueued meanwhile at once, and records
    the parent's ack once the request commits."""
    parent = Job.objects.enqueue("tests.record", {"label": "parent", "sleep": 0.3}, queue="long")
    long_one = Job.objects.enqueue(
        "tests.locked_tenant", {"tenant": "l", "seconds": 4.0, "how": "sleep"}
    ).id
    released = threading.Event()
    errors: list[BaseException] = []

    def request() -> None:
        try:
            with transaction.atomic():
                Job.objects.enqueue(
                    "tests.record", {"label": "child"}, queue="long", after=[parent.id]
                )
                released.wait(6)
        except BaseException as error:
            errors.append(error)
        finally:
            connections.close_all()

    with running_worker(queues=["long"], concurrency=3, listen=listen, poll_interval=0.2):
        wait_until(lambda: state_of(parent.id) == "running" and state_of(long_one) == "running")
        app = threading.Thread(target=request, daemon=True)
        app.start()
        time.sleep(1.0)  # the parent finished meanwhile: its ack waits for the request
        assert state_of(parent.id) == "running"
        short = Job.objects.enqueue("tests.record", {"label": "meanwhile"}, queue="long").id
        wait_until(lambda: state_of(short) is None, timeout=5)
        wait_until(lambda: count("tests_note", "text = 'l end'") == 1, timeout=10)
        assert state_of(parent.id) == "running"  # still held: the request is open
        released.set()
        app.join(10)
        wait_until(lambda: count("tests_note", "text = 'child'") == 1, timeout=15)
    assert not errors
    assert count("tests_note", "text = 'parent'") == 1
    assert count("tests_note", "text = 'l start'") == 1  # heartbeaten: ran once
    assert count("pgjobs_dead") == 0


#: Jobs enqueued while an ack waits for a held row.
PROBES = 5


@pytest.mark.parametrize("listen", [True, False], ids=["notify", "poll-only"])
def test_s39_an_ack_waiting_for_a_row_a_request_holds_holds_up_no_claim(listen: bool) -> None:
    """A request locks a running job's row; the job's ack then waits for it, up to the
    worker's lock wait (500 ms) at each try. Meanwhile the worker claims and starts a job
    enqueued after the wait began: its outcomes are written on a connection of their
    own (the recorder's), not in the loop that claims. The held job is acked once the
    request ends."""
    held = Job.objects.enqueue("tests.record", {"label": "held", "sleep": 0.3}).id
    with running_worker(concurrency=2, listen=listen, poll_interval=0.05):
        wait_until(lambda: state_of(held) == "running")
        with row_held(held):
            wait_until(lambda: scalar(LOCK_WAITS) == 1, timeout=5, interval=0.005)
            # Jobs enqueued over the first 400 ms of the wait: a loop that waited for the
            # ack itself would start them all after it (the next try comes 500 ms later).
            for _ in range(PROBES):
                Job.objects.enqueue("tests.note_lock_waits")
                time.sleep(0.1)
            wait_until(lambda: count("tests_note", "text LIKE 'lock waits %'") == PROBES, timeout=5)
            assert state_of(held) == "running"
        wait_until(lambda: state_of(held) is None, timeout=15)
    # Jobs started while the ack still waited for the row.
    assert count("tests_note", "text = 'lock waits 1'") >= 1
    assert count("tests_note", "text = 'held'") == 1
    assert count("pgjobs_dead") == 0
