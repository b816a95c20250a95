"""The dashboard: per-queue and total counts, each a link; over the last hour, day or
week the jobs finished and their queue wait and run time, over time, per queue and per
kind; the workers; a JSON view behind the same permission that the page refreshes from."""

from __future__ import annotations

import json

import pytest
from django.contrib.auth.models import Permission, User
from django.test import Client
from django.urls import reverse
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from django_pgjobs.maintenance import Sweeper
from django_pgjobs.managers.stats import LATENCY_BUCKETS_S, bucket_of
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
    assert set(data["html"]) == {
        "warnings", "queues", "workers", "kinds", "throughput", "latency"
    }  # fmt: skip
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


def histogram(*seconds: float) -> list[int]:
    counts = [0] * len(LATENCY_BUCKETS_S)
    for value in seconds:
        counts[bucket_of(value)] += 1
    return counts


def test_per_kind_percentiles_come_from_the_workers_histograms(admin_client: Client) -> None:
    waits = [0.002] * 90 + [3.0] * 10  # p50 in the 5 ms bucket, p95 in the 5 s one
    runs = [0.2] * 50 + [0.7] * 50
    KindStats.objects.record(
        {("mail", "mail.send"): (100, histogram(*waits[:60]), histogram(*runs[:60]))}
    )
    KindStats.objects.record(
        {("mail", "mail.send"): (0, histogram(*waits[60:]), histogram(*runs[60:]))}
    )
    report = KindStats.objects.latency("hour")
    [(kind, latency)] = report.kinds.items()
    assert kind == "mail.send" and latency.runs == 100
    assert (latency.wait_p50_s, latency.wait_p95_s) == (0.005, 5)
    assert (latency.run_p50_s, latency.run_p95_s) == (0.25, 1)
    assert report.queues == {"mail": latency}
    # Over time: the minute's bucket holds every run, the others none.
    assert [point.runs for _, point in report.series if point.runs] == [100]
    assert len(report.series) == 30 and report.bucket_min == 2
    page = admin_client.get(PAGE).content.decode()
    assert 'data-kind="mail.send"' in page and "≤ 5 ms" in page and "≤ 250 ms" in page
    assert 'data-queue="mail"' in page
    row = admin_client.get(DATA).json()["kinds"][0]
    assert row == {
        "kind": "mail.send", "runs": 100, "wait_p50_s": 0.005, "wait_p95_s": 5,
        "run_p50_s": 0.25, "run_p95_s": 1,
    }  # fmt: skip
    execute("UPDATE pgjobs_kind_stats SET minute = minute - interval '2 hours'")
    assert KindStats.objects.latency("hour").kinds == {}
    # Two hours ago is in the day's span, read from the minutes until the sweeper sums it.
    assert KindStats.objects.latency("day").kinds["mail.send"].runs == 100


def test_latency_is_kept_per_queue_and_narrows_to_a_queue_or_a_kind(
    admin_client: Client,
) -> None:
    KindStats.objects.record(
        {
            ("mail", "mail.send"): (10, histogram(*[0.002] * 10), histogram(*[0.2] * 10)),
            ("bulk", "mail.send"): (4, histogram(*[20.0] * 4), histogram(*[0.2] * 4)),
            ("bulk", "report.build"): (2, histogram(*[20.0] * 2), histogram(*[40.0] * 2)),
        }
    )
    every = KindStats.objects.latency("hour")
    assert {name: value.runs for name, value in every.queues.items()} == {"bulk": 6, "mail": 10}
    assert {name: value.runs for name, value in every.kinds.items()} == {
        "mail.send": 14, "report.build": 2
    }  # fmt: skip
    assert every.queues["bulk"].wait_p50_s == 30 and every.queues["mail"].wait_p50_s == 0.005
    of_bulk = KindStats.objects.latency("hour", queue="bulk")
    assert {name: value.runs for name, value in of_bulk.kinds.items()} == {
        "mail.send": 4, "report.build": 2
    }  # fmt: skip
    of_send = KindStats.objects.latency("hour", kind="mail.send")
    assert {name: value.runs for name, value in of_send.queues.items()} == {"bulk": 4, "mail": 10}
    both = KindStats.objects.latency("week", queue="bulk", kind="report.build")
    assert both.kinds["report.build"].run_p95_s == 60 and len(both.series) == 28
    page = admin_client.get(PAGE, {"span": "day", "queue": "bulk"}).content.decode()
    assert 'data-queue="bulk"' in page and 'data-queue="mail"' not in page
    assert "Queue wait and run time, last 24 hours, per hour" in page
    assert '<option value="bulk" selected>queue bulk</option>' in page
    data = admin_client.get(DATA, {"span": "week", "kind": "mail.send"}).json()
    assert data["span"] == "week" and data["scope"] == {"queue": None, "kind": "mail.send"}
    assert [row["queue"] for row in data["latency"]["queues"]] == ["bulk", "mail"]
    assert sum(point["runs"] for point in data["latency"]["series"]) == 14


