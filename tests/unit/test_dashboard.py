"""The dashboard: per-queue and total counts, each a link; charts of the last hour and
day; the workers; a JSON view behind the same permission that the page refreshes from."""

from __future__ import annotations

import pytest
from django.contrib.auth.models import Permission, User
from django.test import Client
from django.urls import reverse

from django_pgjobs.models import Job, JobStats, KindStats, Worker
from tests.helpers import execute

pytestmark = pytest.mark.django_db

PAGE = reverse("admin:django_pgjobs_dashboard_changelist")
DATA = reverse("admin:django_pgjobs_dashboard_data")


@pytest.fixture
def queues() -> None:
    Job.objects.enqueue("mail.send", queue="mail")
    Job.objects.enqueue("mail.send", queue="mail", delay=600)
    Job.objects.enqueue("sync.run", queue="sync", result_retention=600)
    Job.objects.claim_one("sync", "host:1:a").ack({"ok": True})
    Job.objects.enqueue("sync.run", queue="sync", max_attempts=3)
    Job.objects.claim_one("sync", "host:1:a").retry("flaky", delay=3600)
    Job.objects.enqueue("sync.run", queue="sync", max_attempts=1)
    Job.objects.claim_one("sync", "host:1:a").fail()
    Job.objects.enqueue("sync.run", queue="sync")
    Job.objects.claim_one("sync", "host:1:a")
    Job.objects.enqueue("sync.run", queue="sync")
    JobStats.objects.record({"sync": (1, 1, 1, 0)})


def test_the_dashboard_shows_every_count_per_queue_and_in_total(
    admin_client: Client, queues: None
) -> None:
    response = admin_client.get(PAGE)
    assert response.status_code == 200
    page = response.content.decode()
    rows = {
        row["queue"]: {f: label for f, label, _ in row["cells"]} for row in response.context["rows"]
    }
    assert rows["mail"] == {
        "runnable": "1", "scheduled": "1", "retrying": "0", "running": "0", "dead": "0", "done": "0"
    }  # fmt: skip
    assert rows["sync"] == {
        "runnable": "1", "scheduled": "1", "retrying": "1", "running": "1", "dead": "1", "done": "1"
    }  # fmt: skip
    total = {f: label for f, label, _ in response.context["total"]["cells"]}
    assert total == {
        "runnable": "2", "scheduled": "2", "retrying": "1", "running": "1", "dead": "1", "done": "1"
    }  # fmt: skip
    assert "?queue=sync&amp;readiness=retrying" in page
    assert 'href="/admin/django_pgjobs/deadjob/?queue=sync"' in page
    assert 'aria-label="jobs per minute, last 60 min"' in page
    assert 'aria-label="jobs per 15 min, last 24 h"' in page
    assert "dashboard.js" in page and f'data-url="{DATA}"' in page
    assert '<strong class="pgjobs-live-count">0</strong> live workers' in page


def test_the_dashboard_is_linked_from_the_index_and_the_lists(admin_client: Client) -> None:
    assert PAGE in admin_client.get(reverse("admin:index")).content.decode()
    for name in ("job", "deadjob", "queuecontrol", "worker"):
        page = admin_client.get(reverse(f"admin:django_pgjobs_{name}_changelist"))
        assert PAGE in page.content.decode(), name


def test_the_json_view_has_the_numbers_and_follows_the_queue(
    admin_client: Client, queues: None
) -> None:
    data = admin_client.get(DATA).json()
    sync = next(q for q in data["queues"] if q["queue"] == "sync")
    assert (sync["runnable"], sync["retrying"], sync["running"], sync["dead"]) == (1, 1, 1, 1)
    assert data["totals"]["runnable"] == 2 and data["totals"]["runnable_estimated"] is False
    assert set(data["html"]) == {"warnings", "queues", "workers", "kinds", "hour", "day"}
    assert data["workers"] == {"live": 0, "registered": 0}
    assert data["unserved"] == ["mail", "sync"]
    Job.objects.enqueue("mail.send", queue="mail")
    Worker.objects.heartbeat(
        "w:1:a", host="w", pid=1, queues=["mail"], concurrency=1, version="1",
        heartbeat_s=5, running=0, succeeded=0, failed=0,
    )  # fmt: skip
    again = admin_client.get(DATA).json()
    assert next(q for q in again["queues"] if q["queue"] == "mail")["runnable"] == 2
    assert again["workers"]["live"] == 1 and again["unserved"] == ["sync"]
    assert again["at"] > data["at"] or again["at"] == data["at"]
    assert admin_client.get(DATA)["Cache-Control"].startswith("max-age=0")


