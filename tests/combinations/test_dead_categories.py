"""Dead letters' categories where the paths that bury a job meet the console (issue 26,
item 19; S13, S15, S24, S25, S27, S28, S30, S32, S38): each category made by a real
path (a worker running handlers, the sweeper, a cancel, a parent's death, a cancel of a
held row), stored with the letter, and found by the admin's reason filter."""

from __future__ import annotations

import pytest
from django.test import Client
from django.urls import reverse

from django_pgjobs.maintenance import Sweeper
from django_pgjobs.models import DeadJob, Job
from django_pgjobs.states import DeadCategory
from tests.combinations.test_cancels import _fence_holds
from tests.helpers import (
    dead_row,
    drain,
    execute,
    lapse,
    record_cancel_request,
    running_worker,
    wait_until,
)
from tests.jobs import always_broken, fail_bare, fail_with_message, needs_x, not_json

pytestmark = pytest.mark.django_db(transaction=True)

DEAD = reverse("admin:django_pgjobs_deadjob_changelist")
QUEUE = "categories"


def letter(job_id: int) -> tuple[str | None, str]:
    """A dead letter's stored category and reason."""
    found = dead_row(job_id, "category", "reason")
    assert found is not None, f"job {job_id} is not a dead letter"
    return found[0], found[1]


def filed(job_id: int) -> DeadCategory | None:
    return DeadJob.objects.get(pk=job_id).filed_category


def listed(client: Client, value: str) -> set[int]:
    response = client.get(f"{DEAD}?reason={value}")
    assert response.status_code == 200
    return {obj.id for obj in response.context["cl"].result_list}


@pytest.fixture
def letters() -> dict[str, int]:
    """One dead letter of each category, each made by the path that makes it."""
    ids = {
        "failed": fail_with_message.enqueue().id,
        "failed_bare": fail_bare.enqueue().id,
        "max_attempts": always_broken.enqueue().id,
        "unstorable": not_json.enqueue().id,
        "payload": needs_x.enqueue(x=1).id,
        "unknown_kind": Job.objects.enqueue("tests.categories.nobody", queue=QUEUE).id,
    }
    # A row edited by hand: the payload no longer fits the handler (S28 at run time).
    execute("UPDATE pgjobs_job SET payload = '{\"y\": 1}' WHERE id = %s", [ids["payload"]])
    execute("UPDATE pgjobs_job SET max_attempts = 1 WHERE id = %s", [ids["unknown_kind"]])
    parent = fail_with_message.enqueue()
    ids["parent"] = parent.id
    ids["dependency"] = Job.objects.enqueue("tests.categories.child", after=[parent]).id
    drain(queues=[QUEUE])
    ids["expired"] = Job.objects.enqueue("demo.task", queue="later", expires=3600).id
    execute(
        "UPDATE pgjobs_job SET expires_at = now() - interval '1 s' WHERE id = %s", [ids["expired"]]
    )
    assert Sweeper().run_once().expired == 1
    ids["cancelled"] = Job.objects.enqueue("demo.task", queue="later").id
    assert Job.objects.cancel_many([ids["cancelled"]], reason="wrong customer") == 1
    return ids


EXPECTED = {
    "failed": (DeadCategory.FAILED, "the customer closed their account"),
    "failed_bare": (DeadCategory.FAILED, "failed"),
    "max_attempts": (DeadCategory.MAX_ATTEMPTS, "max attempts exceeded"),
    "unstorable": (DeadCategory.UNSTORABLE, None),
    "payload": (DeadCategory.PAYLOAD, None),
    "unknown_kind": (DeadCategory.UNKNOWN_KIND, "max attempts exceeded"),
    "expired": (DeadCategory.EXPIRED, "expired"),
    "cancelled": (DeadCategory.CANCELLED, "wrong customer"),
}


