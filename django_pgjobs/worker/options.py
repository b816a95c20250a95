"""What a worker does, resolved from its arguments and the settings: its options, its id,
and the queues it serves by default (every queue this process knows of, or those of one
database)."""

from __future__ import annotations

import os
import socket
import uuid
from dataclasses import dataclass

from django_pgjobs import registry
from django_pgjobs.conf import pgjobs_settings


def default_worker_id() -> str:
    """host:pid:random, unique per process and readable in the admin."""
    return f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:6]}"


def default_queues() -> list[str]:
    """Every queue this process knows of: the default one, the configured ones
    (PGJOBS["QUEUES"], and the QUEUES of the TASKS backends that are django_pgjobs'), and
    the queues the registered jobs and tasks name."""
    names = [pgjobs_settings.DEFAULT_QUEUE, *pgjobs_settings.QUEUES, *tasks_queues()]
    for kind in registry.registered_kinds():
        definition = registry.get_definition(kind)
        if definition is not None and "queue" in definition.defaults:
            names.append(definition.defaults["queue"])
    return list(dict.fromkeys(names))


def queues_of_database(alias: str) -> list[str]:
    """The queues whose jobs live in database `alias`: the default queues
    (default_queues) that PGJOBS["QUEUE_DATABASES"] leaves there, or sends there, and the
    queues it sends there."""
    routes = pgjobs_settings.QUEUE_DATABASES
    names = [queue for queue in default_queues() if pgjobs_settings.database_of(queue) == alias]
    names += [queue for queue, routed in routes.items() if routed == alias]
    return list(dict.fromkeys(names))


def tasks_queues() -> list[str]:
    """The queue names the TASKS backends of django_pgjobs allow (`QUEUES`; Django's
    default is ["default"], and [] allows any: then the tasks' own names count)."""
    return [
        name
        for params in pgjobs_settings.tasks_backends()
        for name in params.get("QUEUES", ["default"])
        if isinstance(name, str)
    ]


@dataclass(frozen=True, slots=True)
class WorkerOptions:
    """What a worker does, resolved from its arguments and the settings."""

    queues: list[str]
    concurrency: int
    async_concurrency: int
    prefetch: int
    worker_id: str
    burst: bool
    max_jobs: int | None
    poll_interval: float
    shutdown_grace: float
    sweep_interval: float
    schedules: bool
    listen: bool
    status_interval: float
    using: str
