"""What the console's pages ask the database (issue 19: each page within 100 ms with a
million live and a million dead rows): the queues' statuses read once per page, filter
choices that scan no job table, no query per row, and no big JSON column in a list.
These assert on the statements a page runs, never on time; the benchmark
(`python -m bench --only console`) measures the time."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from django.contrib import admin
from django.contrib.admin.templatetags import admin_list
from django.db import connection
from django.template.loader import get_template
from django.test import Client, override_settings
from django.test.utils import CaptureQueriesContext
from django.urls import reverse
from django.utils import translation

from django_pgjobs.admin import rows
from django_pgjobs.admin.jobs import JobAdmin
from django_pgjobs.db import sql
from django_pgjobs.models import Job, QueueControl
from tests.helpers import execute

pytestmark = pytest.mark.django_db

JOBS = reverse("admin:django_pgjobs_job_changelist")
DEAD = reverse("admin:django_pgjobs_deadjob_changelist")
QUEUES = reverse("admin:django_pgjobs_queuecontrol_changelist")


def opening(statement: str) -> str:
    """A statement's first line (its `--` comment), which names it in a capture."""
    return statement.strip().splitlines()[0]


@pytest.fixture
def queues() -> Iterator[None]:
    """A queue with a pending job, one with only a running job, one with only a dead
    letter, one with only a control row, and one only in the settings."""
    with override_settings(PGJOBS={"QUEUES": {"configured": {}}}):
        Job.objects.enqueue("demo.mail", {"to": "a@example.com"}, queue="mail")
        Job.objects.enqueue("demo.report", queue="busy")
        Job.objects.claim_one("busy", "host:1:abc")
        gone = Job.objects.enqueue("demo.sync", queue="gone").id
        Job.objects.cancel_many([gone])
        QueueControl.objects.pause(["controlled"])
        yield


def page(client: Client, url: str, **params: Any) -> tuple[Any, list[str]]:
    """The response to a GET of `url`, and the statements it ran."""
    with CaptureQueriesContext(connection) as captured:
        response = client.get(url, params)
    assert response.status_code == 200
    return response, [query["sql"] for query in captured.captured_queries]


def runs(statements: list[str], statement: str) -> int:
    return sum(1 for ran in statements if ran.lstrip().startswith(opening(statement)))


def queue_choices(response: Any) -> list[str]:
    (spec,) = [
        spec
        for spec in response.context["cl"].filter_specs
        if getattr(spec, "parameter_name", "") == "queue"
    ]
    return [value for value, _ in spec.lookup_choices]


@pytest.mark.parametrize("url", [JOBS, DEAD, QUEUES])
def test_a_list_reads_the_queues_statuses_once_for_its_glance_and_its_filter(
    admin_client: Client, queues: None, url: str
) -> None:
    _, statements = page(admin_client, url)
    assert runs(statements, sql.QUEUE_OVERVIEW) == 1
    assert runs(statements, sql.LIVE_QUEUE_NAMES) == 1
    assert runs(statements, sql.DEAD_QUEUE_NAMES) == 1


def test_the_queue_filters_offer_the_queues_with_jobs_or_dead_letters_and_the_configured(
    admin_client: Client, queues: None
) -> None:
    jobs, _ = page(admin_client, JOBS)
    assert queue_choices(jobs) == ["busy", "configured", "mail"]  # pending, running, settings
    dead, _ = page(admin_client, DEAD)
    assert queue_choices(dead) == ["gone"]
    chosen, _ = page(admin_client, JOBS, queue="busy")
    assert [job.queue for job in chosen.context["cl"].result_list] == ["busy"]


@pytest.fixture
def jobs() -> None:
    """Jobs in every state (a running one with progress, a scheduled one, keys with
    characters to escape) and dead letters of several reasons, with big payloads."""
    big = {"blob": "x" * 10_000}
    Job.objects.enqueue("demo.mail", big, queue="mail", key='a<b&"c">')
    Job.objects.enqueue("demo.mail", big, queue="mail", delay=3600, key="   ")  # reads "-"
    Job.objects.enqueue("demo.report", big, queue="reports")
    running = Job.objects.claim_one("reports", "host:1:abc")
    execute(
        "UPDATE pgjobs_job SET progress = %s::jsonb WHERE id = %s",
        ['{"fraction": 0.4, "message": "frame <40>", "data": {}}', running.id],
    )
    Job.objects.enqueue("demo.report", big, queue="reports", result_retention=60)
    Job.objects.claim_one("reports", "host:1:abc").ack({"pages": 3})
    for reason in ("gave up", None):
        Job.objects.enqueue("demo.sync", big, queue="sync", max_attempts=1)
        handle = Job.objects.claim_one("sync", "host:2:def")
        if reason:
            handle.fail(reason)
        else:
            handle.retry("timeout\nsecond line")