class TestEveryPathFilesItsLetter:
    def test_s15_s13_s24_s25_s27_s28_each_path_stores_its_category(
        self, letters: dict[str, int]
    ) -> None:
        for name, (category, reason) in EXPECTED.items():
            stored, stored_reason = letter(letters[name])
            assert stored == category.value, (name, stored, stored_reason)
            if reason is not None:
                assert stored_reason == reason, name
        assert letter(letters["payload"])[1].startswith("payload does not fit")
        assert letter(letters["unstorable"])[1].startswith("result is not JSON")
        assert "unknown job kind" in str(dead_row(letters["unknown_kind"], "last_error")[0])

    def test_s30_a_dependency_failure_reads_as_dependency(self, letters: dict[str, int]) -> None:
        """pgjobs_end_parents names no category: its letters read as 'dependency' by
        their reason, and the parent's own letter is 'failed'."""
        stored, reason = letter(letters["dependency"])
        assert (stored, reason) == (None, f"dependency failed: {letters['parent']}")
        assert filed(letters["dependency"]) is DeadCategory.DEPENDENCY
        assert filed(letters["parent"]) is DeadCategory.FAILED

    def test_the_reason_filter_finds_each_category_and_only_it(
        self, admin_client: Client, letters: dict[str, int]
    ) -> None:
        expected: dict[str, set[int]] = {}
        for name, (category, _) in EXPECTED.items():
            expected.setdefault(category.value, set()).add(letters[name])
        expected["failed"].add(letters["parent"])
        expected["dependency"] = {letters["dependency"]}
        for value, ids in expected.items():
            assert listed(admin_client, value) == ids, value
        assert listed(admin_client, "other") == set()

    def test_failed_finds_a_fail_with_a_message(
        self, admin_client: Client, letters: dict[str, int]
    ) -> None:
        """Issue 26, item 19: 'failed' found only a bare Fail(); every Fail("message")
        landed under 'other'."""
        found = listed(admin_client, "failed")
        assert letters["failed"] in found and letters["failed_bare"] in found
        assert letters["failed"] not in listed(admin_client, "other")

    def test_a_letters_page_shows_its_category_beside_the_reason(
        self, admin_client: Client, letters: dict[str, int]
    ) -> None:
        url = reverse("admin:django_pgjobs_deadjob_change", args=[letters["failed"]])
        page = admin_client.get(url).content.decode()
        assert "the customer closed their account" in page
        assert 'class="pgjobs-category"' in page and ">failed<" in page
        url = reverse("admin:django_pgjobs_deadjob_change", args=[letters["dependency"]])
        assert ">dependency failed<" in admin_client.get(url).content.decode()


class TestS38CancelsFileAsCancelled:
    def test_s38_a_cancel_of_a_held_row_is_cancelled_with_its_reason(self) -> None:
        """The fence holds the row when the cancel comes: the worker dead-letters the
        job through FAIL_JOBS with the request's reason, filed as cancelled."""
        job_id = Job.objects.enqueue("tests.fenced_acker", {"seconds": 1.5}).id
        with running_worker(queues=["long"], poll_interval=0.2):
            wait_until(lambda: _fence_holds(job_id), timeout=10)
            assert Job.objects.cancel_many([job_id], reason="wrong customer") == 1
            wait_until(lambda: dead_row(job_id, "reason") is not None, timeout=15)
        assert letter(job_id) == ("cancelled", "wrong customer")

    def test_s9_s38_a_lapsed_claim_a_cancel_request_binds_is_cancelled(self) -> None:
        """RESCUE_LAPSED_JOBS buries a lapsed claim a cancel request binds with the
        request's reason, filed as cancelled; a lapsed spent claim without one is
        max_attempts."""
        bound = Job.objects.enqueue("demo.task", queue="lapsing").id
        spent = Job.objects.enqueue("demo.task", queue="lapsing", max_attempts=1).id
        handles = {h.id: h for h in Job.objects.claim_batch("lapsing", 10, "w")}
        record_cancel_request(bound, handles[bound].token, "stop: wrong customer")
        lapse(bound)
        lapse(spent)
        assert Job.objects.rescue_lapsed(["lapsing"], 10).dead == 2
        assert letter(bound) == ("cancelled", "stop: wrong customer")
        assert letter(spent) == ("max_attempts", "max attempts exceeded")
