"""S43: how long a connection has waited for its server, read from the kernel's TCP_INFO.

The watchdog against real sockets and a frozen server: tests/concurrency/test_hung_server.py.
"""

from __future__ import annotations

import struct

from hypothesis import given
from hypothesis import strategies as st

from django_pgjobs.db.watchdog import waited_ms

MS = st.integers(min_value=0, max_value=2**32 - 1)


def tcp_info(*, retransmits: int = 0, since_sent: int, since_received: int) -> bytes:
    """A Linux struct tcp_info of 104 bytes with the fields the watchdog reads."""
    info = bytearray(104)
    info[2] = retransmits
    struct.pack_into("I", info, 44, since_sent)
    struct.pack_into("I", info, 52, since_received)
    return bytes(info)


def test_s43_a_statement_sent_now_on_a_connection_idle_for_a_minute_has_not_waited() -> None:
    assert waited_ms(tcp_info(since_sent=3, since_received=60_000)) == 3


def test_s43_a_statement_the_server_took_and_never_answered_waits_from_its_sending() -> None:
    # A frozen server whose kernel acknowledges the statement: no resends.
    assert waited_ms(tcp_info(since_sent=7_000, since_received=67_000)) == 7_000


def test_s43_resends_to_a_host_that_answers_nothing_are_not_sending() -> None:
    """The kernel resends unacknowledged data with growing gaps, each a "send": timed
    from the last one, a dead host would seem to be waited on for the last gap only."""
    info = tcp_info(retransmits=3, since_sent=400, since_received=6_000)
    assert waited_ms(info) == 6_000


@given(retransmits=st.integers(0, 255), since_sent=MS, since_received=MS)
def test_s43_the_wait_is_never_longer_than_the_silence_nor_shorter_than_asked(
    retransmits: int, since_sent: int, since_received: int
) -> None:
    waited = waited_ms(
        tcp_info(retransmits=retransmits, since_sent=since_sent, since_received=since_received)
    )
    assert waited is not None and waited <= since_received
    assert waited == (since_received if retransmits else min(since_sent, since_received))


@given(st.binary(max_size=55))
def test_s43_a_tcp_info_too_short_to_say_says_nothing(info: bytes) -> None:
    assert waited_ms(info) is None
