"""The admin: lists, filters, search and detail pages in every state; actions with and
without permission; counts that never scan a big table."""

from __future__ import annotations

import re
from typing import Any

import pytest
from django.contrib.admin.models import LogEntry
from django.contrib.auth.models import Permission, User
from django.template import Context as TemplateContext
from django.template import Template
from django.test import Client, override_settings
from django.urls import reverse

from django_pgjobs.managers import reads as job_reads
from django_pgjobs.models import DeadJob, Job, JobStats, QueueControl, Schedule
from django_pgjobs.scheduler import Scheduler
from tests.helpers import count, execute, row, seconds_from_now

pytestmark = pytest.mark.django_db

JOBS = reverse("admin:django_pgjobs_job_changelist")
DEAD = reverse("admin:django_pgjobs_deadjob_changelist")


@pytest.fixture
def jobs() -> dict[str, int]:
    """One job in every state, and dead letters with two reasons."""
    ids = {
        "runnable": Job.objects.enqueue("demo.mail", {"to": "a@example.com"}, queue="mail").id,
        "scheduled": Job.objects.enqueue("demo.mail", delay=3600, queue="mail", key="k1").id,
    }
    Job.objects.enqueue("demo.report", {"n": 1}, queue="reports")
    running = Job.objects.claim_one("reports", "host:1:abc")
    ids["running"] = running.id
    Job.objects.enqueue("demo.report", {"n": 2}, queue="reports", result_retention=60)
    done = Job.objects.claim_one("reports", "host:1:abc")
    done.ack({"pages": 3})
    ids["done"] = done.id
    Job.objects.enqueue("demo.sync", {"account": 7}, queue="sync", key="account:7")
    failed = Job.objects.claim_one("sync", "host:2:def")
    try:
        raise ValueError("remote said no\nsecond line")
    except ValueError as error:
        failed.retry(error, delay=0)
    failed = Job.objects.claim_one("sync", "host:2:def")
    failed.fail("gave up")
    ids["dead"] = failed.id
    Job.objects.enqueue("demo.sync", {"account": 8}, queue="sync", max_attempts=1)
    spent = Job.objects.claim_one("sync", "host:2:def")
    spent.retry("timeout")
    ids["spent"] = spent.id
    JobStats.objects.record({"mail": (5, 1, 0, 0), "sync": (0, 2, 2, 1)})
    return ids


def test_job_list_renders_every_state_and_the_glance(admin_client: Client, jobs: dict) -> None:
    response = admin_client.get(JOBS)
    assert response.status_code == 200
    page = response.content.decode()
    for state in ("pending", "running", "done"):
        assert f">{state}<" in page or state in page
    assert 'data-queue="mail"' in page and 'data-queue="sync"' in page
    glance = {q["queue"]: q["status"] for q in response.context["glance"]}
    assert (glance["mail"].runnable.value, glance["mail"].scheduled.value) == (1, 1)
    assert glance["reports"].running.value == 1
    assert glance["sync"].dead.value == 2
    assert 'aria-label="jobs per minute, last 60 min"' in page
    for legend in ("done: 5", "retried: 3", "dead-lettered: 2", "cancelled: 1"):
        assert legend in page  # each ending its own series: retries are not dead letters
    assert "in 60 min" in page or "in 59 min" in page  # the scheduled job's run_after


def test_dead_list_renders_reasons_and_first_error_line(admin_client: Client, jobs: dict) -> None:
    page = admin_client.get(DEAD).content.decode()
    assert "gave up" in page and "max attempts exceeded" in page
    assert "timeout" in page
    assert "second line" not in page


