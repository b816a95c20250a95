"""Statements of the wake-up line (S23): LISTEN, and the probe that tells whether
notifications arrive on it."""

from __future__ import annotations

LISTEN_CHANNEL = """
-- Subscribe this connection to the wake-up channel (S23); {channel} is an identifier.
LISTEN {channel}
"""

PROBE_LISTENER = """
-- Send %(token)s on the wake-up channel: a LISTEN connection that receives it is one
-- that notifications reach (through a transaction-mode pooler, they do not).
SELECT pg_notify(%(channel)s, %(token)s)
"""
