"""Prometheus metrics: counters fed by the signals, gauges read from the database at
scrape time, served by a Django view (and by `runjobs --metrics-port`:
processes/test_metrics.py)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from django.test import Client, override_settings
from prometheus_client import CollectorRegistry

from django_pgjobs.metrics import JobMetrics, QueueGauges
from django_pgjobs.models import Job
from tests import jobs
from tests.helpers import drain

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def registry() -> Iterator[CollectorRegistry]:
    """A registry of its own with a JobMetrics connected to the signals."""
    registry = CollectorRegistry()
    metrics = JobMetrics(registry)
    metrics.connect()
    try:
        yield registry
    finally:
        metrics.disconnect()


def sample(registry: CollectorRegistry, name: str, **labels: str) -> float | None:
    return registry.get_sample_value(name, labels)


def test_counters_and_histograms_follow_every_job(registry: CollectorRegistry) -> None:
    for label in ("a", "b"):
        jobs.record.enqueue(label=label)
    jobs.misbehave.enqueue(how="retry")
    jobs.misbehave.enqueue(how="fail")
    drain()
    record = {"queue": "default", "kind": "tests.record"}
    misbehave = {"queue": "default", "kind": "tests.misbehave"}
    assert sample(registry, "pgjobs_jobs_enqueued_total", **record) == 2
    assert sample(registry, "pgjobs_jobs_started_total", **record) == 2
    assert sample(registry, "pgjobs_jobs_succeeded_total", **record) == 2
    assert sample(registry, "pgjobs_jobs_retried_total", **misbehave) == 1
    assert sample(registry, "pgjobs_jobs_dead_total", **misbehave) == 1
    assert sample(registry, "pgjobs_job_duration_seconds_count", **record) == 2
    assert sample(registry, "pgjobs_job_start_delay_seconds_count", **misbehave) == 2
    delay_sum = sample(registry, "pgjobs_job_start_delay_seconds_sum", **record)
    assert delay_sum is not None and 0 <= delay_sum < 60


def test_queue_gauges_are_read_from_the_database_at_each_scrape() -> None:
    registry = CollectorRegistry()
    registry.register(QueueGauges())
    Job.objects.enqueue("demo.t", queue="mail")
    Job.objects.enqueue("demo.t", queue="mail", delay=600)
    Job.objects.enqueue("demo.t", queue="reports")
    Job.objects.claim_one("reports", "w")
    assert sample(registry, "pgjobs_jobs", queue="mail", state="runnable") == 1
    assert sample(registry, "pgjobs_jobs", queue="mail", state="scheduled") == 1
    assert sample(registry, "pgjobs_jobs", queue="reports", state="running") == 1
    Job.objects.enqueue("demo.t", queue="mail")
    assert sample(registry, "pgjobs_jobs", queue="mail", state="runnable") == 2
    assert sample(registry, "pgjobs_oldest_runnable_seconds", queue="mail") >= 0


TOKEN = "a-scrape-token-of-some-length"


@override_settings(PGJOBS={"METRICS_TOKEN": TOKEN, "METRICS_CACHE": 0})
def test_the_view_serves_the_gauges_to_a_scraper_with_the_token(client: Client) -> None:
    Job.objects.enqueue("demo.t", queue="viewed")
    response = client.get("/metrics/pgjobs", HTTP_AUTHORIZATION=f"Bearer {TOKEN}")
    assert response.status_code == 200
    assert response["Content-Type"].startswith("text/plain")
    assert 'pgjobs_jobs{queue="viewed",state="runnable"} 1.0' in response.content.decode()
    assert client.post("/metrics/pgjobs").status_code == 405