@pytest.mark.parametrize(
    ("query", "expected", "absent"),
    [
        ("state__exact=running", ["running"], ["runnable", "done"]),
        ("readiness=runnable", ["runnable"], ["scheduled", "running"]),
        ("readiness=scheduled", ["scheduled"], ["runnable"]),
        ("queue=mail", ["runnable", "scheduled"], ["running", "done"]),
    ],
)
def test_job_filters(
    admin_client: Client, jobs: dict, query: str, expected: list[str], absent: list[str]
) -> None:
    response = admin_client.get(f"{JOBS}?{query}")
    assert response.status_code == 200
    shown = {obj.id for obj in response.context["cl"].result_list}
    assert {jobs[name] for name in expected} <= shown
    assert not {jobs[name] for name in absent} & shown


def test_kind_and_reason_filters(admin_client: Client, jobs: dict) -> None:
    from django_pgjobs import registry

    registry.register(registry.JobDefinition(kind="demo.mail", func=_noop))
    try:
        response = admin_client.get(f"{JOBS}?kind=demo.mail")
        assert {o.id for o in response.context["cl"].result_list} == {
            jobs["runnable"],
            jobs["scheduled"],
        }
    finally:
        registry.unregister("demo.mail")
    # "gave up" is a fail with a message: failed, as a bare fail is (issue 26, item 19).
    response = admin_client.get(f"{DEAD}?reason=failed")
    assert [o.id for o in response.context["cl"].result_list] == [jobs["dead"]]
    response = admin_client.get(f"{DEAD}?reason=max_attempts")
    assert [o.id for o in response.context["cl"].result_list] == [jobs["spent"]]
    response = admin_client.get(f"{DEAD}?reason=other")  # letters without a category
    assert list(response.context["cl"].result_list) == []
    # An exact reason is no filter the list offers: a scan of the dead letters (issue 26).
    assert admin_client.get(f"{DEAD}?reason__exact=gave+up").status_code == 400
    response = admin_client.get(f"{DEAD}?queue=sync")
    assert len(response.context["cl"].result_list) == 2


def _noop() -> None:
    return None


@pytest.mark.parametrize("term", ["id", "demo.report", "k1"])
def test_search_by_id_kind_or_key(admin_client: Client, jobs: dict, term: str) -> None:
    query = str(jobs["running"]) if term == "id" else term
    response = admin_client.get(JOBS, {"q": query})
    shown = {obj.id for obj in response.context["cl"].result_list}
    wanted = {
        "id": {jobs["running"]},
        "demo.report": {jobs["running"], jobs["done"]},
        "k1": {jobs["scheduled"]},
    }[term]
    assert shown == wanted


@pytest.mark.parametrize("name", ["runnable", "scheduled", "running", "done"])
def test_job_detail_pages_render(admin_client: Client, jobs: dict, name: str) -> None:
    url = reverse("admin:django_pgjobs_job_change", args=[jobs[name]])
    response = admin_client.get(url)
    assert response.status_code == 200
    page = response.content.decode()
    assert "<pre>" in page
    if name == "done":
        assert "&quot;pages&quot;: 3" in page


def test_dead_detail_shows_payload_and_error_history(admin_client: Client, jobs: dict) -> None:
    url = reverse("admin:django_pgjobs_deadjob_change", args=[jobs["dead"]])
    page = admin_client.get(url).content.decode()
    assert "&quot;account&quot;: 7" in page
    assert "ValueError: remote said no" in page and "gave up" in page
    assert "Traceback" in page


def test_jobs_cannot_be_added(admin_client: Client) -> None:
    assert admin_client.get(reverse("admin:django_pgjobs_job_add")).status_code == 403


def test_run_now_action(admin_client: Client, jobs: dict) -> None:
    response = admin_client.post(
        JOBS,
        {"action": "run_now", "_selected_action": [jobs["scheduled"], jobs["running"]]},
        follow=True,
    )
    assert "1 job set to run now." in response.content.decode()
    assert seconds_from_now("run_after", jobs["scheduled"]) <= 0


