"""Workers asked things from the console (issue 29, item 13): an operator with the
control_worker permission asks real `runjobs` processes to go quiet, to run again, or to
stop after their running jobs; each obeys at its next heartbeat, and the admin's log says
who asked. With NOTIFY and without (the PgBouncer setup), a job running meanwhile."""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

import pytest
from django.contrib.admin.models import LogEntry
from django.contrib.auth.models import Permission, User
from django.test import Client
from django.urls import reverse

from django_pgjobs.models import Job, Worker
from tests.helpers import count, execute
from tests.spawn import Workers, wait_for

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]

WORKERS = reverse("admin:django_pgjobs_worker_changelist")
HEARTBEAT_S = 0.5


def operator(name: str, *permissions: str) -> Client:
    user = User.objects.create_user(name, password="pw", is_staff=True)
    user.user_permissions.add(
        *Permission.objects.filter(
            content_type__app_label="django_pgjobs", codename__in=["view_worker", *permissions]
        )
    )
    client = Client()
    client.force_login(user)
    return client


def cpu_seconds(pid: int) -> float:
    """The CPU time a process has used, user and system, from /proc."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def ask(client: Client, action: str, *worker_ids: str) -> str:
    response = client.post(
        WORKERS, {"action": action, "_selected_action": list(worker_ids)}, follow=True
    )
    assert response.status_code == 200
    return response.content.decode()


def test_a_worker_asked_to_go_quiet_claims_nothing_until_asked_to_run_again_then_stops(
    workers: Workers, notify: bool
) -> None:
    env = {"PGJOBS_WORKER_HEARTBEAT": str(HEARTBEAT_S)}
    process = workers.start("--concurrency", "2", extra_env=env)
    wait_for(lambda: Worker.objects.filter(stopped_at=None).count() == 1, what="registration")
    worker_id = Worker.objects.get().id
    slow = Job.objects.enqueue("tests.record", {"label": "long", "sleep": 3}).id
    wait_for(lambda: count("tests_note") == 1, timeout=15, what="the long job to start")

    # Without the permission, a staff user who may view workers is refused.
    viewer = operator("viewer")
    page = ask(viewer, "go_quiet", worker_id)
    assert "Refused: you may not run “go_quiet”" in page
    assert Worker.objects.get().asked is None

    client = operator("ops", "control_worker")
    page = ask(client, "go_quiet", worker_id)
    assert "1 worker asked to go quiet: each obeys at its next heartbeat" in page
    assert (Worker.objects.get().asked, Worker.objects.get().asked_by) == ("quiet", "ops")
    # It has heard (at a heartbeat): on a loaded machine that may take longer than one.
    wait_for(
        lambda: "asked to go quiet from the console" in process.output(),
        timeout=30,
        what="the worker to hear it was asked to go quiet",
    )
    quiet_job = Job.objects.enqueue("tests.record", {"label": "while quiet"}).id
    time.sleep(6 * HEARTBEAT_S)
    assert execute("SELECT state FROM pgjobs_job WHERE id = %s", [quiet_job]) == [("pending",)]
    # The job it was running finishes: quiet stops claims, not work.
    wait_for(lambda: count("pgjobs_job", f"id = {slow}") == 0, timeout=15, what="the long job")
    # Idle and quiet, it waits as an idle worker does: it does not spin on its loop.
    before = cpu_seconds(process.pid)
    time.sleep(2)
    assert cpu_seconds(process.pid) - before < 0.5
    listed = client.get(WORKERS).content.decode()
    assert "asked to go quiet by ops" in listed

    ask(client, "run_again", worker_id)
    wait_for(
        lambda: count("pgjobs_job", f"id = {quiet_job}") == 0,
        timeout=30,
        what="the job enqueued while quiet, once asked to run again",
    )

    Job.objects.enqueue("tests.record", {"label": "last", "sleep": 1})
    wait_for(lambda: count("tests_note") == 3, timeout=15, what="the last job to start")
    page = ask(client, "stop_after_running", worker_id)
    assert "1 worker asked to stop" in page
    assert process.wait(30) == 0, process.output()
    assert count("tests_note") == 3 and count() == 0  # the last job ran to its end
    assert Worker.objects.get().stopped_at is not None
    assert "asked to stop from the console" in process.output()

    page = ask(client, "go_quiet", worker_id)  # a stopped worker is left alone
    assert "0 workers asked to go quiet" in page and "1 had stopped, or were asked" in page
    logged = [entry.change_message for entry in LogEntry.objects.order_by("id")]
    assert logged == [
        f"Asked 1 worker to go quiet: {worker_id}.",
        f"Asked 1 worker to run again: {worker_id}.",
        f"Asked 1 worker to stop: {worker_id}.",
    ]


def test_a_queue_paused_on_one_worker_alone_runs_on_the_others_until_resumed(
    workers: Workers, notify: bool
) -> None:
    """Oban's per-node pause: worker A serves queues a and b, worker B serves a. With a
    paused on A from A's page, every job of a runs on B, A still runs b's; with B gone
    too, a's jobs wait (and the console says no live worker serves a); resumed on A,
    they run there. A job of a running on A when paused runs to its end."""
    env = {"PGJOBS_WORKER_HEARTBEAT": str(HEARTBEAT_S)}
    first = workers.start("--queue", "a", "--queue", "b", "--worker-id", "ctl:a:1", extra_env=env)
    second = workers.start("--queue", "a", "--worker-id", "ctl:b:1", extra_env=env)
    wait_for(lambda: Worker.objects.filter(stopped_at=None).count() == 2, what="registration")
    long = Job.objects.enqueue("tests.record", {"label": "long", "sleep": 2}, queue="a").id
    wait_for(lambda: count("tests_note") == 1, timeout=15, what="the long job to start")
    [(holder,)] = execute("SELECT worker FROM tests_note")

    client = operator("ops", "control_worker")
    action = reverse("admin:django_pgjobs_worker_queues", args=["ctl:a:1"])
    response = client.post(action, {"queue": "a", "paused": "1"}, follow=True)
    assert "Queue a paused on worker ctl:a:1 alone" in response.content.decode()
    wait_for(
        lambda: "queues paused on this worker alone: a; claiming from: b" in first.output(),
        timeout=30,
        what="worker A to hear its queue a was paused on it",
    )
    wait_for(lambda: count("pgjobs_job", f"id = {long}") == 0, timeout=15, what="the long job")
    for n in range(6):
        Job.objects.enqueue("tests.record", {"label": f"a{n}"}, queue="a")
    Job.objects.enqueue("tests.record", {"label": "b"}, queue="b")
    wait_for(lambda: count("pgjobs_job") == 0, timeout=30, what="the jobs of a and b to run")
    ran = dict(execute("SELECT text, worker FROM tests_note WHERE text <> 'long'"))
    assert ran.pop("b") == "ctl:a:1"
    assert set(ran.values()) == {"ctl:b:1"}, ran  # none of a on the worker it is paused on
    assert holder in ("ctl:a:1", "ctl:b:1")

    second.signal(signal.SIGTERM)
    assert second.wait(30) == 0, second.output()
    waiting = Job.objects.enqueue("tests.record", {"label": "waits"}, queue="a").id
    time.sleep(6 * HEARTBEAT_S)
    assert execute("SELECT state FROM pgjobs_job WHERE id = %s", [waiting]) == [("pending",)]
    assert (
        "No live worker serves a, which has runnable jobs" in client.get(WORKERS).content.decode()
    )

    client.post(action, {"queue": "a", "paused": "0"})
    wait_for(lambda: count("pgjobs_job") == 0, timeout=30, what="a's job, once resumed on A")
    assert execute("SELECT worker FROM tests_note WHERE text = 'waits'") == [("ctl:a:1",)]
    logged = [entry.change_message for entry in LogEntry.objects.order_by("id")]
    assert logged == ["Paused queue a here.", "Resumed queue a here."]
