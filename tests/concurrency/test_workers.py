"""The worker registry: every worker heartbeats its row from a service thread; live,
stopped or gone (3 missed heartbeats) on the database clock; pruned after a day; shown
by the admin and `jobsctl status`, which warn about queues no live worker serves."""

from __future__ import annotations

import io
import os
import socket
import time
from datetime import timedelta
from typing import Any

import pytest
from django.core.management import call_command
from django.test import Client, override_settings
from django.urls import reverse

from django_pgjobs import __version__
from django_pgjobs.maintenance import Sweeper
from django_pgjobs.models import Job, JobStats, Worker
from tests import jobs
from tests.helpers import count, execute, running_worker, wait_until

pytestmark = pytest.mark.django_db(transaction=True)

WORKERS = reverse("admin:django_pgjobs_worker_changelist")


def registered(worker_id: str) -> dict[str, Any] | None:
    found = [w for w in Worker.objects.status() if w.id == worker_id]
    return vars_of(found[0]) if found else None


def vars_of(status: object) -> dict[str, Any]:
    return {name: getattr(status, name) for name in status.__slots__}  # type: ignore[attr-defined]


def jobsctl_status() -> str:
    out = io.StringIO()
    call_command("jobsctl", "status", stdout=out)
    return out.getvalue()


@override_settings(PGJOBS={"WORKER_HEARTBEAT": 0.2})
def test_a_started_worker_registers_heartbeats_and_is_stopped_when_it_leaves() -> None:
    with running_worker(queues=["default", "long"], concurrency=3) as worker:
        wait_until(lambda: registered(worker.worker_id) is not None)
        row = registered(worker.worker_id)
        assert row is not None
        assert (row["host"], row["pid"]) == (socket.gethostname(), os.getpid())
        assert row["queues"] == ["default", "long"] and row["concurrency"] == 3
        assert row["version"] == __version__ and row["live"] is True
        first_seen = row["last_seen_at"]
        job_id = jobs.noop.enqueue().id
        wait_until(lambda: Job.objects.get_job(job_id) is None)
        wait_until(lambda: (registered(worker.worker_id) or {}).get("succeeded") == 1)
        assert (registered(worker.worker_id) or {})["last_seen_at"] > first_seen
    row = registered(worker.worker_id)
    assert row is not None and row["stopped_at"] is not None and row["live"] is False
    assert row["running"] == 0 and row["succeeded"] == 1


def test_a_worker_three_heartbeats_late_is_gone_by_the_database_clock() -> None:
    Worker.objects.heartbeat(
        "host:1:abc",
        host="host",
        pid=1,
        queues=["mail"],
        concurrency=2,
        version="1",
        heartbeat_s=5,
        running=1,
        succeeded=0,
        failed=0,
    )
    assert (registered("host:1:abc") or {})["live"] is True
    execute("UPDATE pgjobs_worker SET last_seen_at = now() - interval '14 seconds'")
    assert (registered("host:1:abc") or {})["live"] is True  # 2.8 beats late: still live
    execute("UPDATE pgjobs_worker SET last_seen_at = now() - interval '16 seconds'")
    assert (registered("host:1:abc") or {})["live"] is False


def test_s22_liveness_never_reads_pythons_clock(monkeypatch: pytest.MonkeyPatch) -> None:
    Worker.objects.heartbeat(
        "host:1:abc",
        host="host",
        pid=1,
        queues=["mail"],
        concurrency=2,
        version="1",
        heartbeat_s=5,
        running=0,
        succeeded=0,
        failed=0,
    )
    skewed = time.time() + 6 * 3600
    monkeypatch.setattr(time, "time", lambda: skewed)
    assert (registered("host:1:abc") or {})["live"] is True


def test_the_sweeper_prunes_workers_not_seen_for_a_day() -> None:
    for worker_id in ("old:1:a", "new:1:b"):
        Worker.objects.heartbeat(
            worker_id,
            host="h",
            pid=1,
            queues=["q"],
            concurrency=1,
            version="1",
            heartbeat_s=5,
            running=0,
            succeeded=0,
            failed=0,
        )
    execute(
        "UPDATE pgjobs_worker SET last_seen_at = now() - interval '25 hours' WHERE id = 'old:1:a'"
    )
    Sweeper().run_once()
    assert [w.id for w in Worker.objects.status()] == ["new:1:b"]


