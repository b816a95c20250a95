"""Queues in databases of their own (PGJOBS["QUEUE_DATABASES"]): enqueues go to their
queue's database (enqueue_many split by database, in the jobs' order), a routed enqueue
inside another database's transaction says it is outside it, `runjobs --database` serves
one database's queues, `jobsctl status` shows every database. Three real databases, in
subprocesses with settings of their own (tests/settings_queue_databases.py)."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager

import psycopg
import pytest

from tests.example import scratch_database
from tests.spawn import ROOT, manage_py, suite_env

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]

ENQUEUE = """
import warnings
from django.db import transaction
from django_pgjobs.models import Job
from tests import jobs

jobs.record.using(queue="ingestion").enqueue(label="a")
Job.objects.enqueue("tests.record", {"label": "b"}, queue="purge")
jobs.record.enqueue(label="default")
many = Job.objects.enqueue_many(
    [{"kind": "tests.record", "payload": {"label": f"m{n}"}, "queue": queue}
     for n, queue in enumerate(["ingestion", "purge", "default", "ingestion"])]
)
with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    with transaction.atomic():  # the default database's transaction
        jobs.record.using(queue="ingestion").enqueue(label="outside")
    with transaction.atomic(using="jobs_a"):  # its own: no warning
        jobs.record.using(queue="ingestion").enqueue(label="inside")
print("warned", [w.category.__name__ for w in caught])
with transaction.atomic(using="jobs_a"):
    jobs.record.using(queue="ingestion").enqueue(label="rolled back")
    transaction.set_rollback(True, using="jobs_a")
print("order", [Job.objects.using(alias).filter(id=r.id).exists()
                for r, alias in zip(many, ["jobs_a", "jobs_b", "default", "jobs_a"])])
for alias in ("default", "jobs_a", "jobs_b"):
    print(alias, sorted(Job.objects.using(alias).values_list("queue", flat=True)))

from django_pgjobs.batches import Callback, batch
from django_pgjobs.exceptions import InvalidJobOption
from django_pgjobs.models import Batch
from django_pgjobs.workflows import workflow

ingestion = jobs.record.using(queue="ingestion")
with batch(on_complete=Callback(ingestion, label="batch done")) as b:
    b.add(ingestion, label="member")
print("batch in", [a for a in ("default", "jobs_a", "jobs_b") if Batch.objects.using(a).exists()])
try:
    with workflow() as wf:
        wf.add(ingestion, label="x")
        wf.add(jobs.record.using(queue="purge"), label="y")
except InvalidJobOption as error:
    print("workflow refused:", "several databases" in str(error))
try:
    Job.objects.enqueue_many([
        {"kind": "tests.record", "payload": {"label": "never"}},
        {"kind": "tests.record", "queue": "purge", "priority": 500},
    ])
except InvalidJobOption as error:
    print("nothing written:", "jobs[1]" in str(error), Job.objects.count())
