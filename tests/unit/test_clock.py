"""S22: the database clock, throughout. Python's clock, skewed by hours, changes nothing."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
import time_machine

from django_pgjobs.maintenance import Sweeper
from django_pgjobs.models import Job
from tests.helpers import dead_row, execute, lapse, row, scalar, seconds_from_now

pytestmark = pytest.mark.django_db


@pytest.mark.parametrize("skew", [timedelta(hours=-7), timedelta(hours=5), timedelta(days=3)])
def test_s22_python_clock_skew_changes_nothing(skew: timedelta) -> None:
    db_now = scalar("SELECT now()")
    with time_machine.travel(datetime.now(UTC) + skew, tick=True):
        assert abs(datetime.now(UTC) - db_now - skew) < timedelta(minutes=1)

        scheduled = Job.objects.enqueue("demo.t", delay=60, expires=300).id
        runnable = Job.objects.enqueue("demo.t", expires=300).id
        assert -1 < seconds_from_now("run_after", runnable) <= 0
        assert 59 < seconds_from_now("run_after", scheduled) <= 60
        assert 299 < seconds_from_now("expires_at", runnable) <= 300

        handle = Job.objects.claim_one("default", "w1")
        assert handle is not None and handle.id == runnable
        assert Job.objects.claim_one("default", "w1") is None
        # The lease runs from the claim statement's start: in this test's transaction a
        # little after now(), never hours off as Python's clock is.
        assert 59 < seconds_from_now("claimed_until", runnable) < 61
        assert handle.heartbeat(30)
        assert 29 < seconds_from_now("claimed_until", runnable) <= 30

        assert handle.retry("again", delay=20)
        assert 19 < seconds_from_now("run_after", runnable) <= 20
        assert 19 < (Job.objects.next_due_in("default") or 0) <= 20
        assert Sweeper().run_once().total == 0

        execute("UPDATE pgjobs_job SET run_after = now() - interval '1 s'")
        again = Job.objects.claim_one("default", "w1")
        assert again is not None
        lapse(again.id)
        assert again.ack() is False

        execute("UPDATE pgjobs_job SET expires_at = now() - interval '1 s'")
        assert Sweeper().run_once().expired == 2
        assert dead_row(runnable, "reason") == ("expired",)
        assert row(scheduled, "id") is None


def test_s22_the_errors_history_is_stamped_by_the_database() -> None:
    with time_machine.travel(datetime(2001, 1, 1, tzinfo=UTC)):
        Job.objects.enqueue("demo.t")
        handle = Job.objects.claim_one("default", "w1")
        handle.retry("x", delay=0)
    (entry,) = row(handle.id, "errors")[0]
    assert entry["at"].startswith(str(scalar("SELECT extract(year FROM now())::int")))
