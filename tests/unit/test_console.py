"""The operator's console in the admin: search by prefix along the indexes, reasons by
category, object pages led by what went wrong and their buttons, refusals that say so,
progress, and hostile query strings answered with a 400 or an empty list, never a 500."""

from __future__ import annotations

import re
from typing import Any

import pytest
from django.contrib.admin.models import CHANGE, DELETION, LogEntry
from django.contrib.auth.models import Permission, User
from django.db import connection
from django.test import Client
from django.test.utils import CaptureQueriesContext
from django.urls import reverse
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from django_pgjobs.claims import Failure
from django_pgjobs.models import DeadJob, Job, QueueControl, Worker
from django_pgjobs.states import DeadCategory
from tests.helpers import count, execute, reads_index, row, seconds_from_now

pytestmark = pytest.mark.django_db

JOBS = reverse("admin:django_pgjobs_job_changelist")
DEAD = reverse("admin:django_pgjobs_deadjob_changelist")


def job_page(job_id: int) -> str:
    return reverse("admin:django_pgjobs_job_change", args=[job_id])


def dead_page(job_id: int) -> str:
    return reverse("admin:django_pgjobs_deadjob_change", args=[job_id])


def act(model: str, job_id: int, name: str) -> str:
    return reverse(f"admin:django_pgjobs_{model}_act", args=[job_id, name])


@pytest.fixture
def jobs() -> dict[str, int]:
    """Live jobs of two kinds (one keyed, one running with progress), and dead letters
    with each kind of reason."""
    ids = {
        "report": Job.objects.enqueue("billing.report", {"n": 1}, queue="billing").id,
        "keyed": Job.objects.enqueue(
            "billing.sync", queue="billing", key="account:7", delay=3600
        ).id,
    }
    Job.objects.enqueue("media.encode", {"file": "a.mp4"}, queue="media")
    running = Job.objects.claim_one("media", "host:1:abc")
    ids["running"] = running.id
    execute(
        "UPDATE pgjobs_job SET progress = %s::jsonb WHERE id = %s",
        ['{"fraction": 0.4, "message": "frame 40", "data": {}, "at": "2026-12-01T10:00:00Z"}',
         running.id],
    )  # fmt: skip
    # Each as the worker files it (executor.py): a fail's category is "failed" whatever
    # its text; a misfit payload and an unknown kind say what they are.
    unknown = Failure("unknown job kind 'gone.away'", category=DeadCategory.UNKNOWN_KIND)
    misfit = "payload does not fit the handler of x: missing a required argument: 'y'"
    reasons: dict[str, str | Failure | None] = {
        "spent": None,
        "failed": "failed",
        "custom": "the remote said no",
        "unknown": None,
        "payload": Failure(misfit, category=DeadCategory.PAYLOAD),
    }
    for name, reason in reasons.items():
        attempts = 1 if reason is None else 2
        Job.objects.enqueue("ops.task", {"name": name}, queue="ops", max_attempts=attempts)
        handle = Job.objects.claim_one("ops", "host:2:def")
        try:
            raise RuntimeError(f"boom {name}")
        except RuntimeError as error:
            # The last attempt for "spent" and "unknown": max attempts exceeded.
            handle.retry(unknown if name == "unknown" else error, delay=0)
        if reason is not None:
            Job.objects.claim_one("ops", "host:2:def").fail(reason)
        ids[name] = handle.id
    ids["cancelled"] = Job.objects.enqueue("ops.task", {"name": "c"}, queue="ops").id
    Job.objects.cancel_many([ids["cancelled"]])
    return ids


def shown(client: Client, url: str, **params: Any) -> set[int]:
    response = client.get(url, params)
    assert response.status_code == 200
    return {obj.id for obj in response.context["cl"].result_list}


def test_the_lists_show_a_search_box(admin_client: Client, jobs: dict[str, int]) -> None:
    for url in (JOBS, DEAD):
        page = admin_client.get(url).content.decode()
        assert 'id="searchbar"' in page
        assert "the start of a kind or a key" in page


def test_search_finds_kinds_and_keys_by_their_start_and_ids_exactly(
    admin_client: Client, jobs: dict[str, int]
) -> None:
    assert shown(admin_client, JOBS, q="billing.") == {jobs["report"], jobs["keyed"]}
    assert shown(admin_client, JOBS, q="billing.rep") == {jobs["report"]}
    assert shown(admin_client, JOBS, q="account:") == {jobs["keyed"]}
    assert shown(admin_client, JOBS, q=str(jobs["running"])) == {jobs["running"]}
    assert shown(admin_client, JOBS, q="port") == set()  # a prefix, not a substring
    assert shown(admin_client, JOBS, q="billing%") == set()  # LIKE's wildcards are literal
    assert len(shown(admin_client, DEAD, q="ops.")) == 6


def test_search_by_prefix_walks_an_index_on_either_table() -> None:
    from django.db.models import Q

    for model in (Job, DeadJob):
        prefix = Q(kind__startswith="billing.") | Q(key__startswith="account:")
        queryset = model.objects.filter(prefix)  # type: ignore[attr-defined]
        with connection.cursor() as cursor:
            cursor.execute("SET LOCAL enable_seqscan = off")
            plan = queryset.explain()
        table = model._meta.db_table
        assert reads_index(plan, f"{table}_kind"), plan
        assert reads_index(plan, f"{table}_key_prefix"), plan


@pytest.mark.parametrize(
    ("category", "expected"),
    [
        ("max_attempts", ["spent"]),
        ("failed", ["failed", "custom"]),  # issue 26, item 19: every fail, whatever its text
        ("cancelled", ["cancelled"]),
        ("unknown_kind", ["unknown"]),
        ("payload", ["payload"]),
        ("other", []),
        ("expired", []),
    ],
)
def test_dead_letters_filter_by_a_bounded_list_of_reason_categories(
    admin_client: Client, jobs: dict[str, int], category: str, expected: list[str]
) -> None:
    assert shown(admin_client, DEAD, reason=category) == {jobs[name] for name in expected}
    page = admin_client.get(DEAD).content.decode()
    assert "the remote said no" not in re.sub(r"<table id=\"result_list\".*", "", page, flags=re.S)