def test_the_throughput_chart_follows_the_span_and_the_queue(admin_client: Client) -> None:
    JobStats.objects.record({"a": (2, 0, 0, 0), "b": (3, 1, 0, 1)})
    assert [p.succeeded for p in JobStats.objects.throughput(5, queue="b") if p.succeeded] == [3]
    [hour] = [p for p in JobStats.objects.throughput_hours(168) if p.succeeded]
    assert (hour.succeeded, hour.retried, hour.cancelled) == (5, 1, 1)
    assert len(JobStats.objects.throughput_hours(168)) == 168
    for span, label in (
        ("hour", "jobs per minute, last 60 min"),
        ("day", "jobs per 15 min, last 24 h"),
        ("week", "jobs per hour, last 7 days"),
    ):
        page = admin_client.get(PAGE, {"span": span, "queue": "a"}).content.decode()
        assert f'aria-label="{label}"' in page, span
        assert "done: 2" in page, span  # of queue a only


def test_the_sweeper_sums_each_ended_hour_once_and_the_spans_count_each_run_once() -> None:
    JobStats.objects.record({"a": (2, 1, 0, 0)})
    KindStats.objects.record({("a", "k"): (3, histogram(0.002, 0.002, 9), histogram(1, 1, 1))})
    # Move them to three hours ago, in two minutes of the same hour, and add this minute's.
    execute("UPDATE pgjobs_stats SET minute = date_trunc('hour', now()) - interval '3 hours'")
    execute("UPDATE pgjobs_kind_stats SET minute = date_trunc('hour', now()) - interval '3 hours'")
    execute(
        "INSERT INTO pgjobs_kind_stats (minute, queue, kind, runs, wait_hist, run_hist) "
        "SELECT minute + interval '7 minutes', queue, kind, runs, wait_hist, run_hist "
        "FROM pgjobs_kind_stats"
    )
    JobStats.objects.record({"a": (5, 0, 0, 0)})
    KindStats.objects.record({("a", "k"): (1, histogram(0.002), histogram(1))})
    before = KindStats.objects.latency("day").kinds["k"]
    assert before.runs == 7
    Sweeper().run_once()  # the sweep sums the hour: one row of one queue, in each table
    assert execute("SELECT count(*) FROM pgjobs_stats_hour") == [(1,)]
    assert JobStats.objects.sum_hours() == 0 and KindStats.objects.sum_hours() == 0
    summed = {
        (queue, kind): (runs, wait if isinstance(wait, list) else json.loads(wait))
        for queue, kind, runs, wait in execute(
            "SELECT queue, kind, runs, wait_hist FROM pgjobs_kind_stats_hour"
        )
    }
    # The pair, and the sums the workers keep beside it: per queue, per kind, over all.
    assert set(summed) == {("a", "k"), ("a", "*"), ("*", "k"), ("*", "*")}
    assert all(runs == 6 and sum(wait) == 6 for runs, wait in summed.values())
    for span in ("day", "week"):
        after = KindStats.objects.latency(span).kinds["k"]
        assert after == before, span
    assert sum(p.succeeded for p in JobStats.objects.throughput_hours(168)) == 7
    assert sum(p.retried for p in JobStats.objects.throughput_hours(168)) == 1
    # Hours older than the week and a day go with the sweeper's prune.
    execute("UPDATE pgjobs_kind_stats_hour SET hour = hour - interval '9 days'")
    execute("UPDATE pgjobs_stats_hour SET hour = hour - interval '9 days'")
    assert JobStats.objects.prune(100) >= 1 and KindStats.objects.prune(100) >= 1
    assert execute("SELECT count(*) FROM pgjobs_kind_stats_hour") == [(0,)]


@pytest.mark.parametrize(
    "query",
    [
        {"span": "year"},
        {"span": "hour", "order": "1"},
        {"queue": "a\x00b"},
        {"kind": "k" * 5000},
        {"queue": "*"},  # the workers' sums over every queue: not a queue
    ],
)
def test_the_dashboard_refuses_what_it_does_not_take(admin_client: Client, query: dict) -> None:
    for url in (PAGE, DATA):
        response = admin_client.get(url, query)
        assert response.status_code == 400, (url, query)
        assert response.content.decode().strip(), "a 400 says what the dashboard takes"


#: What jsonb can hold: any text but NUL and lone surrogates (PostgreSQL refuses both).
JSONB_TEXT = st.characters(exclude_categories=("Cs",), exclude_characters="\x00")

json_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers()
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(JSONB_TEXT, max_size=5),
    lambda inner: (
        st.lists(inner, max_size=20) | st.dictionaries(st.text(JSONB_TEXT, max_size=3), inner)
    ),
    max_leaves=30,
)