@override_settings(PGJOBS={"WORKER_HEARTBEAT": 0.2})
def test_jobsctl_status_shows_the_workers_and_warns_of_unserved_queues() -> None:
    jobs.noop.using(queue="orphans").enqueue()
    with running_worker(queues=["long"]) as worker:
        wait_until(lambda: registered(worker.worker_id) is not None)
        text = jobsctl_status()
        assert worker.worker_id in text and "live" in text
        assert "Warning: no live worker serves orphans, which has runnable jobs." in text
    text = jobsctl_status()
    assert "stopped" in text


@override_settings(PGJOBS={"WORKER_HEARTBEAT": 0.2})
def test_the_admin_lists_workers_with_what_they_run_and_warns(
    admin_client: Client,
) -> None:
    job_id = jobs.cooperative.enqueue().id
    jobs.noop.using(queue="orphans").enqueue()
    with running_worker(queues=["long"]) as worker:
        wait_until(lambda: (registered(worker.worker_id) or {}).get("running") == 1)
        page = admin_client.get(WORKERS).content.decode()
        assert worker.worker_id in page and "pgjobs-worker-live" in page
        assert f"tests.cooperative#{job_id}" in page
        assert "No live worker serves" in page and "orphans" in page
        Job.objects.cancel_many([job_id])
        wait_until(lambda: worker.stats.cancelled == 1)
    execute("UPDATE pgjobs_worker SET stopped_at = NULL, last_seen_at = now() - interval '1 hour'")
    page = admin_client.get(WORKERS).content.decode()
    assert "pgjobs-worker-gone" in page
    assert count("pgjobs_worker") == 1


def test_view_only_staff_may_see_workers_but_not_change_them(client: Client) -> None:
    from django.contrib.auth.models import Permission, User

    user = User.objects.create_user("looker", password="pw", is_staff=True)
    user.user_permissions.set(Permission.objects.filter(codename="view_worker"))
    client.force_login(user)
    assert client.get(WORKERS).status_code == 200
    assert client.get(reverse("admin:django_pgjobs_worker_add")).status_code == 403


def test_a_heartbeat_interval_that_is_not_positive_is_a_configuration_error() -> None:
    from django.core.exceptions import ImproperlyConfigured

    from django_pgjobs.conf import pgjobs_settings

    with override_settings(PGJOBS={"WORKER_HEARTBEAT": 0}), pytest.raises(ImproperlyConfigured):
        pgjobs_settings.validate()
    assert timedelta(seconds=pgjobs_settings.WORKER_HEARTBEAT) == timedelta(seconds=5)


def test_s32_a_cancelled_running_job_is_counted_as_cancelled_not_done() -> None:
    job_id = jobs.cooperative.enqueue().id
    with running_worker(queues=["long"]) as worker:
        wait_until(lambda: Job.objects.filter(pk=job_id, state="running").exists())
        time.sleep(0.1)
        Job.objects.cancel_many([job_id])
        wait_until(lambda: worker.stats.cancelled == 1)
    totals = execute("SELECT sum(succeeded), sum(dead), sum(cancelled) FROM pgjobs_stats")
    assert totals == [(0, 0, 1)]
    [point] = [p for p in JobStats.objects.throughput(5) if p.cancelled]
    assert (point.succeeded, point.dead, point.cancelled) == (0, 0, 1)


def test_a_worker_keeps_each_queues_and_kinds_queue_wait_and_run_time() -> None:
    from django_pgjobs.models import KindStats
    from tests.helpers import drain

    for _ in range(5):
        jobs.noop.enqueue()
    slow = jobs.noop.using(delay=0).enqueue().id
    execute("UPDATE pgjobs_job SET run_after = now() - interval '40 seconds' WHERE id = %s", [slow])
    drain(queues=["default"])
    report = KindStats.objects.latency("hour")
    latency = report.kinds["tests.noop"]
    assert latency.runs == 6
    assert report.queues["default"].runs >= 6  # kept per queue as well
    assert latency.wait_p50_s is not None and latency.wait_p50_s <= 30
    assert latency.wait_p95_s == 60  # the one that waited 40 s: the bucket up to a minute
    assert latency.run_p95_s is not None and latency.run_p95_s <= 1