def test_a_job_page_leads_with_state_attempts_error_and_traceback(
    admin_client: Client, jobs: dict[str, int]
) -> None:
    page = admin_client.get(dead_page(jobs["custom"])).content.decode()
    where = {
        label: page.index(text)
        for label, text in (
            ("state", "dead (the remote said no)"),
            ("attempts", "2 of 2"),
            ("traceback", "RuntimeError: boom custom"),
            ("payload", "&quot;name&quot;: &quot;custom&quot;"),
            ("details", "Details"),
        )
    }
    assert where["state"] < where["attempts"] < where["traceback"] < where["payload"]
    assert where["payload"] < where["details"]
    assert re.search(r'<fieldset class="[^"]*collapse', page) or "<details" in page
    assert "pgjobs-traceback" in page  # wraps
    assert not re.search(r"\d{2}:\d{2}:\d{2}\.\d{6}", page)  # no raw ISO times
    assert "Lease s" not in page and "lease" in page
    assert "/history/" not in page  # no HISTORY button that shows nothing


def test_lists_and_pages_are_titled_for_what_they_are(
    admin_client: Client, jobs: dict[str, int]
) -> None:
    page = admin_client.get(JOBS).content.decode()
    assert "Select job to change" not in page and "<h1>Jobs</h1>" in page
    assert "Job queue" in page  # the breadcrumb names the app, not "Jobs > Jobs"
    assert "<h1>Dead letters</h1>" in admin_client.get(DEAD).content.decode()


def test_a_running_jobs_progress_shows_as_a_bar(admin_client: Client, jobs: dict) -> None:
    listed = admin_client.get(JOBS).content.decode()
    assert 'class="pgjobs-progress"' in listed and "40%" in listed
    detail = admin_client.get(job_page(jobs["running"])).content.decode()
    assert "pgjobs-progress-wide" in detail and "frame 40" in detail


def test_the_buttons_of_a_job_page_do_what_they_say(
    admin_client: Client, jobs: dict[str, int]
) -> None:
    page = admin_client.get(job_page(jobs["keyed"])).content.decode()
    assert 'name="pgjobs-run_now"' in page and 'name="pgjobs-cancel"' in page
    assert f'action="{act("job", jobs["keyed"], "run_now")}"' in page  # absolute, not relative
    running = admin_client.get(job_page(jobs["running"])).content.decode()
    assert 'name="pgjobs-run_now"' not in running  # only a pending job can run now

    response = admin_client.post(act("job", jobs["keyed"], "run_now"), follow=True)
    assert "set to run now." in response.content.decode()
    assert seconds_from_now("run_after", jobs["keyed"]) <= 0

    response = admin_client.post(act("job", jobs["running"], "cancel"), follow=True)
    assert "cancelled (now a dead letter)." in response.content.decode()
    letter = DeadJob.objects.get(pk=jobs["running"])
    # Who cancelled it, and (below, in its history) how far it had got.
    assert letter.reason == "cancelled by admin in the console"
    assert letter.filed_category == DeadCategory.CANCELLED
    assert (
        "cancelled by admin in the console"
        in admin_client.get(dead_page(letter.pk)).content.decode()
    )

    response = admin_client.post(act("deadjob", jobs["custom"], "requeue"), follow=True)
    assert "requeued." in response.content.decode()
    assert row(jobs["custom"], "state", "attempts") == ("pending", 0)

    response = admin_client.post(act("deadjob", jobs["failed"], "delete"), follow=True)
    assert "deleted." in response.content.decode()
    assert not DeadJob.objects.filter(pk=jobs["failed"]).exists()

    # Issue 29: every button left an entry in the admin's log, by whom, on what.
    logged = [
        (entry.content_type.model, entry.object_id, entry.action_flag, entry.change_message)
        for entry in LogEntry.objects.order_by("id")
    ]
    assert logged == [
        ("job", str(jobs["keyed"]), CHANGE, "Set to run now."),
        (
            "deadjob",
            str(jobs["running"]),
            CHANGE,
            "Cancelled: it was running on host:1:abc (attempt 1 of 10, at 40 % · frame 40).",
        ),
        (
            "job",
            str(jobs["custom"]),
            CHANGE,
            "Requeued, from the dead letters (the remote said no).",
        ),
        ("deadjob", str(jobs["failed"]), DELETION, "Deleted."),
    ]
    assert {entry.user.username for entry in LogEntry.objects.all()} == {"admin"}
    history = admin_client.get(
        reverse("admin:django_pgjobs_deadjob_history", args=[jobs["running"]])
    ).content.decode()
    assert "it was running on host:1:abc" in history
    assert "Recent actions" in (home := admin_client.get(reverse("admin:index")).content.decode())
    assert "None available" not in home


def test_a_button_answers_a_get_with_the_page_and_changes_nothing(
    admin_client: Client, jobs: dict[str, int]
) -> None:
    response = admin_client.get(act("job", jobs["keyed"], "run_now"))
    assert response.status_code == 302 and response["Location"] == job_page(jobs["keyed"])
    assert seconds_from_now("run_after", jobs["keyed"]) > 3000


@pytest.fixture
def viewer(client: Client) -> Client:
    user = User.objects.create_user("viewer", password="pw", is_staff=True)
    user.user_permissions.set(Permission.objects.filter(codename__in=["view_job", "view_deadjob"]))
    client.force_login(user)
    return client


