"""What a worker says of itself when a person is watching: the kinds it runs (and from
which modules) as it starts, and, at once when it is asked to stop, what it waits for,
for how long, and how to cut that short."""

from __future__ import annotations

import logging
import signal
from collections.abc import Sequence

from django_pgjobs import registry

logger = logging.getLogger("django_pgjobs.worker")

#: What a second signal does, by the first one (the stop asked for by a person at a
#: terminal, or by a process manager).
SECOND_SIGNAL = {
    int(signal.SIGINT): "press Ctrl-C again to exit now",
    int(signal.SIGTERM): "a second SIGTERM exits now",
}


def kinds() -> None:
    """Say which kinds this worker runs, from which modules; warn when it knows none."""
    by_module = registry.kinds_by_module()
    if not by_module:
        how = registry.HOW_WORKERS_FIND_KINDS
        logger.warning(
            "this worker knows no job kind: every job it claims fails with 'unknown job "
            "kind'. %s; put @job functions in a jobs.py module of an installed app.",
            how[0].upper() + how[1:],
        )
        return
    logger.info(
        "kinds: %s from %s",
        sum(len(kinds) for kinds in by_module.values()),
        "; ".join(f"{module} ({few(kinds)})" for module, kinds in by_module.items()),
    )


def stop(running: Sequence[int], grace: float, first_signal: int | None) -> None:
    """Say at once what a stop waits for (the jobs `running`), how long, and how to cut
    it short."""
    if not running:
        logger.info("stopping: no more claims; no job is running, so the worker exits now")
        return
    ids = sorted(running)
    shown = ", ".join(map(str, ids[:10])) + (" ..." if len(ids) > 10 else "")
    second = SECOND_SIGNAL.get(first_signal or 0, "a second SIGTERM or SIGINT exits now")
    one = len(ids) == 1
    logger.warning(
        "stopping: no more claims; waiting up to %gs for %s running %s (id %s) to finish, "
        "then handing %s back; %s (%s)",
        grace,
        len(ids),
        "job" if one else "jobs",
        shown,
        "it" if one else "them",
        second,
        "it then runs again once its lease lapses"
        if one
        else "they then run again once their lease lapses",
    )


def few(names: Sequence[str], most: int = 8) -> str:
    """Up to `most` names, and how many more."""
    shown = ", ".join(names[:most])
    return shown if len(names) <= most else f"{shown} and {len(names) - most} more"
