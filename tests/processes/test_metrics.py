"""Prometheus metrics served by a real `manage.py runjobs --metrics-port`. Counters,
gauges and the Django view: concurrency/test_metrics.py."""

from __future__ import annotations

import socket
import urllib.request

import pytest

from django_pgjobs.testing.localdb import free_port
from tests import jobs
from tests.spawn import Workers, wait_for

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.mark.slow
def test_runjobs_serves_its_metrics(workers: Workers) -> None:
    port = free_port()
    process = workers.start("--metrics-port", str(port), "--metrics-addr", "127.0.0.1")

    def scrape() -> str:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=2) as page:
                return str(page.read().decode())
        except OSError:
            return ""

    jobs.record.enqueue(label="measured")
    line = 'pgjobs_jobs_succeeded_total{kind="tests.record",queue="default"} 1.0'
    text = wait_for(lambda: line in scrape() and scrape(), what="the job to be counted")
    assert "pgjobs_job_duration_seconds_bucket" in text
    assert "pgjobs_jobs{" in text
    assert process.process.poll() is None


def test_runjobs_refuses_a_port_in_use(workers: Workers) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        process = workers.start("--metrics-port", str(port), "--metrics-addr", "127.0.0.1")
        assert process.wait(30) != 0
    assert "Pick a free port" in process.output()