"""


@contextmanager
def three_databases() -> Iterator[dict[str, str]]:
    with ExitStack() as stack:
        urls = [stack.enter_context(scratch_database()) for _ in range(3)]
        yield suite_env(
            "tests.settings_queue_databases",
            DATABASE_URL=urls[0],
            JOBS_A_URL=urls[1],
            JOBS_B_URL=urls[2],
        )


def test_queues_live_and_run_in_their_own_databases() -> None:
    with three_databases() as env:
        for alias in ("default", "jobs_a", "jobs_b"):
            manage_py(env, "migrate", "--run-syncdb", "--database", alias, "-v0")
        output = manage_py(env, "shell", "-c", ENQUEUE)
        assert "warned ['OutsideTransactionWarning']" in output
        assert "order [True, True, True, True]" in output
        assert "default ['default', 'default']" in output
        assert "jobs_a ['ingestion', 'ingestion', 'ingestion', 'ingestion', 'ingestion']" in (
            output
        )
        assert "jobs_b ['purge', 'purge']" in output
        assert "batch in ['jobs_a']" in output  # members and callback with their queue
        assert "workflow refused: True" in output
        assert "nothing written: True 2" in output  # default's two jobs only
        status = manage_py(env, "jobsctl", "status")
        assert "Database default" in status and "Database jobs_b" in status
        refused = subprocess.run(
            [sys.executable, "manage.py", "runjobs", "--burst", "--queue", "ingestion"],
            cwd=ROOT,
            env=env,
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert refused.returncode != 0 and "--database jobs_a" in refused.stderr
        for alias in ("default", "jobs_a", "jobs_b"):
            manage_py(env, "runjobs", "--database", alias, "--burst", "--no-status")
        with psycopg.connect(env["DATABASE_URL"]) as conn:
            notes = sorted(text for (text,) in conn.execute("SELECT text FROM tests_note"))
        expected = ["a", "b", "default", "m0", "m1", "m2", "m3", "outside", "inside"]
        assert notes == sorted([*expected, "member", "batch done"])
        for url in (env["DATABASE_URL"], env["JOBS_A_URL"], env["JOBS_B_URL"]):
            with psycopg.connect(url) as conn:
                assert conn.execute("SELECT count(*) FROM pgjobs_job").fetchone() == (0,)
        checked = subprocess.run(
            [sys.executable, "manage.py", "check"],
            cwd=ROOT,
            env=env,
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert checked.returncode == 0 and "pgjobs.I002" in checked.stderr
        assert "ingestion -> jobs_a" in checked.stderr


SAME_IDS = """
from django_pgjobs.models import Job
from tests import jobs

default = jobs.record.enqueue(label="default").id
routed = [jobs.record.using(queue="ingestion").enqueue(label=f"a{n}").id for n in range(2)]
claimed = Job.objects.claim_one("ingestion", "w-a", using="jobs_a").id
print("ids", default, routed, claimed)
"""


def jobsctl(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "manage.py", "jobsctl", *args],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_jobsctl_acts_on_the_database_of_the_queue_or_job_it_names() -> None:
    """Issue 26: `cancel 1` cancelled the main database's job 1 whatever the operator
    meant, and `running ingestion` read the main database. Each database numbers its
    jobs from 1: an id in several is refused with what to type."""
    with three_databases() as env:
        for alias in ("default", "jobs_a", "jobs_b"):
            manage_py(env, "migrate", "--run-syncdb", "--database", alias, "-v0")
        assert "ids 1 [1, 2] 1" in manage_py(env, "shell", "-c", SAME_IDS)

        for args in (["running", "ingestion"], ["running"]):
            shown = manage_py(env, "jobsctl", *args)
            lines = shown.splitlines()
            assert lines[0].split()[-1] == "database", shown
            assert lines[2].split()[:2] == ["1", "ingestion"] and "jobs_a" in lines[2], shown
        quiet = manage_py(env, "jobsctl", "running", "purge")
        assert quiet.strip() == "No job is running in purge (read database jobs_b)."

        ambiguous = jobsctl(env, "cancel", "1")
        assert ambiguous.returncode != 0
        assert "jobsctl cancel --database jobs_a 1" in ambiguous.stderr
        assert "Nothing was cancelled" in ambiguous.stderr

        only_a = manage_py(env, "jobsctl", "cancel", "2")
        assert only_a.startswith("Cancelled 1 of 1 job(s) in database jobs_a")
        named = manage_py(env, "jobsctl", "cancel", "--database", "jobs_a", "1")
        assert named.startswith("Cancelled 1 of 1 job(s) in database jobs_a")
        unknown = jobsctl(env, "cancel", "--database", "nosuch", "1")
        assert unknown.returncode != 0 and "default, jobs_a, jobs_b" in unknown.stderr

        with psycopg.connect(env["DATABASE_URL"]) as conn:
            assert conn.execute("SELECT id, state FROM pgjobs_job").fetchall() == [(1, "pending")]
            assert conn.execute("SELECT count(*) FROM pgjobs_dead").fetchone() == (0,)
        with psycopg.connect(env["JOBS_A_URL"]) as conn:
            assert conn.execute("SELECT count(*) FROM pgjobs_job").fetchone() == (0,)
            dead = conn.execute("SELECT id, reason FROM pgjobs_dead ORDER BY id").fetchall()
            assert dead == [(1, "cancelled"), (2, "cancelled")]


LETTERS = """
from django_pgjobs.models import Job