def test_the_json_view_refuses_anonymous_and_non_staff_users(client: Client) -> None:
    response = client.get(DATA)
    assert response.status_code == 302 and "/login/" in response["Location"]
    User.objects.create_user("member", password="pw", is_staff=False)
    client.login(username="member", password="pw")
    response = client.get(DATA)
    assert response.status_code == 302 and "/login/" in response["Location"]
    assert client.get(PAGE).status_code == 302


def test_staff_without_the_view_permission_are_refused(client: Client) -> None:
    staff = User.objects.create_user("staff", password="pw", is_staff=True)
    client.force_login(staff)
    assert client.get(DATA).status_code == 403
    assert client.get(PAGE).status_code == 403
    staff.user_permissions.set(Permission.objects.filter(codename="view_job"))
    client.force_login(User.objects.get(pk=staff.pk))
    assert client.get(DATA).status_code == 200
    assert client.get(PAGE).status_code == 200


def test_the_day_chart_sums_fifteen_minutes_per_bar() -> None:
    JobStats.objects.record({"a": (2, 0, 0, 0), "b": (3, 1, 0, 1)})
    execute("UPDATE pgjobs_stats SET minute = minute - interval '2 hours'")
    JobStats.objects.record({"a": (5, 0, 0, 0)})
    points = JobStats.objects.throughput(96, bucket_min=15)
    assert len(points) == 96
    assert [p.succeeded for p in points if p.succeeded] == [5, 5]
    assert sum(p.cancelled for p in points) == 1
    with pytest.raises(ValueError, match="divide an hour"):
        JobStats.objects.throughput(10, bucket_min=7)


def test_per_kind_percentiles_come_from_the_workers_histograms(admin_client: Client) -> None:
    from django_pgjobs.managers.stats import LATENCY_BUCKETS_S, bucket_of

    buckets = len(LATENCY_BUCKETS_S)

    def histogram(*seconds: float) -> list[int]:
        counts = [0] * buckets
        for value in seconds:
            counts[bucket_of(value)] += 1
        return counts

    waits = [0.002] * 90 + [3.0] * 10  # p50 in the 5 ms bucket, p95 in the 5 s one
    runs = [0.2] * 50 + [0.7] * 50
    KindStats.objects.record({"mail.send": (100, histogram(*waits[:60]), histogram(*runs[:60]))})
    KindStats.objects.record({"mail.send": (0, histogram(*waits[60:]), histogram(*runs[60:]))})
    [latency] = KindStats.objects.latency(60)
    assert latency.runs == 100
    assert (latency.wait_p50_s, latency.wait_p95_s) == (0.005, 5)
    assert (latency.run_p50_s, latency.run_p95_s) == (0.25, 1)
    page = admin_client.get(PAGE).content.decode()
    assert 'data-kind="mail.send"' in page and "≤ 5 ms" in page and "≤ 250 ms" in page
    row = admin_client.get(DATA).json()["kinds"][0]
    assert row == {
        "kind": "mail.send", "runs": 100, "wait_p50_s": 0.005, "wait_p95_s": 5,
        "run_p50_s": 0.25, "run_p95_s": 1,
    }  # fmt: skip
    execute("UPDATE pgjobs_kind_stats SET minute = minute - interval '2 hours'")
    assert KindStats.objects.latency(60) == []
