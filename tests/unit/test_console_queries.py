"""What the console's pages ask the database (issue 19: each page within 100 ms with a
million live and a million dead rows): the queues' statuses read once per page, filter
choices that scan no job table, no query per row, and no big JSON column in a list.
These assert on the statements a page runs, never on time; the benchmark
(`python -m bench --only console`) measures the time."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from django.db import connection
from django.test import Client, override_settings
from django.test.utils import CaptureQueriesContext
from django.urls import reverse

from django_pgjobs.db import sql
from django_pgjobs.models import Job, QueueControl

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
