"""The console with queues in databases of their own (PGJOBS["QUEUE_DATABASES"], issue
29, item 14): each page shows one database, chosen by `?db=` (a selector on the lists and
the dashboard), its links carry it on, and every action acts on the job of that database,
not on the job of the same id in another. Three real databases, in a subprocess with the
settings of tests/settings_queue_databases.py."""

from __future__ import annotations

import json

import pytest

from tests.processes.test_queue_databases import three_databases
from tests.spawn import manage_py

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]

SCRIPT = r"""
import json, re
from django.test.utils import setup_test_environment
setup_test_environment()
from django.contrib.admin.models import LogEntry
from django.contrib.auth.models import User
from django.test import Client
from django_pgjobs.models import DeadJob, Job, Worker

client = Client()
client.force_login(User.objects.create_superuser("root", password="pw-pw-pw-pw"))
main = Job.objects.enqueue("tests.record", {"label": "main"})
other = Job.objects.enqueue("tests.record", {"label": "other"}, queue="ingestion")
seen = {"same id": main.id == other.id}

def page(url, **data):
    response = client.get(url, data)
    return response.status_code, response.content.decode()

status, jobs = page("/admin/django_pgjobs/job/")
seen["main list"] = [status, "ingestion" in jobs, 'data-queue="default"' in jobs]
status, jobs_a = page("/admin/django_pgjobs/job/", db="jobs_a")
seen["jobs_a list"] = [status, 'data-queue="ingestion"' in jobs_a, 'data-queue="default"' in jobs_a]
seen["selector"] = [
    '<strong aria-current="true">jobs_a</strong>' in jobs_a,
    'href="/admin/django_pgjobs/job/?db=jobs_b"' in jobs_a,
    '_changelist_filters=db%3Djobs_a' in jobs_a,
    "/admin/django_pgjobs/dashboard/?db=jobs_a" in jobs_a,
]
status, one = page(
    f"/admin/django_pgjobs/job/{other.id}/change/", _changelist_filters="db=jobs_a"
)
seen["object page"] = [status, "In database <strong>jobs_a</strong>" in one, "ingestion" in one]
cancel = f"/admin/django_pgjobs/job/{other.id}/act/cancel/"
seen["cancel link"] = f'action="{cancel}?db=jobs_a"' in one
response = client.post(cancel + "?db=jobs_a")
seen["cancelled"] = [
    response["Location"],
    DeadJob.objects.using("jobs_a").filter(pk=other.id).exists(),
    Job.objects.using("default").filter(pk=main.id, state="pending").exists(),
]
seen["log"] = [e.change_message for e in LogEntry.objects.order_by("id")]
status, letter = page(f"/admin/django_pgjobs/deadjob/{other.id}/change/", db="jobs_a")
seen["timeline of jobs_a"] = [
    "by root" in letter,  # the log entry of the cancel, in the letter's timeline
    'href="/admin/django_pgjobs/deadjob/?db=jobs_a">the list of this database' in letter,
]
status, main_page = page(f"/admin/django_pgjobs/job/{main.id}/change/")
seen["timeline of default"] = [status, "by root" not in main_page]
seen["crumbs"] = re.findall(r'href="(/admin/django_pgjobs/deadjob/[^"]*)"', letter)
seen["form keeps db"] = 'action="?_changelist_filters=db%3Djobs_a"' in letter
response = client.post(
    "/admin/django_pgjobs/deadjob/?db=jobs_a",
    {"action": "requeue", "_selected_action": [str(other.id)]},
)
seen["requeued"] = [
    response.status_code,
    Job.objects.using("jobs_a").filter(pk=other.id, state="pending").exists(),
    DeadJob.objects.using("default").count(),
]
data = client.get("/admin/django_pgjobs/dashboard/data/", {"db": "jobs_a"}).json()
seen["dashboard"] = [data["database"], *(q["queue"] for q in data["queues"])]
status, dashboard = page("/admin/django_pgjobs/dashboard/", db="jobs_b")
data_url = 'data-url="/admin/django_pgjobs/dashboard/data/?db=jobs_b&amp;span=week"'
status, dashboard = page("/admin/django_pgjobs/dashboard/", db="jobs_b", span="week")
seen["dashboard page"] = [
    status,
    data_url in dashboard,
    '<input type="hidden" name="db" value="jobs_b">' in dashboard,
    client.get("/admin/django_pgjobs/dashboard/data/?db=jobs_b&span=week").status_code,
]
Worker.objects.using("jobs_a").create(
    id="vm:1:abc", host="vm", pid=1, queues=["ingestion"], concurrency=1, version="t",
    heartbeat_s=5,
)
status, workers = page("/admin/django_pgjobs/worker/", db="jobs_a")
link = re.search(r'href="(/admin/django_pgjobs/worker/vm[^"]*/change/[^"]*)"', workers)
status, worker = page(link[1].replace("&amp;", "&")) if link else (None, "")
seen["worker page"] = [bool(link), status, "Its queues" in worker, "ingestion" in worker]
seen["refused"] = [
    client.get("/admin/django_pgjobs/job/", {"db": "nope"}).status_code,
    client.get("/admin/django_pgjobs/dashboard/data/", {"db": "nope"}).status_code,
    client.get(f"/admin/django_pgjobs/job/{other.id}/change/", {"db": "x" * 300}).status_code,
]
print("SEEN " + json.dumps(seen))
"""


def test_the_console_shows_and_acts_on_the_database_its_url_names() -> None:
    with three_databases() as env:
        for alias in ("default", "jobs_a", "jobs_b"):
            manage_py(env, "migrate", "--run-syncdb", "--database", alias, "-v0")
        output = manage_py(env, "shell", "-c", SCRIPT)
        seen = json.loads(output.split("SEEN ", 1)[1])
    assert seen["same id"], "the test needs the same id in two databases"
    assert seen["main list"] == [200, False, True]
    assert seen["jobs_a list"] == [200, True, False]
    assert seen["selector"] == [True, True, True, True]
    assert seen["object page"] == [200, True, True]
    assert seen["cancel link"]
    location, dead_in_jobs_a, main_untouched = seen["cancelled"]
    assert location.endswith("?db=jobs_a") and dead_in_jobs_a and main_untouched
    assert seen["log"][0].endswith("(database jobs_a)")
    assert seen["timeline of jobs_a"] == [True, True], seen["crumbs"]
    assert seen["timeline of default"] == [200, True]
    assert seen[
        "form keeps db"
    ]  # the list's preserved filters carry the database  # the same id's entries are jobs_a's
    assert seen["requeued"] == [302, True, 0]
    assert seen["dashboard"] == ["jobs_a", "ingestion"]
    assert seen["dashboard page"] == [200, True, True, 200]
    assert seen["worker page"] == [True, 200, True, True]
    assert seen["refused"] == [400, 400, 400]
