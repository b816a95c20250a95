"""Dead letters' categories (issue 26, item 19): stored by the statement that buries the
job, never read from the reason's text, so that a hostile or look-alike reason (NUL,
lone surrogates, a megabyte, "dependency failed: abc") files where its path says and
never breaks the admin's list; and migration 0010's backfill by today's rules."""

from __future__ import annotations

from typing import Any

import pytest
from django.test import Client
from django.urls import reverse
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from django_pgjobs.db import connection as db
from django_pgjobs.db import sql
from django_pgjobs.exceptions import Fail
from django_pgjobs.models import DeadJob, Job
from django_pgjobs.registry import JobDefinition, register, unregister
from django_pgjobs.states import DeadCategory
from django_pgjobs.worker.executor import Executor
from tests.helpers import dead_row, execute, reads_index

pytestmark = pytest.mark.django_db

DEAD = reverse("admin:django_pgjobs_deadjob_changelist")
KIND = "tests.unit.categories.raiser"

LOOK_ALIKES = [
    "failed",
    "failed: x",
    "dependency failed: abc",
    "dependency failed: 1",
    "max attempts exceeded",
    "expired",
    "cancelled",
    "unknown job kind 'x'",
    "payload does not fit the handler of x: missing a required argument: 'y'",
    "the outcome could not be stored: DataError: no",
    "result is not JSON: no",
    "a\x00b",
    "\x00",
    "\ud800",
    "x\udfff\ud800y",
    "x" * 1_000_000,
    "%",
    "_%\\",
    "' OR 1=1 --",
    "<script>alert(1)</script>",
]
hostile_reason = st.sampled_from(LOOK_ALIKES) | st.text(
    st.characters(codec=None, exclude_categories=()) | st.sampled_from(["\x00", "\ud800"]),
    max_size=60,
)


#: What the handler raises: a payload cannot carry every text (jsonb refuses NUL).
MESSAGE: list[str] = [""]


def raise_fail() -> None:
    raise Fail(MESSAGE[0])


@pytest.fixture
def raiser() -> Any:
    register(JobDefinition(kind=KIND, func=raise_fail))
    yield
    unregister(KIND)


def category_of(job_id: int) -> str | None:
    found = dead_row(job_id, "category")
    assert found is not None
    return None if found[0] is None else str(found[0])


def rendered(client: Client, **params: str) -> set[int]:
    response = client.get(DEAD, params)
    assert response.status_code == 200
    return {obj.id for obj in response.context["cl"].result_list}


