"""The queue's vocabulary, one manager per table: the only callers of `db`.

`Job.objects` enqueues, claims and completes; `DeadJob.objects` requeues and prunes;
`QueueControl.objects` pauses and limits; `Schedule.objects` stores and fires ticks;
`JobStats.objects` keeps the per-minute counts; `Worker.objects` the worker registry;
`Batch.objects` batches with callbacks.
They return plain values (`records`).
"""

from __future__ import annotations

from django_pgjobs.managers.batches import BatchManager
from django_pgjobs.managers.dead import DeadJobManager
from django_pgjobs.managers.jobs import JobManager
from django_pgjobs.managers.queues import QueueControlManager
from django_pgjobs.managers.schedules import ScheduleManager
from django_pgjobs.managers.stats import JobStatsManager, KindStatsManager
from django_pgjobs.managers.workers import WorkerManager

__all__ = [
    "BatchManager",
    "DeadJobManager",
    "JobManager",
    "JobStatsManager",
    "KindStatsManager",
    "QueueControlManager",
    "ScheduleManager",
    "WorkerManager",
]