def test_view_only_staff_see_no_buttons(viewer: Client, jobs: dict[str, int]) -> None:
    for url in (job_page(jobs["keyed"]), dead_page(jobs["custom"])):
        page = viewer.get(url).content.decode()
        assert 'class="pgjobs-button' not in page and 'name="pgjobs-' not in page


def test_a_forged_button_post_is_refused_with_a_message_and_changes_nothing(
    viewer: Client, jobs: dict[str, int]
) -> None:
    forged = [
        act("job", jobs["keyed"], "run_now"),
        act("job", jobs["running"], "cancel"),
        act("deadjob", jobs["custom"], "requeue"),
        act("deadjob", jobs["failed"], "delete"),
    ]
    for url in forged:
        response = viewer.post(url, follow=True)
        assert "Refused: you may not" in response.content.decode(), url
    assert count() == 3 and count("pgjobs_dead") == 6
    assert seconds_from_now("run_after", jobs["keyed"]) > 3000


def test_a_forged_list_action_is_refused_with_a_message_and_changes_nothing(
    viewer: Client, jobs: dict[str, int]
) -> None:
    response = viewer.post(
        DEAD, {"action": "requeue", "_selected_action": [jobs["custom"]]}, follow=True
    )
    assert "Refused: you may not run “requeue” on dead letters" in response.content.decode()
    response = viewer.post(
        JOBS,
        {"action": "cancel", "_selected_action": [jobs["report"]], "confirmed": "yes"},
        follow=True,
    )
    assert "Refused" in response.content.decode()
    assert count() == 3 and count("pgjobs_dead") == 6


def test_an_unknown_button_is_refused(admin_client: Client, jobs: dict[str, int]) -> None:
    response = admin_client.post(act("job", jobs["keyed"], "explode"), follow=True)
    assert "Refused" in response.content.decode()


def test_the_schedules_list_has_no_empty_glance(admin_client: Client, jobs: dict) -> None:
    page = admin_client.get(reverse("admin:django_pgjobs_schedule_changelist")).content.decode()
    assert "No jobs, no dead letters" not in page


def test_the_glance_counts_are_links_to_the_filtered_lists(
    admin_client: Client, jobs: dict[str, int]
) -> None:
    page = admin_client.get(JOBS).content.decode()
    assert 'href="/admin/django_pgjobs/deadjob/?queue=ops"' in page
    assert "?queue=billing&amp;readiness=runnable" in page
    assert shown(admin_client, JOBS, queue="billing", readiness="runnable") == {jobs["report"]}


#: Query strings a person or a script may send: any text, NULs too. Lone surrogates cannot
#: be sent as text (no UTF-8 for them): the raw bytes test below sends what would be.
hostile_text = st.text(st.characters(exclude_categories=("Cs",)), max_size=40) | st.sampled_from(
    ["\x00", "a\x00b", "'; DROP TABLE pgjobs_job; --", "%", "_", "\\", "9" * 30, "-1", "é" * 400]
)
PARAMS = ["q", "queue", "kind", "reason", "state__exact", "readiness", "o", "p", "died_at__gte"]