def djangos_table(cl: Any) -> str:
    """The list's table as Django's own `result_list` tag renders it."""
    return str(get_template("admin/change_list_results.html").render(admin_list.result_list(cl)))


@pytest.mark.parametrize(
    ("url", "params"),
    [
        (JOBS, {}),
        (JOBS, {"queue": "mail", "o": "-2"}),
        (JOBS, {"q": "demo."}),
        (JOBS, {"state__exact": "running"}),
        (DEAD, {}),
        (DEAD, {"reason": "max_attempts", "o": "6"}),
    ],
)
def test_the_lists_rows_are_the_markup_of_djangos_own_rows(
    admin_client: Client, jobs: None, url: str, params: dict[str, str]
) -> None:
    response, _ = page(admin_client, url, **params)
    cl = response.context["cl"]
    assert rows.result_rows(cl) is not None  # written by rows, not handed to Django
    ours = str(rows.results_table(cl))
    assert ours == djangos_table(cl)
    assert ours in response.content.decode()
    assert "_changelist_filters=" in ours or not params  # the rows' links keep the filter


@pytest.mark.parametrize("language", ["en", "fr"])
@pytest.mark.parametrize("url", [JOBS, DEAD])
def test_a_rows_checkbox_is_the_markup_of_djangos_checkbox_widget(
    admin_client: Client, jobs: None, url: str, language: str
) -> None:
    response, _ = page(admin_client, url)
    cl = response.context["cl"]
    with translation.override(language):
        for obj in cl.result_list:
            ours = cl.model_admin.action_checkbox(obj)
            assert ours == admin.ModelAdmin.action_checkbox(cl.model_admin, obj)
    assert 'class="action-select"' in response.content.decode()


def test_a_column_neither_field_nor_method_gets_djangos_rows(
    admin_client: Client, jobs: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(JobAdmin, "list_display", ("id", "__str__", "kind"))
    response, _ = page(admin_client, JOBS)
    cl = response.context["cl"]
    assert rows.result_rows(cl) is None
    assert str(rows.results_table(cl)) == djangos_table(cl)
    assert "demo.mail#" in response.content.decode()


@pytest.mark.parametrize("url", [JOBS, DEAD])
def test_a_list_runs_no_query_per_row_and_reads_no_json_column_it_does_not_show(
    admin_client: Client, jobs: None, url: str
) -> None:
    _, few = page(admin_client, url)
    for n in range(30):
        Job.objects.enqueue("demo.more", {"blob": "y" * 10_000, "n": n}, queue="sync")
        if url == DEAD:
            Job.objects.claim_one("sync", "host:3:ghi").fail("said no")
    response, many = page(admin_client, url)
    assert len(response.context["cl"].result_list) > 30
    assert len(many) == len(few)  # the same statements for 4 rows as for 34
    table = "pgjobs_dead" if url == DEAD else "pgjobs_job"
    (listed,) = [s for s in many if s.startswith(f'SELECT "{table}".')]
    for column in ("payload", "result", "errors", "rerun_payload"):
        assert f'"{table}"."{column}"' not in listed
    assert f'"{table}"."kind"' in listed and f'"{table}"."progress"' in listed


def live_worker_running(worker_id: str, jobs_running: int) -> None:
    from django_pgjobs.models import Worker

    Worker.objects.heartbeat(
        worker_id,
        host="h",
        pid=1,
        queues=[worker_id],
        concurrency=10,
        version="t",
        heartbeat_s=60.0,
        running=jobs_running,
        succeeded=0,
        failed=0,
    )
    for _ in range(jobs_running):
        Job.objects.enqueue("demo.work", queue=worker_id)
        Job.objects.claim_one(worker_id, worker_id)


def test_the_workers_page_reads_the_running_jobs_once_whatever_the_live_workers(
    admin_client: Client,
) -> None:
    """Issue 26: the page read the running jobs once per live worker shown."""
    workers = reverse("admin:django_pgjobs_worker_changelist")
    live_worker_running("w-1", 2)
    _, one = page(admin_client, workers)
    for n in range(2, 6):
        live_worker_running(f"w-{n}", 7)
    response, five = page(admin_client, workers)
    assert len(five) == len(one)
    html = response.content.decode()
    assert "7 of 10: " in html and "and 2 more" in html and "2 of 10: " in html


def test_the_waiting_filter_walks_an_index_of_the_waiting_jobs() -> None:
    """Issue 26: `?state__exact=waiting` walked the whole table by id for a few rows."""
    queryset = Job.objects.filter(state="waiting").order_by("-id")
    with connection.cursor() as cursor:
        cursor.execute("SET LOCAL enable_seqscan = off")
        listed = queryset[:50].explain()
        capped = queryset.order_by()[:1001].explain()
    assert "pgjobs_job_waiting" in listed, listed
    assert "pgjobs_job_waiting" in capped, capped