for queue, alias in (("ingestion", "jobs_a"), ("default", "default"), ("ingestion", "jobs_a")):
    job_id = Job.objects.enqueue("billing.charge", {}, queue=queue).id
    handle = Job.objects.claim_one(queue, "w", using=alias)
    assert handle.id == job_id and handle.fail("declined")
    print("letter", alias, job_id)
"""


def test_jobsctl_dead_requeue_and_pause_act_on_the_database_they_name() -> None:
    """Issue 31.5: the new commands act on the database of the queue or the letter they
    name, read every database otherwise, and say which."""
    import json

    with three_databases() as env:
        for alias in ("default", "jobs_a", "jobs_b"):
            manage_py(env, "migrate", "--run-syncdb", "--database", alias, "-v0")
        shown = manage_py(env, "shell", "-c", LETTERS)
        assert "letter jobs_a 1" in shown and "letter default 1" in shown
        assert "letter jobs_a 2" in shown

        lines = manage_py(env, "jobsctl", "dead").splitlines()
        assert lines[0].split() == ["id", "kind", "queue", "reason", "died", "database"]
        assert sorted((line.split()[0], line.split()[-1]) for line in lines[2:]) == [
            ("1", "default"),
            ("1", "jobs_a"),
            ("2", "jobs_a"),
        ]
        routed = json.loads(manage_py(env, "jobsctl", "dead", "--queue", "ingestion", "--json"))
        assert routed["databases"] == ["jobs_a"]
        assert sorted(each["id"] for each in routed["letters"]) == [1, 2]
        assert {each["database"] for each in routed["letters"]} == {"jobs_a"}

        ambiguous = jobsctl(env, "requeue", "1")
        assert ambiguous.returncode != 0, ambiguous.stdout
        assert "jobsctl requeue --database jobs_a 1" in ambiguous.stderr
        assert "Nothing was requeued" in ambiguous.stderr
        assert manage_py(env, "jobsctl", "requeue", "2").startswith(
            "Requeued 1 of 1 job(s) in database jobs_a: back to pending"
        )
        assert manage_py(env, "jobsctl", "requeue", "--database", "jobs_a", "1").startswith(
            "Requeued 1 of 1 job(s) in database jobs_a"
        )
        nothing = jobsctl(env, "requeue", "--all", "--queue", "ingestion")
        assert nothing.returncode != 0
        assert (
            "No dead letter of queue 'ingestion' (read database jobs_a): nothing was requeued"
            in nothing.stderr
        )
        missing = jobsctl(env, "requeue", "7")
        assert missing.returncode != 0
        assert (
            "No dead letter has the id 7 (read database default, database jobs_a, database "
            "jobs_b): nothing was requeued." in missing.stderr
        )
        assert manage_py(env, "jobsctl", "requeue", "--all").strip() == (
            "Requeued 1 dead letter in database default: back to pending with fresh attempts."
        )

        assert manage_py(env, "jobsctl", "pause", "purge").startswith(
            "Paused purge in database jobs_b:"
        )
        unknown = jobsctl(env, "pause", "nosuch")
        assert unknown.returncode != 0
        assert "databases default, jobs_a, jobs_b hold no job" in unknown.stderr
        status = json.loads(manage_py(env, "jobsctl", "status", "--json"))
        by_database = {each["database"]: each for each in status["databases"]}
        assert list(by_database) == ["default", "jobs_a", "jobs_b"]
        assert [q["queue"] for q in by_database["jobs_b"]["queues"]] == ["purge"]
        assert by_database["jobs_b"]["queues"][0]["paused"] is True
        ingestion = by_database["jobs_a"]["queues"][0]
        assert (ingestion["queue"], ingestion["runnable"], ingestion["dead"]) == ("ingestion", 2, 0)
        running = json.loads(manage_py(env, "jobsctl", "running", "--json"))
        assert running == {"databases": ["default", "jobs_a", "jobs_b"], "jobs": [], "more": False}

        with psycopg.connect(env["JOBS_A_URL"]) as conn:
            assert conn.execute("SELECT count(*) FROM pgjobs_dead").fetchone() == (0,)
            assert conn.execute("SELECT count(*) FROM pgjobs_job").fetchone() == (2,)
