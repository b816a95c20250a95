"""S3: a trigger that lands while its key is running runs once more after it, whichever
way the running one ends, and two runs of one key never overlap (in one rolled-back
transaction; the wake-up at the ack's commit: concurrency/test_reruns.py)."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from django_pgjobs.claims import JobHandle
from django_pgjobs.maintenance import Sweeper
from django_pgjobs.models import Job
from tests.helpers import count, execute, lapse, row, seconds_from_now

pytestmark = pytest.mark.django_db


def running_with_trigger(**enqueue_options: object) -> JobHandle:
    Job.objects.enqueue("demo.sync", {"v": 1}, key="acct:1", **enqueue_options)
    handle = Job.objects.claim_one("default", "w1")
    assert handle is not None
    merged = Job.objects.enqueue("demo.sync", {"v": 2}, key="acct:1")
    assert merged == (handle.id, False)
    return handle


def sweep_after_expiry(handle: JobHandle) -> bool:
    execute("UPDATE pgjobs_job SET expires_at = now() - interval '1 s' WHERE id = %s", [handle.id])
    return Sweeper().run_once().triggers_promoted == 1


def sweep_after_lapse(handle: JobHandle) -> bool:
    lapse(handle.id)
    return Sweeper().run_once().triggers_promoted == 1


def reclaim_after_lapse(handle: JobHandle) -> bool:
    """The next claim takes the lapsed run back and hands out the promoted trigger at once;
    handing that claim back leaves the trigger pending for the common checks below."""
    lapse(handle.id)
    rerun = Job.objects.claim_one("default", "w2")
    assert rerun is not None and (rerun.id, rerun.payload) == (handle.id, {"v": 2})
    return rerun.release()


ENDINGS: dict[str, Callable[[JobHandle], bool]] = {
    "ack": lambda h: h.ack(),
    "retry": lambda h: h.retry("flaky"),
    "retry_exhausted": lambda h: h.retry("flaky"),
    "fail": lambda h: h.fail("broken"),
    "release": lambda h: h.release(),
    "lapse_at_claim": reclaim_after_lapse,
    "lapse_exhausted_at_claim": reclaim_after_lapse,
    "lapse_exhausted_at_sweep": sweep_after_lapse,
    "expired": sweep_after_expiry,
}


@pytest.mark.parametrize("ending", ENDINGS)
def test_s3_trigger_while_running_runs_once_more_whatever_the_ending(ending: str) -> None:
    handle = running_with_trigger(max_attempts=1 if "exhausted" in ending else 5)
    assert ENDINGS[ending](handle)
    assert count("pgjobs_dead") == 0
    assert count() == 1
    state, payload, attempts, rerun_payload = row(
        handle.id, "state", "payload", "attempts", "rerun_payload"
    )
    assert (state, payload, attempts, rerun_payload) == ("pending", {"v": 2}, 0, None)
    rerun = Job.objects.claim_one("default", "w3")
    assert rerun is not None and rerun.id == handle.id and rerun.payload == {"v": 2}


def test_s3_the_failed_run_is_kept_in_the_errors_of_the_rerun() -> None:
    handle = running_with_trigger()
    assert handle.fail("broken")
    last_error, errors = row(handle.id, "last_error", "errors")
    assert last_error == "broken"
    assert [(e["attempt"], e["error"]) for e in errors] == [(1, "broken")]


def test_s3_rerun_keeps_the_triggers_schedule() -> None:
    Job.objects.enqueue("demo.sync", {"v": 1}, key="k")
    handle = Job.objects.claim_one("default", "w1")
    Job.objects.enqueue("demo.sync", {"v": 2}, key="k", delay=120)
    assert handle.ack()
    assert 119 < seconds_from_now("run_after", handle.id) <= 120
    assert Job.objects.claim_one("default", "w2") is None


def test_s3_two_runs_of_one_key_never_overlap() -> None:
    Job.objects.enqueue("demo.sync", {"v": 1}, key="k")
    handle = Job.objects.claim_one("default", "w1")
    for v in range(2, 6):
        Job.objects.enqueue("demo.sync", {"v": v}, key="k")
        assert Job.objects.claim_one("default", "w2") is None  # still running: no overlap
    assert count() == 1
    assert handle.ack()
    rerun = Job.objects.claim_one("default", "w2")
    assert rerun.payload == {"v": 5}  # the latest trigger wins (replace)


def test_s3_ignore_stores_no_trigger_on_a_running_job() -> None:
    Job.objects.enqueue("demo.sync", {"v": 1}, key="k")
    handle = Job.objects.claim_one("default", "w1")
    Job.objects.enqueue("demo.sync", {"v": 2}, key="k", on_conflict="ignore")
    assert row(handle.id, "rerun_payload") == (None,)
    assert handle.ack()
    assert count() == 0


def test_s3_keep_schedule_keeps_the_first_triggers_schedule_while_running() -> None:
    Job.objects.enqueue("demo.sync", {"v": 1}, key="k")
    handle = Job.objects.claim_one("default", "w1")
    Job.objects.enqueue("demo.sync", {"v": 2}, key="k", delay=60, on_conflict="keep_schedule")
    Job.objects.enqueue("demo.sync", {"v": 3}, key="k", delay=5, on_conflict="keep_schedule")
    assert row(handle.id, "rerun_payload") == ({"v": 3},)
    assert 59 < seconds_from_now("rerun_after", handle.id) <= 60
