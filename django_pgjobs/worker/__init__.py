"""The worker (`manage.py runjobs`): one loop, a pool of handler threads, and the pieces
they share. `loop` (claim, hand out, wait) over `pacing` (when and how many),
`pool` (the threads, each with an `executor`), `recorder` (a thread and a connection
that write the outcomes while the loop claims) over `completer` (outcomes recorded in
batches, set aside while a row is held), `leases` (heartbeats, hand-back), `timeouts`
(handlers past their timeout, abandoned threads bounded), `faults` (what is an outage),
`wakeup` (LISTEN and the pipe), `services` (sweeper and scheduler), `stats`, and
`options` (what a worker does, the queues it serves by default).
"""

from __future__ import annotations

from django_pgjobs.worker.loop import Worker
from django_pgjobs.worker.options import (
    WorkerOptions,
    default_queues,
    default_worker_id,
    queues_of_database,
)
from django_pgjobs.worker.stats import WorkerStats

__all__ = [
    "Worker",
    "WorkerOptions",
    "WorkerStats",
    "default_queues",
    "default_worker_id",
    "queues_of_database",
]
