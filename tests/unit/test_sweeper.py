"""S24: the sweeper expires, buries stranded claims and prunes, in batches (replicas
sweeping at once: concurrency/test_sweeper.py)."""

from __future__ import annotations

import pytest
from django.test import override_settings

from django_pgjobs.maintenance import Sweeper
from django_pgjobs.models import Job
from tests.helpers import count, dead_row, execute, lapse, row

pytestmark = pytest.mark.django_db


def expire(job_id: int) -> None:
    execute("UPDATE pgjobs_job SET expires_at = now() - interval '1 s' WHERE id = %s", [job_id])


def test_s24_expired_pending_and_running_jobs_die_as_expired() -> None:
    pending = Job.objects.enqueue("demo.t", expires=60).id
    Job.objects.enqueue("demo.t", queue="other", expires=60)
    running = Job.objects.claim_one("other", "w1")
    untouched = Job.objects.enqueue("demo.t", expires=60).id
    expire(pending)
    expire(running.id)
    result = Sweeper().run_once()
    assert result.expired == 2
    assert dead_row(pending, "reason") == ("expired",)
    assert dead_row(running.id, "reason") == ("expired",)
    assert row(untouched, "state") == ("pending",)
    assert running.ack() is False


def test_s24_expired_jobs_are_never_claimed() -> None:
    job_id = Job.objects.enqueue("demo.t", expires=60).id
    expire(job_id)
    assert Job.objects.claim_one("default", "w1") is None


def test_s24_lapsed_exhausted_jobs_are_dead_lettered_without_a_claimer() -> None:
    job_id = Job.objects.enqueue("demo.t", max_attempts=1).id
    Job.objects.claim_one("default", "w1")
    lapse(job_id)
    assert Sweeper().run_once().lapsed_dead == 1
    assert dead_row(job_id, "reason", "last_error") == ("max attempts exceeded", "lease lapsed")


def test_s24_lapsed_jobs_with_attempts_left_go_back_to_pending() -> None:
    job_id = Job.objects.enqueue("demo.t", max_attempts=2).id
    stale = Job.objects.claim_one("default", "w1")
    lapse(job_id)
    assert Sweeper().run_once().lapsed_requeued == 1
    assert row(job_id, "state", "attempts", "claimed_by", "last_error") == (
        "pending",
        1,
        None,
        "lease lapsed",
    )
    assert stale.ack() is False
    assert Job.objects.claim_one("default", "w2").attempt == 2


def test_s24_done_jobs_are_pruned_when_their_retention_ends() -> None:
    Job.objects.enqueue_many([{"kind": "demo.t", "result_retention": 60} for _ in range(3)])
    handles = Job.objects.claim_batch("default", 3, "w1")
    Job.objects.ack_batch(handles)
    execute(
        "UPDATE pgjobs_job SET purge_at = now() - interval '1 s' WHERE id = %s", [handles[0].id]
    )
    assert Sweeper().run_once().done_pruned == 1
    assert count() == 2


@override_settings(
    PGJOBS={
        "DEAD_RETENTION": 3600,
        "QUEUES": {"keep": {"DEAD_RETENTION": None}, "short": {"DEAD_RETENTION": 60}},
    }
)
def test_s24_dead_letters_are_pruned_by_their_queues_retention() -> None:
    for queue in ("default", "keep", "short", "short"):
        Job.objects.enqueue("demo.t", queue=queue)
        Job.objects.claim_one(queue, "w1").fail()
    execute("UPDATE pgjobs_dead SET died_at = now() - interval '30 minutes'")
    assert Sweeper().run_once().dead_pruned == 2  # the two of "short"
    execute("UPDATE pgjobs_dead SET died_at = now() - interval '10 years'")
    assert Sweeper().run_once().dead_pruned == 1  # "default"; "keep" keeps forever
    assert [r[0] for r in execute("SELECT queue FROM pgjobs_dead")] == ["keep"]


def test_s24_sweeps_are_batched_and_idempotent() -> None:
    ids = [r.id for r in Job.objects.enqueue_many([{"kind": "demo.t", "expires": 60}] * 25)]
    execute("UPDATE pgjobs_job SET expires_at = now() - interval '1 s'")
    first = Sweeper(batch_size=10).run_once()
    assert first.expired == 25
    assert Sweeper(batch_size=10).run_once().total == 0
    assert count("pgjobs_dead", "id = ANY(%s)", [ids]) == 25


def test_s24_the_sweeper_prunes_rate_claims_older_than_a_day_and_keeps_younger_ones() -> None:
    execute(
        "INSERT INTO pgjobs_rate_claim (scope, at)"
        " SELECT 'key:gone', now() - interval '1 day 1 minute' FROM generate_series(1, 25)"
    )
    execute("INSERT INTO pgjobs_rate_claim (scope, at) VALUES ('key:live', now() - interval '1 h')")
    Sweeper(batch_size=10).run_once()  # three batches: 10, 10, 5
    assert execute("SELECT scope FROM pgjobs_rate_claim") == [("key:live",)]