@settings(
    max_examples=25,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(text=hostile_reason)
def test_s15_s27_any_reason_files_by_its_path_and_never_breaks_the_list(
    admin_client: Client, raiser: None, text: str
) -> None:
    """A handler's Fail(text) is 'failed', a cancel_many(reason=text) 'cancelled', a
    spent retry with the text as its error 'max attempts exceeded', whatever the text
    looks like; the letters' page and every filter render, and each finds its own."""
    MESSAGE[0] = text
    failed = Job.objects.enqueue(KIND, queue="hostile").id
    handle = Job.objects.claim_one("hostile", "w")
    outcome = Executor().run(handle)
    assert outcome.failure is not None
    assert Job.objects.fail_batch([(handle, outcome.failure)]) == 1
    cancelled = Job.objects.enqueue("demo.t", queue="hostile").id
    assert Job.objects.cancel_many([cancelled], reason=text) == 1
    spent = Job.objects.enqueue("demo.t", queue="hostile", max_attempts=1).id
    assert Job.objects.claim_one("hostile", "w").retry(text)
    assert category_of(failed) == "failed"
    assert category_of(cancelled) == "cancelled"
    assert category_of(spent) == "max_attempts"
    ours = {failed, cancelled, spent}
    assert ours <= rendered(admin_client)
    assert rendered(admin_client, reason="failed") & ours == {failed}
    assert rendered(admin_client, reason="cancelled") & ours == {cancelled}
    assert rendered(admin_client, reason="max_attempts") & ours == {spent}
    for value in ("dependency", "unknown_kind", "payload", "other"):
        assert not rendered(admin_client, reason=value) & ours, value
    for job_id in ours:
        url = reverse("admin:django_pgjobs_deadjob_change", args=[job_id])
        assert admin_client.get(url).status_code == 200
    execute("DELETE FROM pgjobs_dead WHERE queue = 'hostile'")


def test_s25_an_unknown_kind_spent_on_its_last_attempt_is_unknown_kind() -> None:
    """The executor's failure of a kind it has no handler of names its category: the
    retry that spends the last attempt files it under unknown_kind, its reason still
    'max attempts exceeded' (S13)."""
    job_id = Job.objects.enqueue("tests.unit.categories.nobody", max_attempts=1).id
    handle = Job.objects.claim_one("default", "w")
    outcome = Executor().run(handle)
    assert outcome.failure is not None
    assert outcome.failure.category is DeadCategory.UNKNOWN_KIND
    assert Job.objects.retry_batch([(handle, outcome.failure, None)]) == 1
    assert dead_row(job_id, "category", "reason") == ("unknown_kind", "max attempts exceeded")


def test_a_cancel_many_reason_is_stored_as_a_failures_text_is() -> None:
    """S27 for an operator's reason: NUL and lone surrogates escaped, not refused."""
    job_id = Job.objects.enqueue("demo.t").id
    assert Job.objects.cancel_many([job_id], reason="a\x00b\ud800") == 1
    assert dead_row(job_id, "category", "reason") == ("cancelled", "a\\x00b\\ud800")


BACKFILL = [
    ("max attempts exceeded", "ValueError: no", "max_attempts"),
    ("max attempts exceeded", "unknown job kind 'gone': this worker ...", "unknown_kind"),
    ("failed", None, "failed"),
    ("expired", None, "expired"),
    ("cancelled", None, "cancelled"),
    ("unknown job kind 'gone'", None, "unknown_kind"),
    ("payload does not fit the handler of x: missing 'y'", None, "payload"),
    ("payload is not a JSON object: list", None, "payload"),
    ("the outcome could not be stored: DataError: no", None, "unstorable"),
    ("result is not JSON: result['when'] is a object", None, "unstorable"),
    ("result is 9000000 bytes of JSON; the limit is 1048576", None, "unstorable"),
    ("dependency failed: 7", None, None),  # read as dependency by its reason
    ("the customer closed their account", None, None),  # a Fail("..."): cannot be told
    ("wrong customer", None, None),  # a cancel_many(reason=...): cannot be told
]


def test_migration_0010_files_the_letters_already_there_by_their_reason() -> None:
    """FILE_DEAD_LETTERS, as migration 0010 runs it: batches by id, and a letter whose
    reason says nothing stays without a category ("other"), a dependency failure too
    (read by its reason); a letter already filed keeps its category."""
    ids = []
    for reason, last_error, _ in BACKFILL:
        job_id = Job.objects.enqueue("demo.t").id
        assert Job.objects.cancel_many([job_id], reason=reason) == 1
        execute(
            "UPDATE pgjobs_dead SET category = NULL, last_error = %s WHERE id = %s",
            [last_error, job_id],
        )
        ids.append(job_id)
    kept = Job.objects.enqueue("demo.t").id
    Job.objects.cancel_many([kept], reason="failed")  # filed already: cancelled
    after, batches = 0, 0
    while True:
        ((last,),) = db.fetchall(sql.FILE_DEAD_LETTERS, {"after": after, "limit": 3}, None)
        if last is None:
            break
        after, batches = last, batches + 1
    assert batches == 5
    for job_id, (reason, _, category) in zip(ids, BACKFILL, strict=True):
        assert category_of(job_id) == category, reason
    assert category_of(kept) == "cancelled"
    assert DeadJob.objects.get(pk=ids[-3]).filed_category is DeadCategory.DEPENDENCY
    assert DeadJob.objects.get(pk=ids[-1]).filed_category is None
    other = set(DeadJob.objects.filter(DeadJob.in_category(None)).values_list("id", flat=True))
    assert other == set(ids[-2:])


def test_the_reason_filter_walks_the_category_index() -> None:
    """The filter's query, newest first, reads an index, not the table: a stored
    category walks pgjobs_dead_category; the letters without one (dependency failures,
    letters of before the column) an index in died_at order, whichever the server's
    planner picks (PostgreSQL versions differ on an empty table)."""
    from django.db import connection

    for category in (DeadCategory.FAILED, DeadCategory.DEPENDENCY, None):
        queryset = DeadJob.objects.filter(DeadJob.in_category(category)).order_by(
            "-died_at", "-id"
        )[:100]
        with connection.cursor() as cursor:
            cursor.execute("SET LOCAL enable_seqscan = off")
            plan = queryset.explain()
        assert "Seq Scan" not in plan, plan
        if category is DeadCategory.FAILED:
            assert reads_index(plan, "pgjobs_dead_category"), plan
        else:
            assert reads_index(plan, "pgjobs_dead_category") or reads_index(
                plan, "pgjobs_dead_died_at"
            ), plan
