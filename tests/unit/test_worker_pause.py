"""A queue paused on one worker alone (issue 29, item 13; Oban's per-node pause): the
registry keeps it for the worker's process, its heartbeat reads it, the console and
jobsctl set it, and a value edited by hand reads as what it holds or as none."""

from __future__ import annotations

import json

import pytest
from django.contrib.admin.models import LogEntry
from django.contrib.admin.utils import quote
from django.contrib.auth.models import Permission, User
from django.core.management import CommandError, call_command
from django.test import Client
from django.urls import reverse
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from django_pgjobs.managers.workers import unserved_queues
from django_pgjobs.models import Job, QueueControl, Worker
from tests.helpers import execute

pytestmark = pytest.mark.django_db

WORKER = "vm:7:abc"


def beat(pid: int = 7, queues: tuple[str, ...] = ("mail", "bulk")):  # type: ignore[no-untyped-def]
    return Worker.objects.heartbeat(
        WORKER, host="vm", pid=pid, queues=list(queues), concurrency=2, version="1",
        heartbeat_s=5, running=0, succeeded=0, failed=0,
    )  # fmt: skip


def test_a_queue_paused_on_one_worker_is_read_at_its_heartbeat_until_resumed() -> None:
    assert beat().paused_queues == frozenset()
    assert Worker.objects.pause_on([WORKER], "mail", by="alice") == [WORKER]
    assert Worker.objects.pause_on([WORKER], "mail", by="alice") == []  # already
    assert Worker.objects.pause_on([WORKER], "other", by="alice") == []  # not its queue
    assert beat().paused_queues == frozenset({"mail"})
    [status] = Worker.objects.status()
    assert status.claiming == ["bulk"] and status.paused_queues["mail"]["by"] == "alice"
    assert Worker.objects.pause_on([WORKER], "mail", paused=False, by="bob") == [WORKER]
    assert Worker.objects.pause_on([WORKER], "mail", paused=False, by="bob") == []
    assert beat().paused_queues == frozenset()


def test_a_pause_is_of_the_process_it_was_asked_of() -> None:
    beat()
    Worker.objects.pause_on([WORKER], "mail", by="alice")
    # The same --worker-id restarted (another pid): the new process claims every queue.
    assert beat(pid=8).paused_queues == frozenset()
    Worker.objects.pause_on([WORKER], "mail", by="alice")
    Worker.objects.stopped(WORKER, succeeded=0, failed=0)
    assert Worker.objects.pause_on([WORKER], "bulk", by="alice") == []  # stopped: left alone
    assert beat(pid=8).paused_queues == frozenset()


def test_a_queue_paused_on_its_only_worker_is_unserved() -> None:
    Job.objects.enqueue("mail.send", queue="mail")
    beat()
    statuses = QueueControl.objects.status()
    assert "mail" not in unserved_queues(statuses, Worker.objects.status())
    Worker.objects.pause_on([WORKER], "mail", by="alice")
    assert unserved_queues(statuses, Worker.objects.status()) == ["mail"]


def operator(client: Client, name: str, *codenames: str) -> Client:
    user = User.objects.create_user(name, password="pw", is_staff=True)
    user.user_permissions.add(
        *Permission.objects.filter(
            content_type__app_label="django_pgjobs", codename__in=["view_worker", *codenames]
        )
    )
    client.force_login(user)
    return client


def test_the_workers_page_pauses_and_resumes_a_queue_there_for_those_who_may(
    client: Client,
) -> None:
    beat()
    # As the list links them: the id quoted (":" as "_3A").
    page_url = reverse("admin:django_pgjobs_worker_change", args=[quote(WORKER)])
    action = reverse("admin:django_pgjobs_worker_queues", args=[quote(WORKER)])
    assert "_3A" in page_url
    viewer = operator(client, "viewer")
    page = viewer.get(page_url).content.decode()
    assert 'data-queue="mail"' in page and "Pause here" not in page
    refused = viewer.post(action, {"queue": "mail", "paused": "1"}, follow=True)
    assert "Refused: you may not pause or resume queues" in refused.content.decode()
    assert beat().paused_queues == frozenset()

    ops = operator(Client(), "ops", "control_worker")
    assert "Pause here" in ops.get(page_url).content.decode()
    done = ops.post(action, {"queue": "mail", "paused": "1"}, follow=True).content.decode()
    assert "Queue mail paused on worker vm:7:abc alone" in done
    assert "paused here by ops since" in done and "Resume here" in done
    assert beat().paused_queues == frozenset({"mail"})
    again = ops.post(action, {"queue": "mail", "paused": "1"}, follow=True).content.decode()
    assert "already paused" in again
    listed = ops.get(reverse("admin:django_pgjobs_worker_changelist")).content.decode()
    assert "mail (paused here)" in listed
    ops.post(action, {"queue": "mail", "paused": "0"})
    assert beat().paused_queues == frozenset()
    assert [e.change_message for e in LogEntry.objects.order_by("id")] == [
        "Paused queue mail here.",
        "Resumed queue mail here.",
    ]
    for hostile in ({"queue": "nope", "paused": "1"}, {"queue": "mail", "paused": "yes"}, {}):
        assert ops.post(action, hostile).status_code == 400, hostile
    assert ops.get(action).status_code == 302  # a GET changes nothing


