"""Let no one in where they don't belong: the metrics view behind a token or a staff
login, its scrapes cached, and the deploy checks that warn about open doors (pgjobs.W010,
W011, W012). The worker's metrics server and a least-privilege role: processes/."""

from __future__ import annotations

import base64
import hmac
import re
from typing import Any

import pytest
from django.contrib.auth.models import User
from django.core import checks
from django.db import connection
from django.test import Client, override_settings
from django.test.utils import CaptureQueriesContext

from django_pgjobs import metrics
from django_pgjobs.models import Job

pytestmark = pytest.mark.django_db

TOKEN = "a-scrape-token-of-some-length"
URL = "/metrics/pgjobs"


@pytest.fixture(autouse=True)
def fresh_scrapes() -> None:
    metrics.scrapes.forget()


def basic(user: str, password: str) -> str:
    return "Basic " + base64.b64encode(f"{user}:{password}".encode()).decode()


@pytest.fixture
def with_token() -> Any:
    with override_settings(PGJOBS={"METRICS_TOKEN": TOKEN}):
        yield


@pytest.mark.usefixtures("with_token")
class TestTheMetricsView:
    def test_an_anonymous_request_is_refused_and_told_what_to_send(self, client: Client) -> None:
        response = client.get(URL)
        assert response.status_code == 401
        assert response["WWW-Authenticate"].startswith("Bearer")
        assert "METRICS_TOKEN" in response.content.decode()
        assert "pgjobs_jobs" not in response.content.decode()

    @pytest.mark.parametrize(
        "authorization",
        [f"Bearer {TOKEN}", f"bearer   {TOKEN} ", basic("prometheus", TOKEN), basic("", TOKEN)],
    )
    def test_the_token_is_accepted_as_bearer_or_basic_auth(
        self, client: Client, authorization: str
    ) -> None:
        Job.objects.enqueue("demo.t", queue="watched")
        response = client.get(URL, HTTP_AUTHORIZATION=authorization)
        assert response.status_code == 200
        assert 'pgjobs_jobs{queue="watched",state="runnable"} 1.0' in response.content.decode()

    @pytest.mark.parametrize(
        "authorization",
        [
            "Bearer wrong-token-of-some-length",
            f"Bearer {TOKEN[:-1]}",
            f"Bearer {TOKEN}x",
            f"Token {TOKEN}",
            basic(TOKEN, "not-it"),
            "Basic !!!not base64",
            "Bearer \u00e9\u00e9",
            "",
        ],
    )
    def test_a_wrong_token_is_refused(self, client: Client, authorization: str) -> None:
        assert client.get(URL, HTTP_AUTHORIZATION=authorization).status_code == 401

    def test_the_token_is_compared_in_constant_time(
        self, client: Client, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        compared: list[tuple[Any, Any]] = []
        real = hmac.compare_digest

        def spy(a: Any, b: Any) -> bool:
            compared.append((a, b))
            return real(a, b)

        monkeypatch.setattr(hmac, "compare_digest", spy)
        assert client.get(URL, HTTP_AUTHORIZATION="Bearer guess").status_code == 401
        assert client.get(URL, HTTP_AUTHORIZATION=f"Bearer {TOKEN}").status_code == 200
        assert compared == [(b"guess", TOKEN.encode()), (TOKEN.encode(), TOKEN.encode())]

    def test_a_session_that_may_view_jobs_may_read_and_others_may_not(self, client: Client) -> None:
        """Issue 26: any staff user could read them, whatever their permissions."""
        from django.contrib.auth.models import Permission

        plain = User.objects.create_user("reader", password="pw")
        client.force_login(plain)
        assert client.get(URL).status_code in (401, 403)
        staff = User.objects.create_user("operator", password="pw", is_staff=True)
        client.force_login(staff)
        refused = client.get(URL)
        assert refused.status_code == 403
        assert "permission to view jobs" in refused.content.decode()
        assert "pgjobs_jobs" not in refused.content.decode()
        staff.user_permissions.set(Permission.objects.filter(codename="view_job"))
        client.force_login(User.objects.get(pk=staff.pk))  # a fresh permission cache
        assert client.get(URL).status_code == 200
        viewer = User.objects.create_user("viewer", password="pw")  # not staff: no admin
        viewer.user_permissions.set(Permission.objects.filter(codename="view_job"))
        client.force_login(viewer)
        assert client.get(URL).status_code == 403
        client.force_login(User.objects.create_superuser("boss", password="pw"))
        assert client.get(URL).status_code == 200

    def test_a_flood_of_scrapes_costs_one_overview(self, client: Client) -> None:
        Job.objects.enqueue("demo.t", queue="flooded")
        with (
            override_settings(PGJOBS={"METRICS_TOKEN": TOKEN, "METRICS_CACHE": 60}),
            CaptureQueriesContext(connection) as captured,
        ):
            bodies = {
                client.get(URL, HTTP_AUTHORIZATION=f"Bearer {TOKEN}").content for _ in range(20)
            }
        overviews = [q for q in captured.captured_queries if "Per queue: runnable" in q["sql"]]
        assert len(overviews) == 1 and len(bodies) == 1


@override_settings(PGJOBS={"METRICS_PUBLIC": True})
def test_metrics_public_opens_the_view_to_anyone(client: Client) -> None:
    assert client.get(URL).status_code == 200


def deploy_messages(**kwargs: Any) -> dict[str, str]:
    found = checks.run_checks(include_deployment_checks=True, tags=[checks.Tags.security], **kwargs)
    return {message.id: message.msg for message in found if message.id.startswith("pgjobs.")}


def test_checks_warn_about_public_metrics_and_an_open_worker_address() -> None:
    with override_settings(PGJOBS={"METRICS_PUBLIC": True}):
        assert "pgjobs.W010" in deploy_messages()
    with override_settings(PGJOBS={"METRICS_ADDR": "0.0.0.0"}):
        assert "0.0.0.0" in deploy_messages()["pgjobs.W011"]
    with override_settings(PGJOBS={"METRICS_ADDR": "0.0.0.0", "METRICS_TOKEN": TOKEN}):
        assert "pgjobs.W011" not in deploy_messages()
    assert {"pgjobs.W010", "pgjobs.W011"}.isdisjoint(deploy_messages())


def test_checks_warn_about_a_jobs_role_that_can_do_more_than_rows() -> None:
    from django_pgjobs.db.connection import role_privileges

    name, superuser, create_role, create_db = role_privileges("default")
    found = deploy_messages(databases=["default"])
    if superuser or create_role or create_db:
        assert name in found["pgjobs.W012"]
    else:
        assert "pgjobs.W012" not in found
    # `manage.py check --deploy` asks the database only when given --database.
    assert "pgjobs.W012" not in command_output("check", "--deploy")
    with_database = command_output("check", "--deploy", "--database", "default")
    assert ("pgjobs.W012" in with_database) == bool(superuser or create_role or create_db)


def command_output(*args: str) -> str:
    from io import StringIO

    from django.core.management import call_command

    out, err = StringIO(), StringIO()
    call_command(*args, stdout=out, stderr=err)
    return out.getvalue() + err.getvalue()


@pytest.mark.parametrize("token", ["short", 12345, ""])
def test_a_token_too_short_to_be_a_secret_is_a_settings_error(token: Any) -> None:
    from django.core.exceptions import ImproperlyConfigured

    from django_pgjobs.conf import pgjobs_settings

    with (
        override_settings(PGJOBS={"METRICS_TOKEN": token}),
        pytest.raises(ImproperlyConfigured, match="METRICS_TOKEN"),
    ):
        pgjobs_settings.validate()


def test_the_least_privilege_snippet_grants_every_table_and_sequence_of_the_app() -> None:
    """A table left out of the docs' role is a worker that fails where it writes it (the
    registry, the per-kind counts, a rate limit, a batch), so every one is named."""
    from django.apps import apps

    from tests.processes.test_security import least_privilege_snippet

    snippet = least_privilege_snippet()
    tables = {model._meta.db_table for model in apps.get_app_config("django_pgjobs").get_models()}
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT c.relname FROM pg_class AS c JOIN pg_depend AS d ON d.objid = c.oid"
            " JOIN pg_class AS t ON t.oid = d.refobjid"
            " WHERE c.relkind = 'S' AND t.relname = ANY(%s)",
            [sorted(tables)],
        )
        sequences = {name for (name,) in cursor.fetchall()}
    assert sequences, "the app's tables have sequences"
    named = set(re.findall(r"\bpgjobs_\w+", snippet))
    assert (tables | sequences) - named == set()
