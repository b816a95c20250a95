"""Sample outputs of the commands, printed by the commands' own code from sample rows.

A page's example then shows the columns, the layout and the version of the code it
documents, rather than those of the day it was written.
"""

from __future__ import annotations

import io
from datetime import UTC, datetime, timedelta


def jobsctl_workers_markdown() -> str:
    """Return the workers' table `jobsctl status` prints for one live worker, and its
    warning about a queue no live worker serves, as a text block."""
    from django_pgjobs import __version__
    from django_pgjobs.management.commands.jobsctl import Command
    from django_pgjobs.management.jobsctl.output import Output
    from django_pgjobs.management.jobsctl.queues import workers_table
    from django_pgjobs.records import WorkerStatus

    seen = datetime(2026, 3, 2, 9, 30, tzinfo=UTC)
    worker = WorkerStatus(
        id="web-1:4242:9f3a2c",
        host="web-1",
        pid=4242,
        queues=["demo"],
        concurrency=2,
        version=__version__,
        heartbeat_s=5.0,
        started_at=seen - timedelta(hours=3),
        last_seen_at=seen,
        stopped_at=None,
        running=2,
        succeeded=318,
        failed=4,
        claims_from_floors=False,
        live=True,
        seen_s_ago=2.0,
    )
    printed = io.StringIO()
    # The table alone: the whole `status` reads the database, which the docs build lacks.
    workers_table(Output(Command(stdout=printed, no_color=True)), [worker])
    lines = [line.rstrip() for line in printed.getvalue().splitlines()]
    warning = "Warning: no live worker serves reports, which has runnable jobs."
    return "\n".join(["```text", *lines, "", warning, "```", ""])
