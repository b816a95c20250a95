"""S43: a worker gives up on a database server that stops answering (a hung primary), and
never on a statement that is only slow.

The server "hangs" behind a TCP proxy that stops forwarding (tests/proxy.py): its sockets
stay open and new connections are taken without an answer, as with a SIGSTOPped primary
on a host whose kernel still answers for it. The rehearsal on real HA servers is in
tests/processes/test_failover.py.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from datetime import timedelta
from typing import Any

import psycopg
import pytest
from django.core.exceptions import ImproperlyConfigured
from django.db import connection
from django.test import override_settings

from django_pgjobs.conf import pgjobs_settings
from django_pgjobs.db.watchdog import Watchdog, connection_options
from django_pgjobs.models import Job
from django_pgjobs.testing.localdb import free_port
from tests.helpers import conninfo, count, execute
from tests.proxy import FreezableProxy, freezable_proxy
from tests.spawn import Workers, database_url_for_workers, wait_for

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def proxy() -> Iterator[FreezableProxy]:
    settings = connection.settings_dict
    with freezable_proxy(settings["HOST"] or "127.0.0.1", int(settings["PORT"] or 5432)) as p:
        yield p


@pytest.fixture
def dog() -> Iterator[Watchdog]:
    watchdog = Watchdog(timeout=1)
    watchdog.start()
    yield watchdog
    watchdog.stop()


def through(proxy: FreezableProxy) -> psycopg.Connection[Any]:
    return psycopg.connect(
        **{**conninfo(), "host": "127.0.0.1", "port": proxy.port}, autocommit=True
    )


def in_thread(call: Any) -> Any:
    """What `call()` returned or raised, waited for at most 60 s (a hang fails the test)."""
    outcome: list[Any] = []

    def run() -> None:
        try:
            outcome.append(call())
        except Exception as error:
            outcome.append(error)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    thread.join(60)
    assert outcome, "the call still waits after 60 s"
    return outcome[0]


def test_s43_a_statement_on_a_frozen_server_fails_and_other_servers_are_left_alone(
    proxy: FreezableProxy, dog: Watchdog
) -> None:
    frozen, idle, direct = through(proxy), through(proxy), psycopg.connect(**conninfo())
    for conn in (frozen, idle, direct):
        dog.watch(conn)
    proxy.freeze()
    outcome = in_thread(lambda: frozen.execute("SELECT 1").fetchone())
    assert isinstance(outcome, psycopg.OperationalError), outcome
    # Every connection to that server is cut, idle ones too (the LISTEN line) ...
    proxy.thaw()
    assert isinstance(in_thread(lambda: idle.execute("SELECT 1")), psycopg.OperationalError)
    # ... and none to another server.
    assert direct.execute("SELECT 1").fetchone() == (1,)
    # The server itself was never at fault: a new connection works.
    with through(proxy) as fresh:
        assert fresh.execute("SELECT 1").fetchone() == (1,)
    for conn in (frozen, idle, direct):
        conn.close()


def test_s43_a_slow_statement_on_a_server_that_answers_runs_to_its_end(
    proxy: FreezableProxy, dog: Watchdog
) -> None:
    with through(proxy) as conn:
        dog.watch(conn)
        # Three times the watchdog's timeout: it probes, the server answers, it waits on.
        outcome = in_thread(lambda: conn.execute("SELECT pg_sleep(3), 'done'").fetchone())
        assert outcome == ("", "done"), outcome
        assert conn.execute("SELECT 1").fetchone() == (1,)


def test_s43_a_closed_connection_is_forgotten_and_never_cut(
    proxy: FreezableProxy, dog: Watchdog
) -> None:
    conn = through(proxy)
    dog.watch(conn)
    conn.close()
    proxy.freeze()
    assert dog.check(0.0) == [] and dog.check(10.0) == []


def test_s43_the_probe_hears_a_live_server_and_nothing_from_a_frozen_or_gone_one(
    dog: Watchdog, proxy: FreezableProxy
) -> None:
    """The probe is PostgreSQL's SSL request, which a server answers before any login (so
    it answers one out of connections too): through the proxy, and straight to it."""
    settings = connection.settings_dict
    server = (settings["HOST"] or "127.0.0.1", int(settings["PORT"] or 5432))
    assert dog._answers(server)
    assert dog._answers(("127.0.0.1", proxy.port))
    assert not dog._answers(("127.0.0.1", free_port()))  # nobody listens
    proxy.freeze()
    assert not dog._answers(("127.0.0.1", proxy.port))


@pytest.mark.slow
def test_s43_a_worker_whose_server_hangs_reconnects_to_the_next_host_and_drains(
    proxy: FreezableProxy,
) -> None:
    """The worker's URL lists the proxy first, then the server itself (a multi-host URL,
    as after a failover: the old primary first). Frozen mid-drain, the worker gives up on
    it, skips it when it reconnects (connect_timeout) and drains on the other."""
    direct = database_url_for_workers()
    scheme, _, rest = direct.partition("://")
    auth, _, location = rest.rpartition("@")
    hosts, _, name = location.partition("/")
    url = f"{scheme}://{auth}@127.0.0.1:{proxy.port},{hosts}/{name}?target_session_attrs=read-write"
    Job.objects.enqueue_many([{"kind": "tests.record", "payload": {"sleep": 0.05}}] * 40)
    workers = Workers()
    try:
        worker = workers.start("--concurrency", "2", extra_env={"DATABASE_URL": url})
        wait_for(lambda: count("tests_note") >= 5, timeout=60, what="jobs run through the proxy")
        proxy.freeze()
        Job.objects.enqueue_many([{"kind": "tests.record"}] * 20)
        wait_for(
            lambda: count() == 0,
            timeout=90,
            interval=0.2,
            what="every job run, the last ones on the server itself",
        )
        assert "taking it for hung" in worker.output()
        proxy.thaw()
        worker.signal(15)
        assert worker.wait(60) == 0, worker.output()
    finally:
        workers.close()
    noted = execute("SELECT count(DISTINCT job_id) FROM tests_note")[0][0]
    assert noted == 60
    assert count() == 0, execute("SELECT id, state, attempts FROM pgjobs_job")


@pytest.mark.parametrize("value", [0, 0.5, -3, "5", float("nan"), timedelta(0), True])
def test_s43_a_hung_server_timeout_under_a_second_or_not_a_duration_is_refused(
    value: Any,
) -> None:
    with (
        override_settings(PGJOBS={"HUNG_SERVER_TIMEOUT": value}),
        pytest.raises(ImproperlyConfigured, match="HUNG_SERVER_TIMEOUT"),
    ):
        pgjobs_settings.validate()


def test_s43_the_worker_connections_libpq_timeouts_follow_the_hung_server_timeout() -> None:
    options = connection_options(5)
    assert options["connect_timeout"] == 2  # libpq's least: the next host soon after
    assert options["keepalives"] == 1 and options["keepalives_idle"] == 5
    assert options["tcp_user_timeout"] == 15_000
    assert connection_options(60)["connect_timeout"] == 20