def test_jobsctl_asks_workers_by_id_or_host_and_pauses_a_queue_on_one(
    capsys: pytest.CaptureFixture[str],
) -> None:
    beat()
    call_command("jobsctl", "worker", "pause", WORKER, "bulk")
    assert "Queue bulk paused on worker vm:7:abc alone" in capsys.readouterr().out
    assert beat().paused_queues == frozenset({"bulk"})
    with pytest.raises(CommandError, match="does not claim from queue 'nope'"):
        call_command("jobsctl", "worker", "pause", WORKER, "nope")
    with pytest.raises(CommandError, match="already paused"):
        call_command("jobsctl", "worker", "pause", WORKER, "bulk")
    call_command("jobsctl", "worker", "resume", WORKER, "bulk")
    call_command("jobsctl", "worker", "quiet", "--host", "vm")
    out = capsys.readouterr().out
    assert "Asked worker vm:7:abc to go quiet" in out and "1 worker obeys" in out
    assert beat().asked == "quiet"
    [status] = Worker.objects.status()
    assert status.asked_by is not None and status.asked_by.endswith("(jobsctl)")
    call_command("jobsctl", "worker", "run", WORKER)
    assert beat().asked is None
    with pytest.raises(CommandError, match="Which workers"):
        call_command("jobsctl", "worker", "stop")
    with pytest.raises(CommandError, match="No running worker on host 'elsewhere'"):
        call_command("jobsctl", "worker", "stop", "--host", "elsewhere")
    with pytest.raises(CommandError, match="No worker 'ghost:1:x' is registered"):
        call_command("jobsctl", "worker", "pause", "ghost:1:x", "mail")


#: What jsonb can hold: any text but NUL and lone surrogates (PostgreSQL refuses both).
JSONB_TEXT = st.characters(exclude_categories=("Cs",), exclude_characters="\x00")

json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.text(JSONB_TEXT, max_size=6),
    lambda inner: (
        st.lists(inner, max_size=5) | st.dictionaries(st.text(JSONB_TEXT, max_size=6), inner)
    ),
    max_leaves=15,
)


@settings(
    max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(stored=json_values | st.just(["mail"]) | st.just({"mail": 1}) | st.just({"mail": {"by": 2}}))
def test_a_pause_edited_by_hand_reads_as_what_it_names_and_can_be_set_again(
    admin_client: Client, stored: object
) -> None:
    execute("DELETE FROM pgjobs_worker")
    beat()
    execute("UPDATE pgjobs_worker SET paused_queues = %s::jsonb", [json.dumps(stored)])
    paused = beat().paused_queues
    assert paused == (set(stored) if isinstance(stored, dict) else set())
    [status] = Worker.objects.status()
    assert set(status.claiming) <= {"mail", "bulk"}
    page = admin_client.get(reverse("admin:django_pgjobs_worker_change", args=[WORKER]))
    assert page.status_code == 200
    assert admin_client.get(reverse("admin:django_pgjobs_worker_changelist")).status_code == 200
    # Whatever it held, an operator can pause a queue there and resume it again.
    if "mail" not in status.paused_queues:
        assert Worker.objects.pause_on([WORKER], "mail", by="ops") == [WORKER]
    assert "mail" in beat().paused_queues
    assert Worker.objects.pause_on([WORKER], "mail", paused=False, by="ops") == [WORKER]
    assert "mail" not in beat().paused_queues