@settings(
    max_examples=60,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(name=st.sampled_from(PARAMS), value=hostile_text, dead=st.booleans())
def test_hostile_query_strings_get_a_400_or_a_list_never_a_500(
    admin_client: Client, name: str, value: str, dead: bool
) -> None:
    url = DEAD if dead else JOBS
    response = admin_client.get(url, {name: value})
    assert response.status_code in (200, 302, 400), (name, value, response.status_code)
    if response.status_code == 400:
        text = response.content.decode()
        assert "NUL" in text or "too long" in text or "not one of this list's filters" in text


def test_requeue_all_matching_the_filter_asks_with_the_count_then_goes_in_batches(
    admin_client: Client, jobs: dict[str, int], monkeypatch: pytest.MonkeyPatch
) -> None:
    from django_pgjobs.admin import common

    monkeypatch.setattr(common, "ACTION_BATCH", 2)
    url = f"{DEAD}?reason=failed"  # the filter, and a page selection of one of them
    for extra in range(5):
        Job.objects.enqueue("ops.task", {"extra": extra}, queue="ops", max_attempts=2)
        Job.objects.claim_one("ops", "w").fail(f"said no {extra}")
    chosen = {"action": "requeue", "_selected_action": [jobs["custom"]], "select_across": "1"}
    confirm = admin_client.post(url, chosen)
    assert confirm.status_code == 200
    assert "Requeue 7 jobs, every one matching the list's filter?" in confirm.content.decode()
    assert count("pgjobs_dead") == 11  # nothing happened yet
    answer = {**chosen, "confirmed": "yes", "pgjobs_upto": confirm.context["upto"]}
    done = admin_client.post(url, answer, follow=True)
    assert "7 jobs requeued." in done.content.decode()
    assert count("pgjobs_dead") == 4 and count("pgjobs_dead", "category = 'failed'") == 0
    (entry,) = LogEntry.objects.all()  # one for the whole action, with its filter
    assert entry.object_repr == "7 dead letters" and entry.content_type.model == "deadjob"
    assert entry.change_message == (
        "Requeued 7 dead letters, every one matching the list's filter: reason=failed."
    )


def test_cancel_all_matching_the_filter_states_the_count(
    admin_client: Client, jobs: dict[str, int]
) -> None:
    chosen = {"action": "cancel", "_selected_action": [jobs["report"]], "select_across": "1"}
    confirm = admin_client.post(f"{JOBS}?queue=billing", chosen)
    assert "Cancel 2 jobs, every one matching" in confirm.content.decode()
    answer = {**chosen, "confirmed": "yes", "pgjobs_upto": confirm.context["upto"]}
    admin_client.post(f"{JOBS}?queue=billing", answer)
    assert count(where="queue = 'billing'") == 0 and count() == 1


@pytest.mark.parametrize("raw", ["%00", "%ED%A0%80", "%FF%FE", "%C3", "%25%00", "%E2%80%AE"])
@pytest.mark.parametrize("name", ["q", "queue", "kind", "reason"])
def test_query_strings_of_raw_bytes_that_are_not_utf8_never_give_a_500(
    admin_client: Client, name: str, raw: str
) -> None:
    for url in (JOBS, DEAD):
        response = admin_client.get(f"{url}?{name}={raw}")
        assert response.status_code in (200, 302, 400), (url, name, raw)


#: Lookups a URL may ask of any column, which no sidebar offers: each a scan of the table.
UNOFFERED = [
    "payload__icontains",
    "errors__iregex",
    "last_error__regex",
    "key__contains",
    "worker_id",
    "state__in",
    "id__gt",
    "died_at__gte",
    "reason__icontains",
]


def pgjobs_reads(captured: CaptureQueriesContext) -> list[str]:
    return [query["sql"] for query in captured.captured_queries if "pgjobs_" in query["sql"]]


@pytest.mark.parametrize("url", [JOBS, DEAD])
@pytest.mark.parametrize("name", UNOFFERED)
def test_a_filter_the_list_does_not_offer_is_refused_before_anything_is_read(
    viewer: Client, jobs: dict[str, int], url: str, name: str
) -> None:
    with CaptureQueriesContext(connection) as captured:
        response = viewer.get(url, {name: "a"})
    assert response.status_code == 400, (url, name)
    assert "is not one of this list's filters" in response.content.decode()
    assert pgjobs_reads(captured) == []


@pytest.mark.parametrize(
    ("url", "query"),
    [
        (JOBS, {"state__exact": "waiting"}),
        (JOBS, {"readiness": "runnable", "queue": "billing", "q": "billing", "o": "1", "p": "1"}),
        (DEAD, {"reason": "other", "queue": "ops", "kind": "ops.task"}),
        (reverse("admin:django_pgjobs_worker_changelist"), {"host": "h"}),
        (reverse("admin:django_pgjobs_batch_changelist"), {"state__exact": "open"}),
        (reverse("admin:django_pgjobs_queuecontrol_changelist"), {"paused__exact": "1"}),
        (reverse("admin:django_pgjobs_schedule_changelist"), {"enabled__exact": "0"}),
    ],
)
def test_the_filters_a_list_offers_are_accepted(
    admin_client: Client, jobs: dict[str, int], url: str, query: dict[str, str]
) -> None:
    assert admin_client.get(url, query).status_code == 200


@pytest.mark.parametrize(
    "url",
    [
        reverse("admin:django_pgjobs_worker_changelist"),
        reverse("admin:django_pgjobs_batch_changelist"),
        reverse("admin:django_pgjobs_queuecontrol_changelist"),
        reverse("admin:django_pgjobs_schedule_changelist"),
    ],
)
def test_the_other_lists_refuse_filters_they_do_not_offer(admin_client: Client, url: str) -> None:
    response = admin_client.get(url, {"id__regex": "."})
    assert response.status_code == 400 and "Nothing was read" in response.content.decode()


FIELD_NAMES = [field.name for field in Job._meta.fields] + ["reason", "died_at", "nosuch"]
LOOKUPS = ["", "__exact", "__icontains", "__iregex", "__in", "__gt", "__isnull", "__has_key"]
hostile_names = st.builds(
    "".join, st.tuples(st.sampled_from(FIELD_NAMES), st.sampled_from(LOOKUPS))
) | st.text(st.characters(exclude_categories=("Cs",), exclude_characters="\x00"), max_size=30)


@settings(
    max_examples=80,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(name=hostile_names, value=hostile_text, dead=st.booleans())
def test_hostile_filter_names_are_refused_and_read_nothing_never_a_500(
    viewer: Client, name: str, value: str, dead: bool
) -> None:
    """The rule at the lists' URL: a filter the list offers, or a clear 400 before any
    read of the job tables; never a 500, never a query with an unoffered filter."""
    url = DEAD if dead else JOBS
    offered = {"q", "o", "p", "e", "all", "_facets", "_popup", "_to_field", "_source_model"}
    offered |= {"reason", "queue", "kind"} if dead else {"state__exact", "state__isnull"}
    offered |= set() if dead else {"readiness", "queue", "kind"}
    offered |= {"parents_of", "children_of"}
    with CaptureQueriesContext(connection) as captured:
        response = viewer.get(url, {name: value})
    assert response.status_code in (200, 302, 400), (name, value, response.status_code)
    if name not in offered:
        assert response.status_code == 400, name
        assert pgjobs_reads(captured) == []


def statements_named(captured: CaptureQueriesContext, statement: str) -> int:
    first = statement.strip().splitlines()[0]
    return sum(1 for query in captured.captured_queries if query["sql"].startswith(first))


def test_run_now_for_every_job_matching_the_filter_asks_then_acts_in_batches_on_what_it_counted(
    admin_client: Client, jobs: dict[str, int]
) -> None:
    """Issue 26: "run now" filter-wide was one unconfirmed UPDATE of whatever matched."""
    from django_pgjobs.db import sql

    Job.objects.enqueue_many([{"kind": "bulk.t", "queue": "bulk", "delay": 3600}] * 1005)
    url = f"{JOBS}?queue=bulk"
    chosen = {"action": "run_now", "_selected_action": [jobs["report"]], "select_across": "1"}
    confirm = admin_client.post(url, chosen)
    assert confirm.status_code == 200
    assert "Run about 1,00" in confirm.content.decode()  # past the count's cap: an estimate
    assert count(where="queue = 'bulk' AND run_after <= now()") == 0  # nothing happened yet
    late = Job.objects.enqueue("bulk.t", queue="bulk", delay=3600).id  # after the count
    answer = {**chosen, "confirmed": "yes", "pgjobs_upto": confirm.context["upto"]}
    with CaptureQueriesContext(connection) as captured:
        done = admin_client.post(url, answer, follow=True)
    assert "1,005 jobs set to run now." in done.content.decode()
    assert statements_named(captured, sql.RUN_JOBS_NOW) == 2  # 1,000 then 5
    assert count(where="queue = 'bulk' AND run_after <= now()") == 1005
    assert seconds_from_now("run_after", late) > 3000  # not counted, not touched


def test_a_filter_wide_cancel_acts_only_on_the_jobs_its_confirmation_counted(
    admin_client: Client, jobs: dict[str, int]
) -> None:
    chosen = {"action": "cancel", "_selected_action": [jobs["report"]], "select_across": "1"}
    confirm = admin_client.post(f"{JOBS}?queue=billing", chosen)
    assert "Cancel 2 jobs, every one matching" in confirm.content.decode()
    late = Job.objects.enqueue("billing.report", {"n": 2}, queue="billing").id
    answer = {**chosen, "confirmed": "yes", "pgjobs_upto": confirm.context["upto"]}
    done = admin_client.post(f"{JOBS}?queue=billing", answer, follow=True)
    assert "2 jobs cancelled." in done.content.decode()
    assert count(where="queue = 'billing'") == 1 and row(late, "state") == ("pending",)


@pytest.mark.parametrize("action", ["run_now", "cancel"])
def test_a_filter_wide_answer_without_the_bound_it_was_shown_is_refused(
    admin_client: Client, jobs: dict[str, int], action: str
) -> None:
    forged = {
        "action": action,
        "_selected_action": [jobs["report"]],
        "select_across": "1",
        "confirmed": "yes",
    }
    response = admin_client.post(f"{JOBS}?queue=billing", forged, follow=True)
    assert "Refused: this confirmation does not say up to which job" in response.content.decode()
    assert count(where="queue = 'billing'") == 2
    assert seconds_from_now("run_after", jobs["keyed"]) > 3000


def snapshot() -> tuple[list[tuple[Any, ...]], list[tuple[Any, ...]]]:
    return (
        execute("SELECT id, state, run_after, attempts FROM pgjobs_job ORDER BY id"),
        execute("SELECT id, reason FROM pgjobs_dead ORDER BY id"),
    )


not_an_id = hostile_text.filter(lambda text: not (text.isascii() and text.isdigit()))


@settings(
    max_examples=80,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(
    action=st.sampled_from(["run_now", "cancel", "requeue", "delete_selected"]) | hostile_text,
    select_across=st.sampled_from(["1", "0", "", "on", "yes"]) | hostile_text,
    selected=st.lists(not_an_id, max_size=3),
    upto=not_an_id,
    answer=st.sampled_from(["yes", "no", ""]),
    dead=st.booleans(),
)
def test_hostile_action_posts_are_refused_change_nothing_and_never_give_a_500(
    admin_client: Client,
    jobs: dict[str, int],
    action: str,
    select_across: str,
    selected: list[str],
    upto: str,
    answer: str,
    dead: bool,
) -> None:
    """The rule at the action form: rows that are no ids, an unknown action, a filter-wide
    answer without the bound its confirmation showed: a confirmation page or a refusal,
    nothing changed, never a 500."""
    before = snapshot()
    form = {
        "action": action,
        "select_across": select_across,
        "_selected_action": selected,
        "pgjobs_upto": upto,
        "confirmed": answer,
    }
    response = admin_client.post(f"{DEAD if dead else JOBS}?queue=billing", form)
    assert response.status_code in (200, 302, 400), form
    assert snapshot() == before, form


@pytest.fixture
def dead_child() -> int:
    """A dead letter with a parent: the child a failed parent took with it (S30)."""
    from django_pgjobs.models import Dependency

    parent = Job.objects.enqueue("flow.parent", queue="flow").id
    child = Job.objects.enqueue("flow.child", queue="flow", after=[parent]).id
    Job.objects.claim_one("flow", "w").fail("parent broke")
    assert DeadJob.objects.filter(pk=child).exists()
    assert Dependency.objects.filter(child_id=child).exists()
    return child


def test_deleting_a_dead_letter_by_its_button_deletes_its_edges(
    admin_client: Client, dead_child: int
) -> None:
    """Issue 26: the dead letter went, its edges stayed in pgjobs_dependency (pruning
    deletes them with it)."""
    response = admin_client.post(act("deadjob", dead_child, "delete"), follow=True)
    assert "deleted." in response.content.decode()
    assert count("pgjobs_dead", "id = %s", [dead_child]) == 0
    assert count("pgjobs_dependency", "child_id = %s", [dead_child]) == 0


def test_deleting_dead_letters_by_the_action_asks_then_deletes_their_edges(
    admin_client: Client, dead_child: int
) -> None:
    chosen = {"action": "delete_selected", "_selected_action": [dead_child]}
    confirm = admin_client.post(DEAD, chosen)
    assert confirm.status_code == 200 and count("pgjobs_dead", "id = %s", [dead_child]) == 1
    done = admin_client.post(DEAD, {**chosen, "confirmed": "yes"}, follow=True)
    assert "1 dead letter deleted." in done.content.decode()
    assert count("pgjobs_dead", "id = %s", [dead_child]) == 0
    assert count("pgjobs_dependency", "child_id = %s", [dead_child]) == 0


def test_a_callbacks_page_shows_its_first_parents_with_their_count_and_a_link_to_all(
    admin_client: Client,
) -> None:
    """Issue 26: a callback's page rendered an edge per member of its batch (a batch of
    a million members: a page of a million links)."""
    from django_pgjobs.batches import Callback, batch

    with batch(on_complete=Callback("tests.plain")) as b:
        for n in range(30):
            b.add("tests.plain", value=n)
    (callback,) = b.callback_jobs
    members = sorted(member.id for member in b.members)
    page = admin_client.get(job_page(callback.id)).content.decode()
    linked = [m for m in members if f"'{job_page(m)}'" in page or f'"{job_page(m)}"' in page]
    assert linked == members[:20]  # the first by id, not all 30
    assert "Waits for 30 jobs" in page
    assert f"?parents_of={callback.id}" in page
    assert shown(admin_client, JOBS, parents_of=str(callback.id)) == set(members)
    assert shown(admin_client, DEAD, parents_of=str(callback.id)) == set()
    member_page = admin_client.get(job_page(members[0])).content.decode()
    assert "Waited for by 1 job" in member_page


def test_a_batchs_page_lists_its_members_paged_with_where_each_is_now(
    admin_client: Client,
) -> None:
    """Issue 29, item 9: the batch page lists its members (state, link, paged by the
    last id shown) while a callback keeps its edges, and each member's page links back."""
    from django_pgjobs.batches import Callback, batch
    from django_pgjobs.models import Batch

    with batch(on_complete=Callback("tests.plain")) as b:
        for n in range(55):
            b.add("tests.plain", value=n)
    members = sorted(member.id for member in b.members)
    page_url = reverse("admin:django_pgjobs_batch_change", args=[b.id])
    # Three members end three ways: done (acked, not kept), dead, and running.
    done = Job.objects.claim_one("default", "w:1:a")
    assert done is not None and done.id == members[0]
    done.ack()
    failed = Job.objects.claim_one("default", "w:1:a")
    assert failed is not None
    failed.fail(Failure("no"))
    running = Job.objects.claim_one("default", "w:1:a")
    assert running is not None

    first = admin_client.get(page_url).content.decode()
    rows = re.findall(r'class="pgjobs-member" data-job="(\d+)"', first)
    assert [int(r) for r in rows] == members[:50]
    assert f'href="{page_url}?after={members[49]}"' in first and "Next 50" in first
    member_row = re.search(rf'data-job="{members[0]}">(.*?)</tr>', first, re.S)
    assert member_row and "acked, not kept" in member_row[1] and ">done<" in member_row[1]
    assert f'href="{reverse("admin:django_pgjobs_deadjob_change", args=[failed.id])}"' in first
    assert f'href="{job_page(running.id)}"' in first
    dead_row = re.search(rf'data-job="{failed.id}">(.*?)</tr>', first, re.S)
    assert dead_row and "dead or cancelled" in dead_row[1]

    second = admin_client.get(page_url, {"after": members[49]}).content.decode()
    rows = re.findall(r'class="pgjobs-member" data-job="(\d+)"', second)
    assert [int(r) for r in rows] == members[50:] and "Next" not in second
    assert f'href="{page_url}">First page' in second
    assert "No member after" in admin_client.get(page_url, {"after": members[-1]}).content.decode()
    for hostile in ("-1", "x", "9" * 30, "\uff11", ""):
        assert admin_client.get(page_url, {"after": hostile}).status_code == 400, hostile
    assert Batch.objects.members(b.id, after=members[-2]) == Batch.objects.members(
        b.id, after=members[-2], limit=5
    )
    # A member's page links its batch.
    member_page = admin_client.get(job_page(members[5])).content.decode()
    assert page_url in member_page


@pytest.mark.parametrize("value", ["", "x", "-1", "0", "9" * 30, "\uff11"])  # a fullwidth 1
def test_the_edge_filters_take_only_job_ids(admin_client: Client, value: str) -> None:
    Job.objects.enqueue("tests.plain")
    for name in ("parents_of", "children_of"):
        for url in (JOBS, DEAD):
            listed = shown(admin_client, url, **{name: value})
            assert listed == set() or (not value and url == JOBS), (name, value)


def test_object_pages_give_exact_times_and_lists_relative_ones_with_the_exact_on_hover(
    admin_client: Client, jobs: dict[str, int]
) -> None:
    """Issue 29: object pages read "Dec. 1, 2026, 10 p.m." (no minutes, never seconds)."""
    exact = r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d [A-Z][A-Za-z0-9+-]*"
    page = admin_client.get(job_page(jobs["report"])).content.decode()
    created = re.search(r"Created at:</label>\s*<div class=\"readonly\">([^<]*)</div>", page)
    assert created and re.fullmatch(exact, created.group(1)), page
    assert "a.m." not in page and "p.m." not in page
    letter = admin_client.get(dead_page(jobs["failed"])).content.decode()
    assert re.search(rf"Died at:</label>\s*<div class=\"readonly\">{exact}</div>", letter)

    listed = admin_client.get(DEAD).content.decode()
    times = re.findall(r'<time datetime="([^"]+)" title="([^"]+)">([^<]+)</time>', listed)
    assert len(times) >= 6  # each letter's death, as an age, the exact time on hover
    for iso, title, shown in times:
        assert re.fullmatch(exact, title) and re.fullmatch(r"\d+ s ago", shown), (iso, title)


def test_a_job_held_by_a_gone_worker_says_when_its_lease_lapses_and_what_then(
    admin_client: Client, jobs: dict[str, int]
) -> None:
    """Issue 29: it said "running on host:1:abc" whether that worker lived or not."""
    page = admin_client.get(job_page(jobs["running"])).content.decode()
    said = re.search(r"<strong>(running on [^<]*)</strong>", page)
    assert said, page
    assert re.fullmatch(
        r"running on host:1:abc, a worker no longer registered: its lease lapses in \d+ s, "
        r"then it runs again \(attempt 2 of 10\)",
        said.group(1),
    )
    registered = {
        "host": "host",
        "pid": 1,
        "queues": ["media"],
        "concurrency": 1,
        "version": "t",
        "heartbeat_s": 5.0,
        "running": 1,
        "succeeded": 0,
        "failed": 0,
    }
    Worker.objects.heartbeat("host:1:abc", **registered)
    page = admin_client.get(job_page(jobs["running"])).content.decode()
    assert "<strong>running on host:1:abc</strong>" in page
    Worker.objects.stopped("host:1:abc", succeeded=0, failed=0)
    page = admin_client.get(job_page(jobs["running"])).content.decode()
    assert "running on host:1:abc, a worker that stopped 20" in page
    execute("UPDATE pgjobs_job SET claimed_until = now() - interval '5 s', attempts = 10")
    page = admin_client.get(job_page(jobs["running"])).content.decode()
    assert re.search(r"its lease lapsed \d+ s ago, then it is dead-lettered", page)


def test_a_job_page_leaves_out_what_it_does_not_have_and_labels_a_past_runs_progress(
    admin_client: Client, jobs: dict[str, int]
) -> None:
    """Issue 29: a healthy job's page led with "Last error: -", "Traceback: -", ...; a
    job handed back kept its old progress bar as if it ran."""
    healthy = admin_client.get(job_page(jobs["report"])).content.decode()
    for label in ("Last error:", "Traceback:", "Failed attempts:", "Progress:"):
        assert label not in healthy
    running = admin_client.get(job_page(jobs["running"])).content.decode()
    assert "Progress:" in running and "as its last run" not in running
    execute("UPDATE pgjobs_job SET state = 'pending', claimed_by = NULL WHERE id = %s",
            [jobs["running"]])  # fmt: skip
    handed_back = admin_client.get(job_page(jobs["running"])).content.decode()
    assert "as its last run (attempt 1) left it:" in handed_back
    failed = admin_client.get(dead_page(jobs["failed"])).content.decode()
    assert "Last error:" in failed and "Failed attempts:" in failed


def test_small_things_read_right(admin_client: Client, jobs: dict[str, int]) -> None:
    """Issue 29, item 10: the queue list's red crosses for "not paused", a job page's title
    said its name twice, messages began with a capitalised kind, a link to a job that
    was not kept ended in "Perhaps it was deleted?"."""
    QueueControl.objects.pause("media")
    queues = admin_client.get(reverse("admin:django_pgjobs_queuecontrol_changelist"))
    page = queues.content.decode()
    assert "icon-no.svg" not in page and "icon-yes.svg" not in page
    assert re.search(r'<strong class="pgjobs-paused">paused</strong> <time [^>]*>\d+ s ago', page)
    assert ">open<" in page  # billing: claimed as usual

    title = re.search(
        r"<title>([^<]*)</title>", admin_client.get(job_page(jobs["report"])).content.decode()
    )
    assert title and title.group(1).count(f"billing.report#{jobs['report']}") == 1

    done = admin_client.post(act("job", jobs["keyed"], "run_now"), follow=True).content.decode()
    assert f"Job billing.sync#{jobs['keyed']} set to run now." in done

    # A letter's id on the jobs' page leads to the letter, a requeued letter's to its job.
    moved = admin_client.get(job_page(jobs["failed"]))
    assert moved.status_code == 302 and moved["Location"] == dead_page(jobs["failed"])
    Job.objects.enqueue("ops.task", queue="ops")
    gone_id = Job.objects.claim_one("ops", "w").id
    execute("DELETE FROM pgjobs_job WHERE id = %s", [gone_id])  # done and not kept
    gone = admin_client.get(job_page(gone_id), follow=True).content.decode()
    assert f"Job #{gone_id} is no longer here: it ended and was not kept" in gone
    assert "Perhaps it was deleted?" not in gone


def test_a_job_page_has_a_timeline_of_its_attempts_and_of_what_people_did(
    admin_client: Client, jobs: dict[str, int]
) -> None:
    """Issue 29, item 11: enqueued, each attempt (its worker, how it ended, its error),
    how it ended, and each action from the console with who did it, oldest first."""

    def events(job_id: int) -> list[tuple[str, str]]:
        page = admin_client.get(job_page(job_id)).content.decode()
        table = re.search(r'<table class="pgjobs-timeline">(.*?)</table>', page, re.S)
        assert table, page
        return re.findall(
            r"<tr><td class=\"nowrap\">\d{4}-[^<]*</td><td class=\"nowrap\">([^<]*)</td>"
            r"<td>([^<]*)</td></tr>",
            table.group(1),
        )

    admin_client.post(act("deadjob", jobs["custom"], "requeue"))
    Job.objects.claim_one("ops", "host:3:ghi")
    assert events(jobs["custom"]) == [
        ("enqueued", "queue ops"),
        ("attempt 1 failed", "on host:2:def: RuntimeError: boom custom"),
        ("attempt 2 failed", "on host:2:def: the remote said no"),
        ("by admin", "Requeued, from the dead letters (the remote said no)."),
        ("attempt 1 claimed", "by host:3:ghi"),
    ]
    kept = Job.objects.enqueue("ops.task", queue="ops", result_retention=3600).id
    Job.objects.claim_one("ops", "host:4:jkl").ack({"ok": True})
    # (In the test's one transaction the claim and the ack share a clock: their order and
    # the run's length are not the database's to tell.)
    assert set(events(kept)) == {
        ("enqueued", "queue ops"),
        ("attempt 1 claimed", "by host:4:jkl"),
        ("attempt 1 done", "on host:4:jkl"),
    }

    # A hand-edited row's errors do not break the page.
    execute(
        """UPDATE pgjobs_job SET errors = '[{"at": "not a time"}, 7, {"at": "2026-02-30"},
        {"at": "2026-12-01T10:00:00", "attempt": "<b>", "error": "<script>"}]'::jsonb
        WHERE id = %s""",
        [jobs["report"]],
    )
    odd = admin_client.get(job_page(jobs["report"])).content.decode()
    assert "attempt &lt;b&gt; failed" in odd and "<script>" not in odd


def test_the_glance_folds_under_the_warnings_and_kinds_are_a_select(
    admin_client: Client, jobs: dict[str, int]
) -> None:
    """Issue 29, items 1 and 4: the first rows of a list came 1,000 px down, below the
    glance, its chart and a link per kind (the chaos run's own kinds too); "No live worker
    serves …" sat at the bottom of the dashboard."""
    for url in (JOBS, DEAD):
        page = admin_client.get(url).content.decode()
        glance = re.search(r'<details class="module pgjobs-glance" id="pgjobs-glance">', page)
        assert glance, page  # folded: no "open"
        summary = re.search(r'<span class="pgjobs-glance-summary">([^<]*)</span>', page)
        assert summary and re.fullmatch(
            r"\d+ queues · \d+ runnable · \d+ scheduled · \d+ running · \d+ dead"
            r"( · oldest runnable \d+ s)?",
            summary.group(1),
        ), summary
        warning = page.index('id="pgjobs-unserved"')  # billing, media, ops: no live worker
        assert "No live worker serves billing" in page and warning < glance.start()
        assert warning < page.index('id="result_list"')
        kinds = re.search(r'<select class="pgjobs-select-filter"[^>]*>(.*?)</select>', page, re.S)
        assert kinds and 'value="?kind=tests.record"' in kinds.group(1)
        assert "pgjobs.chaos" not in kinds.group(1)
    dashboard = admin_client.get(reverse("admin:django_pgjobs_dashboard_changelist"))
    page = dashboard.content.decode()
    assert page.index('id="pgjobs-unserved"') < page.index('id="pgjobs-queues"')
    assert '<ol class="breadcrumbs">' in page or '<div class="breadcrumbs">' in page
    data = admin_client.get(reverse("admin:django_pgjobs_dashboard_data")).json()
    assert "No live worker serves" in data["html"]["warnings"]


def test_a_dead_letter_row_says_why_in_a_chip_and_the_message_once(
    admin_client: Client, jobs: dict[str, int]
) -> None:
    """Issue 29, item 2: the reason and the last error in two cramped columns, a letter's
    message often twice."""
    page = admin_client.get(DEAD).content.decode()
    whys = set(
        re.findall(
            r'<td class="field-why"><span class="pgjobs-category">([^<]*)</span> '
            r'<span title="[^"]*">([^<]*)</span></td>',
            page,
        )
    )
    assert whys == {
        ("cancelled", ""),
        ("failed", "the remote said no"),
        ("failed", ""),  # Fail("failed"): the chip says it all
        ("max attempts exceeded", "RuntimeError: boom spent"),
        ("unknown kind", "unknown job kind &#x27;gone.away&#x27;"),
        (
            "payload does not fit",
            "payload does not fit the handler of x: missing a required argument: &#x27;y&#x27;",
        ),
    }
    assert "billing.<wbr>report" in admin_client.get(JOBS).content.decode()


def test_no_console_page_offers_to_edit_a_jobs_kind_payload_or_queue(
    admin_client: Client, jobs: dict[str, int]
) -> None:
    """Issue 29, item 16 (a peer's console let an operator edit a job's payload: code
    that the next run executes): the pages of jobs, letters, batches and workers have no
    field for them, and a POST to a job's page changes nothing."""
    pages = [
        job_page(jobs["report"]),
        dead_page(jobs["failed"]),
        reverse("admin:django_pgjobs_job_add"),
        reverse("admin:django_pgjobs_deadjob_add"),
    ]
    for url in pages:
        response = admin_client.get(url)
        assert response.status_code in (200, 403), url
        fields = re.findall(
            r'<(?:input|textarea|select)[^>]*name="([^"]+)"', response.content.decode()
        )
        assert not {"kind", "payload", "queue", "key", "priority"} & set(fields), (url, fields)
    before = row(jobs["report"], "kind", "payload", "queue")
    forged = {"kind": "os.system", "payload": '{"cmd": "rm -rf /"}', "queue": "x", "_save": "1"}
    response = admin_client.post(job_page(jobs["report"]), forged)
    assert response.status_code in (302, 403)
    assert row(jobs["report"], "kind", "payload", "queue") == before


def test_what_was_asked_of_a_worker_is_for_its_process_only() -> None:
    """A worker restarted under a fixed --worker-id must not read the stop asked of the
    process before it (it would stop again at once, each time); a stop is not taken
    back by "run again"."""
    me = {
        "host": "web-1",
        "pid": 10,
        "queues": ["default"],
        "concurrency": 1,
        "version": "t",
        "heartbeat_s": 5.0,
        "running": 0,
        "succeeded": 0,
        "failed": 0,
    }
    assert Worker.objects.heartbeat("web-1:fixed", **me).asked is None
    assert Worker.objects.ask(["web-1:fixed"], "quiet", by="alice") == ["web-1:fixed"]
    assert Worker.objects.heartbeat("web-1:fixed", **me).asked == "quiet"
    assert Worker.objects.heartbeat("web-1:fixed", **{**me, "pid": 11}).asked is None  # restarted
    Worker.objects.ask(["web-1:fixed"], "stop", by="alice")
    assert Worker.objects.ask(["web-1:fixed"], None, by="bob") == []  # not taken back
    assert Worker.objects.heartbeat("web-1:fixed", **{**me, "pid": 11}).asked == "stop"
    assert Worker.objects.stopped("web-1:fixed", succeeded=0, failed=0)
    assert Worker.objects.heartbeat("web-1:fixed", **{**me, "pid": 11}).asked is None  # stopped
    with pytest.raises(ValueError, match="'quiet', 'stop' or None"):
        Worker.objects.ask(["web-1:fixed"], "reboot", by="mallory")