def test_cancel_asks_first_then_dead_letters_as_cancelled(admin_client: Client, jobs: dict) -> None:
    selected = {"action": "cancel", "_selected_action": [jobs["runnable"], jobs["running"]]}
    confirm = admin_client.post(JOBS, selected)
    assert confirm.status_code == 200
    assert "Cancel 2 jobs?" in confirm.content.decode()
    assert count() == 4  # nothing happened yet
    response = admin_client.post(JOBS, {**selected, "confirmed": "yes"}, follow=True)
    assert "2 jobs cancelled." in response.content.decode()
    assert row(jobs["runnable"], "id") is None
    assert DeadJob.objects.get(pk=jobs["running"]).reason == "cancelled by admin in the console"
    # One entry in the admin's log for the bulk action: who, how many, which.
    (entry,) = LogEntry.objects.all()
    low, high = sorted([jobs["runnable"], jobs["running"]])
    assert entry.user.username == "admin" and entry.object_id is None
    assert entry.object_repr == "2 jobs"
    assert entry.change_message == f"Cancelled 2 jobs: #{low}, #{high}."


def test_a_bulk_actions_log_entry_says_which_were_chosen_when_fewer_changed(
    admin_client: Client, jobs: dict
) -> None:
    """A done job chosen beside a pending one is skipped: the entry counts what changed
    and calls the listed ids chosen, not cancelled."""
    chosen = sorted([jobs["runnable"], jobs["done"]])
    selected = {"action": "cancel", "_selected_action": chosen, "confirmed": "yes"}
    response = admin_client.post(JOBS, selected, follow=True)
    assert "1 job cancelled, 1 skipped (already finished)." in response.content.decode()
    (entry,) = LogEntry.objects.all()
    assert entry.change_message == f"Cancelled 1 job of 2 chosen: #{chosen[0]}, #{chosen[1]}."
    admin_client.post(JOBS, {**selected, "_selected_action": [jobs["done"]]})
    assert LogEntry.objects.count() == 1  # nothing changed, nothing logged


def test_requeue_reports_requeued_and_merged(admin_client: Client, jobs: dict) -> None:
    Job.objects.enqueue("demo.sync", {"account": 7, "fresh": True}, queue="sync", key="account:7")
    response = admin_client.post(
        DEAD,
        {"action": "requeue", "_selected_action": [jobs["dead"], jobs["spent"]]},
        follow=True,
    )
    assert "1 job requeued, 1 merged into a live job." in response.content.decode()
    assert count("pgjobs_dead") == 0
    assert row(jobs["spent"], "state", "attempts") == ("pending", 0)


def test_delete_dead_letters_with_confirmation(admin_client: Client, jobs: dict) -> None:
    selected = {"action": "delete_selected", "_selected_action": [jobs["dead"]]}
    assert admin_client.post(DEAD, selected).status_code == 200
    admin_client.post(DEAD, {**selected, "confirmed": "yes"})
    assert count("pgjobs_dead") == 1


@pytest.fixture
def viewer(client: Client) -> Client:
    """Staff who may view jobs and dead letters, and nothing more."""
    user = User.objects.create_user("viewer", password="pw", is_staff=True)
    user.user_permissions.set(Permission.objects.filter(codename__in=["view_job", "view_deadjob"]))
    client.force_login(user)
    return client


def test_view_only_staff_see_everything_and_can_run_no_action(viewer: Client, jobs: dict) -> None:
    for url in (
        JOBS,
        DEAD,
        reverse("admin:django_pgjobs_job_change", args=[jobs["running"]]),
        reverse("admin:django_pgjobs_deadjob_change", args=[jobs["dead"]]),
    ):
        assert viewer.get(url).status_code == 200
    page = viewer.get(JOBS)
    assert page.context["action_form"] is None  # no action is offered
    assert 'name="action"' not in page.content.decode()
    attempts: list[tuple[str, dict[str, Any]]] = [
        (JOBS, {"action": "run_now", "_selected_action": [jobs["scheduled"]]}),
        (JOBS, {"action": "cancel", "_selected_action": [jobs["runnable"]], "confirmed": "yes"}),
        (DEAD, {"action": "requeue", "_selected_action": [jobs["dead"]]}),
        (DEAD, {"action": "delete_selected", "_selected_action": [jobs["dead"]], "post": "yes"}),
    ]
    for url, data in attempts:
        viewer.post(url, data)
    assert count() == 4 and count("pgjobs_dead") == 2
    assert seconds_from_now("run_after", jobs["scheduled"]) > 3000


