"""Timestamps inside a benchmark worker, for the wake-up breakdown (bench/wake.py).

With $PGJOBS_BENCH_PROBES set to a path, the bench app wraps four worker steps when
Django starts, without changing them: the loop's wait returning (a notification read),
the claim (start, end and the ids it took), the hand-off to the pool, the handler
thread's executor taking the job; and every statement the package sends (its opening
`--` line), to count the round trips of a wake-up. Events are kept in memory (a list append, not
a write) and written to the path as JSON lines when the process exits.
"""

from __future__ import annotations

import atexit
import functools
import json
import os
import time
from typing import Any

EVENTS: list[tuple[str, float, list[int]]] = []


def install() -> None:
    path = os.environ.get("PGJOBS_BENCH_PROBES")
    if not path:
        return
    from django_pgjobs.db import connection
    from django_pgjobs.models import Job
    from django_pgjobs.worker.executor import Executor
    from django_pgjobs.worker.pool import HandlerPool
    from django_pgjobs.worker.wakeup import Wakeup

    def wrap(owner: type, name: str, before: str | None, after: str | None, ids: Any) -> None:
        original = getattr(owner, name)

        @functools.wraps(original)
        def probed(*args: Any, **kwargs: Any) -> Any:
            if before:
                EVENTS.append((before, time.time(), ids(args, None)))
            result = original(*args, **kwargs)
            if after:
                EVENTS.append((after, time.time(), ids(args, result)))
            return result

        setattr(owner, name, probed)

    wrap(Wakeup, "wait", None, "woke", lambda a, r: [1] if r else [])
    wrap(
        type(Job.objects),
        "claim_for_worker",  # the loop's claim (claim_batch is the API's, around it)
        "claim_start",
        "claim_end",
        lambda a, r: [h.id for h in r[0]] if r else [],
    )
    wrap(HandlerPool, "submit", "submit", None, lambda a, r: [x.handle.id for x in a[1]])
    wrap(Executor, "run", "executor_start", None, lambda a, r: [a[1].id])
    executed = connection.executed

    def probed_executed(statement: str, *args: Any, **kwargs: Any) -> Any:
        first = statement.strip().split("\n", 1)[0]
        EVENTS.append((f"sql {first[:70]}", time.time(), []))
        return executed(statement, *args, **kwargs)

    connection.executed = probed_executed  # type: ignore[assignment]

    def dump() -> None:
        with open(path, "w") as out:
            for event in EVENTS:
                out.write(json.dumps(event) + "\n")

    atexit.register(dump)
