"""S24: replicas sweeping at once move each row once, and a replica taking turns stops
while another sweeps. What a sweep does: unit/test_sweeper.py."""

from __future__ import annotations

import pytest

from django_pgjobs.maintenance import Sweeper
from django_pgjobs.models import Job
from tests.helpers import count, execute, run_threads

pytestmark = pytest.mark.django_db


@pytest.mark.django_db(transaction=True)
def test_s24_replicas_sweeping_at_once_move_each_row_once() -> None:
    Job.objects.enqueue_many([{"kind": "demo.t", "expires": 60} for _ in range(300)])
    execute("UPDATE pgjobs_job SET expires_at = now() - interval '1 s'")
    results = run_threads(4, lambda _: Sweeper(batch_size=20).run_once().expired)
    assert sum(results) == 300
    assert count("pgjobs_dead") == 300 and count() == 0


@pytest.mark.django_db(transaction=True)
def test_s24_taking_turns_stops_while_another_replica_sweeps() -> None:
    import threading

    from django.db import connection, transaction

    Job.objects.enqueue("demo.t", expires=60)
    execute("UPDATE pgjobs_job SET expires_at = now() - interval '1 s'")
    holding = threading.Event()
    done = threading.Event()

    def hold_the_turn() -> None:
        with transaction.atomic():
            assert Job.objects.try_sweep_lock()
            holding.set()
            done.wait(10)
        connection.close()

    holder = threading.Thread(target=hold_the_turn)
    holder.start()
    assert holding.wait(10)
    result = Sweeper(take_turns=True).run_once()
    done.set()
    holder.join(10)
    assert (result.complete, result.expired) == (False, 0)
    assert Sweeper(take_turns=True).run_once().expired == 1
