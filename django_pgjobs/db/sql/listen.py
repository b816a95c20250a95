"""Statements of the wake-up line (S23): LISTEN, and the probe that tells whether
notifications arrive on it."""

from __future__ import annotations

LISTEN_CHANNEL = """
-- Subscribe this connection to the wake-up channel (S23); {channel} is an identifier.
LISTEN {channel}
"""

UNLISTEN_ALL = """
-- Stop listening on every channel: what a LISTEN connection says before it closes when its
-- probe found notifications do not reach it. Behind a transaction-mode pooler the LISTEN
-- stays on the pooled server connection it ran on, and would send notifications to
-- whoever uses that connection next; this lands on the same one when the pool is quiet
-- (best effort: nothing else can reach it).
UNLISTEN *
"""

PROBE_LISTENER = """
-- Send %(token)s on the wake-up channel: a LISTEN connection that receives it is one
-- that notifications reach (through a transaction-mode pooler, they do not).
SELECT pg_notify(%(channel)s, %(token)s)
"""
