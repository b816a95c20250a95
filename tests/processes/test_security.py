"""Safe defaults where processes meet the network and the database: a worker's metrics
server closed to the network unless a token guards it, a worker and the admin that run
under the least-privilege role of docs/explanation/security.md, and the example project's views that
answer bad input with a 400."""

from __future__ import annotations

import re
import secrets
import urllib.error
import urllib.request
from collections.abc import Iterator

import pytest
from django.db import connection
from psycopg import sql as pgsql

from django_pgjobs.models import DeadJob, Job
from django_pgjobs.testing.localdb import free_port
from tests.example import manage
from tests.helpers import count, dead_row, drop_dead_range_partitions, other_connection, row
from tests.spawn import ROOT, Workers, database_url_for_workers, manage_py, suite_env, wait_for

pytestmark = pytest.mark.django_db(transaction=True)

TOKEN = "a-metrics-token-for-the-worker"


def get(url: str, token: str | None = None) -> int:
    request = urllib.request.Request(url)
    if token is not None:
        request.add_header("Authorization", f"Bearer {token}")
    try:
        with urllib.request.urlopen(request, timeout=2) as page:
            return int(page.status)
    except urllib.error.HTTPError as error:
        return int(error.code)
    except OSError:
        return 0


def test_a_worker_will_not_open_its_metrics_to_the_network_without_a_token(
    workers: Workers,
) -> None:
    process = workers.start("--metrics-port", str(free_port()), "--metrics-addr", "0.0.0.0")
    assert process.wait(30) != 0
    assert "METRICS_TOKEN" in process.output() and "127.0.0.1" in process.output()


@pytest.mark.slow
def test_a_worker_with_a_token_asks_every_scrape_for_it(workers: Workers) -> None:
    port = free_port()
    process = workers.start("--metrics-port", str(port), extra_env={"PGJOBS_METRICS_TOKEN": TOKEN})
    url = f"http://127.0.0.1:{port}/metrics"
    wait_for(lambda: get(url, TOKEN) == 200, what="the metrics server")
    assert get(url) == 401
    assert get(url, "wrong-token") == 401
    assert process.process.poll() is None


def least_privilege_snippet() -> str:
    """The SQL of docs/explanation/security.md's 'A least-privilege role', as users copy it."""
    text = (ROOT / "docs" / "explanation" / "security.md").read_text()
    section = text.split("## A least-privilege role", 1)[1]
    match = re.search(r"```sql\n(.*?)```", section, re.S)
    assert match, "docs/explanation/security.md lost its least-privilege snippet"
    return match.group(1)


@pytest.fixture
def least_privileged_url() -> Iterator[str]:
    """The docs' role made on the test database (and the Django tables the admin needs,
    as the docs say to grant); yields a DATABASE_URL that logs in as it."""
    role = f"pgjobs_app_{secrets.token_hex(4)}"
    password = secrets.token_urlsafe(12)
    database = connection.settings_dict["NAME"]
    snippet = (
        least_privilege_snippet()
        .replace("pgjobs_app", role)
        .replace("change-me", password)
        .replace("mydb", f'"{database}"')
    )
    with other_connection() as owner:
        owner.execute(snippet)
        django_tables = [
            name
            for (name,) in owner.execute(
                "SELECT relname FROM pg_class WHERE relkind = 'r' AND "
                "(relname LIKE 'auth\\_%' OR relname LIKE 'django\\_%') "
                "AND relnamespace = 'public'::regnamespace"
            ).fetchall()
        ]
        django_sequences = [
            name
            for (name,) in owner.execute(
                "SELECT relname FROM pg_class WHERE relkind = 'S' AND "
                "(relname LIKE 'auth\\_%' OR relname LIKE 'django\\_%') "
                "AND relnamespace = 'public'::regnamespace"
            ).fetchall()
        ]
        owner.execute(
            pgsql.SQL("GRANT SELECT, INSERT, UPDATE, DELETE ON {} TO {}").format(
                pgsql.SQL(", ").join(map(pgsql.Identifier, django_tables)),
                pgsql.Identifier(role),
            )
        )
        owner.execute(
            pgsql.SQL("GRANT USAGE ON SEQUENCE {} TO {}").format(
                pgsql.SQL(", ").join(map(pgsql.Identifier, django_sequences)),
                pgsql.Identifier(role),
            )
        )
    base = database_url_for_workers()
    url = re.sub(r"^postgresql://[^@/]*@", f"postgresql://{role}:{password}@", base)
    if "@" not in base.split("//", 1)[1].split("/", 1)[0]:
        url = base.replace("postgresql://", f"postgresql://{role}:{password}@", 1)
    try:
        yield url
    finally:
        with other_connection() as owner:
            owner.execute(pgsql.SQL("DROP OWNED BY {}").format(pgsql.Identifier(role)))
            owner.execute(pgsql.SQL("DROP ROLE {}").format(pgsql.Identifier(role)))