def test_a_forged_post_without_csrf_changes_nothing(jobs: dict) -> None:
    forger = Client(enforce_csrf_checks=True)
    forger.force_login(User.objects.create_superuser("boss", password="pw"))
    response = forger.post(DEAD, {"action": "requeue", "_selected_action": [jobs["dead"]]})
    assert response.status_code == 403
    assert count("pgjobs_dead") == 2


def test_counts_past_the_cap_are_estimates_and_say_so(
    admin_client: Client, jobs: dict, monkeypatch: pytest.MonkeyPatch
) -> None:
    Job.objects.enqueue_many([{"kind": "demo.bulk", "queue": "bulk"}] * 30)
    execute("ANALYZE pgjobs_job")
    monkeypatch.setattr(job_reads, "COUNT_CAP", 5)
    response = admin_client.get(JOBS)
    row = next(q for q in response.context["glance"] if q["queue"] == "bulk")
    bulk = row["status"]
    assert bulk.runnable.estimated and row["runnable"].startswith("≈")
    assert bulk.running.value == 0 and not bulk.running.estimated
    assert "≈" in response.content.decode()
    assert Job.objects.capped_count(Job.objects.all()) >= 5


def test_an_overview_reads_as_numbers_in_a_template(
    jobs: dict, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Issue 29: `{{ q.runnable }}` printed "Count(value=0, estimated=False)" (the example
    project's home page did)."""
    Job.objects.enqueue_many([{"kind": "demo.bulk", "queue": "bulk"}] * 300)
    template = Template(
        "{% for q in overview %}{{ q.queue }}={{ q.runnable }}/{{ q.running }}"
        "{% if q.dead %}!{% endif %};{% endfor %}"
    )
    rendered = template.render(TemplateContext({"overview": Job.objects.overview()}))
    assert "Count(" not in rendered
    assert "bulk=300/0;" in rendered
    execute("ANALYZE pgjobs_job")
    monkeypatch.setattr(job_reads, "COUNT_CAP", 5)
    (bulk,) = [q for q in Job.objects.overview() if q.queue == "bulk"]
    assert str(bulk.runnable).startswith("≈ ") and int(bulk.runnable) == bulk.runnable.value
    assert f"{bulk.running}" == "0" and not bulk.running and bulk.runnable


QUEUES = reverse("admin:django_pgjobs_queuecontrol_changelist")
SCHEDULES = reverse("admin:django_pgjobs_schedule_changelist")


def test_queue_list_shows_every_queue_with_jobs_and_its_running_of_limit(
    admin_client: Client, jobs: dict
) -> None:
    QueueControl.objects.set_limit("reports", 4)
    response = admin_client.get(QUEUES)
    assert response.status_code == 200
    listed = {control.name for control in response.context["cl"].result_list}
    assert {"mail", "reports", "sync"} <= listed
    page = response.content.decode()
    assert "1 of 4" in page  # reports: one running job of at most four


def test_pause_and_resume_actions(admin_client: Client, jobs: dict) -> None:
    admin_client.get(QUEUES)  # makes the rows of the queues with jobs
    response = admin_client.post(
        QUEUES, {"action": "pause", "_selected_action": ["mail", "sync"]}, follow=True
    )
    assert "Paused: mail, sync." in response.content.decode()
    assert Job.objects.claim_batch(["mail"], 5, "w") == []
    response = admin_client.post(
        QUEUES, {"action": "resume", "_selected_action": ["mail"]}, follow=True
    )
    assert "Resumed: mail." in response.content.decode()
    assert QueueControl.objects.get(name="sync").paused


def test_a_limit_set_on_the_change_page_is_enforced(admin_client: Client, jobs: dict) -> None:
    admin_client.get(QUEUES)
    url = reverse("admin:django_pgjobs_queuecontrol_change", args=["mail"])
    response = admin_client.post(url, {"paused": "", "max_running": "1"})
    assert response.status_code == 302
    assert QueueControl.objects.get(name="mail").max_running == 1
    Job.objects.enqueue("demo.mail", queue="mail")
    assert len(Job.objects.claim_batch(["mail"], 5, "w")) == 1


def test_a_limit_from_settings_is_read_only_in_the_admin(admin_client: Client) -> None:
    with override_settings(PGJOBS={"QUEUES": {"capped": {"MAX_RUNNING": 2}}}):
        QueueControl.objects.sync_settings()
        url = reverse("admin:django_pgjobs_queuecontrol_change", args=["capped"])
        page = admin_client.get(url)
        assert 'name="max_running"' not in page.content.decode()
        admin_client.post(url, {"paused": "", "max_running": "9"})
    assert QueueControl.objects.get(name="capped").max_running == 2


@pytest.fixture
def schedules() -> None:
    with override_settings(
        PGJOBS={
            "SCHEDULES": {
                "hourly": {"kind": "demo.report", "cron": "@hourly"},
                "nightly": {"kind": "demo.report", "cron": "0 3 * * *", "payload": {"full": 1}},
            }
        }
    ):
        Scheduler().sync()


def test_schedule_list_shows_next_and_last_run_and_last_job(
    admin_client: Client, schedules: None
) -> None:
    [job_id] = Schedule.objects.run_now(["nightly"])
    response = admin_client.get(SCHEDULES)
    assert response.status_code == 200
    page = response.content.decode()
    assert f"#{job_id} (pending)" in page
    assert "in " in page  # the next run, relative to now
    assert admin_client.get(reverse("admin:django_pgjobs_schedule_add")).status_code == 403
    detail = reverse("admin:django_pgjobs_schedule_change", args=["nightly"])
    assert admin_client.get(detail).status_code == 200


def test_schedule_actions_report_what_they_did(admin_client: Client, schedules: None) -> None:
    def act(action: str, *names: str) -> str:
        data = {"action": action, "_selected_action": list(names)}
        return admin_client.post(SCHEDULES, data, follow=True).content.decode()

    assert "2 disabled." in act("disable", "hourly", "nightly")
    assert not Schedule.objects.filter(enabled=True).exists()
    assert "1 enabled." in act("enable", "hourly")
    assert "1 job enqueued: #" in act("run_now", "nightly")
    assert count(where="kind = 'demo.report'") == 1
    assert Schedule.objects.get(name="nightly").runs == 1


def test_view_only_staff_cannot_pause_or_fire(client: Client, jobs: dict, schedules: None) -> None:
    user = User.objects.create_user("looker", password="pw", is_staff=True)
    user.user_permissions.set(
        Permission.objects.filter(codename__in=["view_queuecontrol", "view_schedule"])
    )
    client.force_login(user)
    assert client.get(QUEUES).status_code == 200
    assert client.get(SCHEDULES).status_code == 200
    client.post(QUEUES, {"action": "pause", "_selected_action": ["mail"]})
    client.post(SCHEDULES, {"action": "run_now", "_selected_action": ["nightly"]})
    client.post(SCHEDULES, {"action": "disable", "_selected_action": ["nightly"]})
    assert not QueueControl.objects.filter(paused=True).exists()
    assert count(where="kind = 'demo.report' AND queue = 'default'") == 0
    assert Schedule.objects.get(name="nightly").enabled


def test_the_batch_list_shows_progress_and_callbacks_and_refuses_bad_params(
    admin_client: Client,
) -> None:
    from django_pgjobs.batches import Callback, batch

    with batch(
        on_success=Callback("tests.plain", value=1), on_failure=Callback("tests.plain", value=2)
    ) as b:
        for n in range(3):
            b.add("tests.plain", value=n)
    (first, *_) = Job.objects.claim_batch("default", 1, "w")
    first.ack()
    page = admin_client.get("/admin/django_pgjobs/batch/")
    assert page.status_code == 200
    text = page.content.decode()
    assert "1 of 3 ended: 1 done, 0 failed" in text
    success, failure = b.callback_jobs
    assert f"/admin/django_pgjobs/job/{success.id}/change/" in text and "waiting" in text
    assert admin_client.get("/admin/django_pgjobs/batch/?state=open%00").status_code == 400
    assert admin_client.get("/admin/django_pgjobs/batch/add/").status_code == 403
    for handle in Job.objects.claim_batch("default", 5, "w"):
        handle.ack()
    text = admin_client.get("/admin/django_pgjobs/batch/").content.decode()
    assert "3 of 3 ended: 3 done, 0 failed" in text
    assert "fired, pending" in text and f"#{failure.id} not fired" in text


def test_a_batch_page_links_its_members_in_both_lists(admin_client: Client) -> None:
    """Issue 29, item 9: the batch pages were stock Django with counts only."""
    from django_pgjobs.batches import Callback, batch

    with batch(on_complete=Callback("tests.plain", value=9)) as b:
        for n in range(3):
            b.add("tests.plain", value=n)
    members = [member.id for member in b.members]
    first = Job.objects.claim_batch("default", 1, "w")[0]
    first.fail("no")
    (callback,) = b.callback_jobs
    page = admin_client.get(f"/admin/django_pgjobs/batch/{b.id}/change/").content.decode()
    live = f'/admin/django_pgjobs/job/?parents_of={callback.id}"'
    dead = f'/admin/django_pgjobs/deadjob/?parents_of={callback.id}"'
    assert "3 members:" in page and live in page and dead in page
    listed = admin_client.get(f"/admin/django_pgjobs/job/?parents_of={callback.id}")
    assert {job.id for job in listed.context["cl"].result_list} == set(members) - {first.id}
    letters = admin_client.get(f"/admin/django_pgjobs/deadjob/?parents_of={callback.id}")
    assert [letter.id for letter in letters.context["cl"].result_list] == [first.id]
    assert re.search(r"Created at:</label>\s*<div class=\"readonly\">\d{4}-\d\d-\d\d ", page)


def test_a_jobs_page_shows_its_parents_children_and_batch(admin_client: Client) -> None:
    from django_pgjobs.batches import Callback, batch
    from django_pgjobs.dependencies import Parent

    parent = Job.objects.enqueue("tests.plain")
    lenient = Job.objects.enqueue("tests.plain")
    child = Job.objects.enqueue("tests.plain", after=[parent, Parent(lenient, on_failure="run")])
    page = admin_client.get(f"/admin/django_pgjobs/job/{child.id}/change/").content.decode()
    assert "Workflow" in page and "Waits for" in page
    assert f"/admin/django_pgjobs/job/{parent.id}/change/" in page
    assert "die with it" in page and "run anyway" in page and "ended: not yet" in page
    page = admin_client.get(f"/admin/django_pgjobs/job/{parent.id}/change/").content.decode()
    assert "Waited for by" in page and f"#{child.id}</a> (waiting)" in page
    with batch(on_complete=Callback("tests.plain")) as b:
        b.add("tests.plain", value=1)
    (member,) = b.members
    page = admin_client.get(f"/admin/django_pgjobs/job/{member.id}/change/").content.decode()
    assert f"/admin/django_pgjobs/batch/{b.id}/change/" in page and "0 of 1 ended" in page
    plain = Job.objects.enqueue("tests.plain")
    page = admin_client.get(f"/admin/django_pgjobs/job/{plain.id}/change/").content.decode()
    assert "Workflow" not in page