@settings(
    max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(wait=json_values, run=json_values, runs=st.integers(-(2**31), 2**31 - 1))
def test_a_histogram_edited_by_hand_is_read_as_no_run_and_summed_without_error(
    admin_client: Client, wait: object, run: object, runs: int
) -> None:
    """Whatever a row of the per-minute histograms holds (a list of strings, a number, an
    object, counts past any bound), the dashboard answers, its figures count only counts,
    and the sweeper sums the hour without failing."""
    execute("DELETE FROM pgjobs_kind_stats; DELETE FROM pgjobs_kind_stats_hour")
    KindStats.objects.record({("a", "k"): (1, histogram(0.002), histogram(1))})
    for queue, kind in (("a", "k"), ("a", "*"), ("*", "k"), ("*", "*")):  # each sum read
        execute(
            "INSERT INTO pgjobs_kind_stats (minute, queue, kind, runs, wait_hist, run_hist) "
            "VALUES (date_trunc('minute', now()) - interval '2 minutes', %s, %s, %s, %s, %s)",
            [queue, kind, runs, json.dumps(wait), json.dumps(run)],
        )
    for scope in ({}, {"queue": "a"}, {"kind": "k"}, {"queue": "a", "kind": "k"}):
        report = KindStats.objects.latency("hour", **scope)
        assert report.kinds["k"].runs >= 1 and report.queues["a"].runs >= 1, scope
    assert admin_client.get(PAGE).status_code == 200
    assert admin_client.get(DATA).status_code == 200
    execute("UPDATE pgjobs_kind_stats SET minute = minute - interval '3 hours'")
    KindStats.objects.sum_hours()
    assert KindStats.objects.latency("day").kinds["k"].runs >= 1


def test_the_summed_hours_a_process_keeps_follow_a_new_or_deleted_hour() -> None:
    """The day's and the week's summed hours are added once per process and kept while
    they are the span's; a summed hour written or deleted since is read again."""
    KindStats.objects.record({("a", "k"): (2, histogram(0.002, 0.002), histogram(1, 1))})
    execute("UPDATE pgjobs_kind_stats SET minute = date_trunc('hour', now()) - interval '2 hours'")
    Sweeper().run_once()
    first = KindStats.objects.latency("week")
    assert first.kinds["k"].runs == 2
    assert KindStats.objects.latency("week") == first  # kept: the same again
    execute(
        "INSERT INTO pgjobs_kind_stats_hour (hour, queue, kind, runs, wait_hist, run_hist) "
        "SELECT hour - interval '1 day', queue, kind, runs, wait_hist, run_hist "
        "FROM pgjobs_kind_stats_hour"
    )
    assert KindStats.objects.latency("week").kinds["k"].runs == 4
    execute("DELETE FROM pgjobs_kind_stats_hour WHERE hour < now() - interval '1 day'")
    assert KindStats.objects.latency("week").kinds["k"].runs == 2
    assert KindStats.objects.latency("day").kinds["k"].runs == 2


def test_rows_edited_by_hand_neither_stop_the_sweeper_nor_freeze_the_hours(
    admin_client: Client,
) -> None:
    """Counts past an int's range summed into an hour, and an hour dated in the future:
    the sweeper still sums every ended hour, and the charts answer."""
    top = 2**31 - 1
    for minutes in (0, 7):
        execute(
            "INSERT INTO pgjobs_stats (minute, queue, succeeded, retried, dead, cancelled) "
            "VALUES (date_trunc('hour', now()) - interval '3 hours' + %s * interval '1 minute',"
            " 'a', %s, 0, 0, 0)",
            [minutes, top],
        )
    execute(
        "INSERT INTO pgjobs_kind_stats_hour (hour, queue, kind, runs, wait_hist, run_hist) "
        "VALUES (date_trunc('hour', now()) + interval '5 hours', '*', '*', 1, '[1]', '[1]')"
    )
    KindStats.objects.record({("a", "k"): (1, histogram(0.002), histogram(1))})
    execute("UPDATE pgjobs_kind_stats SET minute = date_trunc('hour', now()) - interval '2 hours'")
    result = Sweeper().run_once()
    assert result.complete
    assert execute("SELECT succeeded FROM pgjobs_stats_hour") == [(top,)]  # clamped
    assert KindStats.objects.latency("day").kinds["k"].runs == 1  # summed despite the row
    pairs = execute("SELECT queue FROM pgjobs_kind_stats_hour WHERE kind = 'k' ORDER BY 1")
    assert pairs == [("*",), ("a",)]  # the pair and its sum over the queues
    assert sum(p.succeeded for p in JobStats.objects.throughput_hours(168)) == top
    for span in ("hour", "day", "week"):
        assert admin_client.get(PAGE, {"span": span}).status_code == 200, span
