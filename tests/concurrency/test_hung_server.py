"""S43: a worker gives up on a database server that stops answering (a hung primary), and
never on a statement that is only slow.

The server "hangs" behind a TCP proxy that stops forwarding (tests/proxy.py): its sockets
stay open and new connections are taken without an answer, as with a SIGSTOPped primary
on a host whose kernel still answers for it. A worker through it:
tests/processes/test_hung_server.py; the rehearsal on real HA servers:
tests/processes/test_failover.py.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from datetime import timedelta
from typing import Any

import psycopg
import pytest
from django.core.exceptions import ImproperlyConfigured
from django.db import connection, connections
from django.test import override_settings

from django_pgjobs.conf import pgjobs_settings
from django_pgjobs.db.watchdog import Watchdog, connection_options, guarding
from django_pgjobs.testing.localdb import free_port
from tests.helpers import conninfo, wait_until
from tests.proxy import FreezableProxy

pytestmark = pytest.mark.django_db(transaction=True)


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
    probes: list[Any] = []
    answers = dog._answers

    def counted(peer: Any) -> bool:
        probes.append(peer)
        return answers(peer)

    dog._answers = counted  # type: ignore[method-assign]
    with through(proxy) as conn:
        dog.watch(conn)
        # Four times the watchdog's timeout: it probes, the server answers, it waits on,
        # and asks again no sooner than a timeout later (not at every check, 4 a second).
        outcome = in_thread(lambda: conn.execute("SELECT pg_sleep(4), 'done'").fetchone())
        assert outcome == ("", "done"), outcome
        assert conn.execute("SELECT 1").fetchone() == (1,)
    assert 1 <= len(probes) <= 4, probes


def test_s43_a_statement_is_timed_from_when_it_was_sent_not_from_the_last_answer(
    proxy: FreezableProxy,
) -> None:
    """A connection idle for longer than the timeout that starts a statement has not
    waited for the server that long: it asked a moment ago. No probe for it (a probe
    costs the server a process, and one the load delayed would cut a live server)."""
    dog = Watchdog(timeout=2)  # not started: the test calls check() itself
    probes: list[Any] = []

    def answers(peer: Any) -> bool:
        probes.append(peer)
        return True

    dog._answers = answers  # type: ignore[method-assign]
    with through(proxy) as conn:
        dog.watch(conn)
        time.sleep(2.5)  # idle: nothing received for longer than the timeout
        running = threading.Thread(target=lambda: conn.execute("SELECT pg_sleep(2)"))
        running.start()
        try:
            wait_until(conn.lock.locked, timeout=5, interval=0.01)
            time.sleep(0.2)
            assert dog.check() == [] and probes == []
        finally:
            running.join(10)
        # The same wait on a statement that has run past the timeout is probed.
        running = threading.Thread(target=lambda: conn.execute("SELECT pg_sleep(6)"))
        running.start()
        try:
            wait_until(conn.lock.locked, timeout=5, interval=0.01)
            time.sleep(2.8)
            assert dog.check() == [] and len(probes) == 1  # it answered: left alone
        finally:
            running.join(10)


def test_s43_a_closed_connection_is_forgotten_and_never_cut(
    proxy: FreezableProxy, dog: Watchdog
) -> None:
    conn = through(proxy)
    dog.watch(conn)
    conn.close()
    proxy.freeze()
    assert dog.check() == []


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
    # A host that takes the connection and never answers is left after the timeout;
    # libpq's least is 2 s, and a slow login (TLS, LDAP) still fits in 5.
    assert options["connect_timeout"] == 5 and connection_options(1)["connect_timeout"] == 2
    assert options["keepalives"] == 1 and options["keepalives_idle"] == 5
    assert options["keepalives_interval"] == 2 and options["keepalives_count"] == 3
    assert options["tcp_user_timeout"] == 15_000


def test_s43_a_guard_adds_libpq_timeouts_only_where_options_set_none_and_takes_them_back() -> None:
    options = connections.settings["default"].setdefault("OPTIONS", {})
    options["connect_timeout"] = 9  # the project's own: never touched
    try:
        with guarding(5):
            with guarding(timedelta(seconds=30)):  # nested: the first guard's timeout holds
                assert options["connect_timeout"] == 9
                assert options["tcp_user_timeout"] == 15_000
            assert options["keepalives"] == 1  # the outer guard still holds
        assert options == {"connect_timeout": 9}
    finally:
        options.pop("connect_timeout", None)


@pytest.mark.parametrize("value", [0, 0.5, -1, float("nan")])
def test_s43_a_guard_under_a_second_is_refused_and_changes_nothing(value: float) -> None:
    before = dict(connections.settings["default"].get("OPTIONS", {}))
    with pytest.raises(ValueError, match="at least 1 second"), guarding(value):
        pass
    assert connections.settings["default"].get("OPTIONS", {}) == before