ADMIN_SCRIPT = """
from django.contrib.auth.models import User
from django.test import Client
from django.test.utils import setup_test_environment
from django_pgjobs.models import DeadJob

setup_test_environment()  # the test client's host, allowed
operator = User.objects.create_superuser("operator", password="pw")
client = Client()
client.force_login(operator)
for name in ("job", "deadjob", "queuecontrol", "schedule"):
    page = client.get(f"/admin/django_pgjobs/{name}/")
    print(name, page.status_code)
letter = DeadJob.objects.get()
done = client.post(
    "/admin/django_pgjobs/deadjob/",
    {"action": "requeue", "_selected_action": [letter.pk]},
    follow=True,
)
print("requeue", done.status_code, "requeued" in done.content.decode())
"""


@pytest.mark.slow
def test_a_worker_and_the_admin_run_under_the_documented_least_privilege_role(
    workers: Workers, least_privileged_url: str
) -> None:
    drop_dead_range_partitions()  # the role's sweep makes them again
    done = Job.objects.enqueue("tests.plain", {"value": 4}, result_retention=60).id
    doomed = Job.objects.enqueue("tests.misbehave", {"how": "fail"}).id
    worker = workers.start(
        "--burst", "--sweep-interval", "1", extra_env={"DATABASE_URL": least_privileged_url}
    )
    assert worker.wait(60) == 0, worker.output()
    # The sweeper makes the dead-letter table's partitions as its owner (S44).
    swept = manage_py({**suite_env(), "DATABASE_URL": least_privileged_url}, "sweepjobs")
    assert re.search(r"partitions made [1-9][0-9]* and dropped 0", swept), swept
    assert any(partition.upper is not None for partition in DeadJob.objects.partitions())
    assert row(done, "state", "result") == ("done", 8)
    assert dead_row(doomed, "reason") == ("hopeless",)
    output = manage_py(
        {**suite_env(), "DATABASE_URL": least_privileged_url}, "shell", "-c", ADMIN_SCRIPT
    )
    assert "job 200" in output and "deadjob 200" in output
    assert "queuecontrol 200" in output and "schedule 200" in output
    assert "requeue 200 True" in output
    assert count(where="id = %s AND state = 'pending'", params=[doomed]) == 1


BAD_INPUTS = """
from django.test import Client

client = Client(SERVER_NAME="127.0.0.1")
for path, data in [
    ("/purge/", {"old_events": "lots"}),
    ("/purge/", {"old_events": "100000000"}),
    ("/purge/", {"batch": "0"}),
    ("/replay/", {"session_id": "abc"}),
    ("/replay/", {"session_id": "99999999999999999999999"}),
    ("/sessions/", {"name": "x" * 500}),
    ("/documents/", {"title": "t" * 500}),
]:
    response = client.post(path, data)
    print(path, response.status_code, response.content.decode().strip().replace(chr(10), " "))
print("fine", client.post("/purge/", {"old_events": "3", "batch": "5"}).status_code)
"""


@pytest.mark.slow
def test_the_example_answers_bad_input_with_a_400_and_a_message(example_database: str) -> None:
    manage(example_database, "migrate", "--verbosity", "0")
    output = manage(example_database, "shell", "-c", BAD_INPUTS)
    lines = [line for line in output.splitlines() if line.startswith("/")]
    assert len(lines) == 7
    assert all(" 400 Bad input: " in line for line in lines), output
    assert "old_events" in lines[0] and "session_id" in lines[3]
    assert "fine 302" in output
