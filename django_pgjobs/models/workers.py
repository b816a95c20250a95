"""The worker registry (`pgjobs_worker`): each `runjobs` process as it last reported
itself, and what an operator asked of it from the console."""

from __future__ import annotations

from typing import ClassVar

from django.db import models
from django.db.models.functions import Now

from django_pgjobs import managers
from django_pgjobs.states import WorkerAsk


class Worker(models.Model):
    """A `runjobs` process as it last reported itself: registered when it starts,
    heartbeated every WORKER_HEARTBEAT seconds by a service thread beside its loop, marked
    stopped when it stops. One that misses 3 heartbeats (on the database clock) is gone;
    the sweeper deletes rows not seen for a day."""

    id = models.TextField(primary_key=True, help_text="The worker id stamped on its claims.")
    host = models.TextField()
    pid = models.IntegerField()
    queues = models.JSONField(help_text="The queues it claims from.")
    concurrency = models.IntegerField()
    version = models.TextField(help_text="The django_pgjobs version it runs.")
    heartbeat_s = models.FloatField(help_text="Seconds between its heartbeats.")
    started_at = models.DateTimeField(db_default=Now())
    last_seen_at = models.DateTimeField(db_default=Now())
    stopped_at = models.DateTimeField(null=True, blank=True)
    running = models.IntegerField(db_default=0, help_text="Jobs it holds now.")
    succeeded = models.IntegerField(db_default=0, help_text="Jobs done since it started.")
    failed = models.IntegerField(
        db_default=0, help_text="Attempts failed (retried or dead-lettered) since it started."
    )
    abandoned = models.IntegerField(
        db_default=0,
        help_text=(
            "Handlers abandoned at their timeout whose threads still run (S39): at its "
            "concurrency, it claims no more jobs for its threads."
        ),
    )
    claims_from_floors = models.BooleanField(
        db_default=False,
        help_text=(
            "Its claims read from their queues' floors: something has held the database's "
            "xmin horizon (a transaction left open, a long report) through two of its looks "
            "(S42)."
        ),
    )

    asked = models.CharField(
        max_length=8,
        choices=WorkerAsk.choices,
        null=True,
        blank=True,
        help_text="What an operator asked of it, obeyed at its next heartbeat (empty: run).",
    )
    asked_by = models.TextField(null=True, blank=True, help_text="Who asked it.")
    asked_at = models.DateTimeField(null=True, blank=True)
    paused_queues = models.JSONField(
        null=True,
        blank=True,
        help_text=(
            "The queues an operator paused on this worker only, each with who paused it and "
            'when ({"mail": {"by": "alice", "at": "…"}}); obeyed at its next heartbeat.'
        ),
    )

    objects: ClassVar[managers.WorkerManager] = managers.WorkerManager()

    class Meta:
        db_table = "pgjobs_worker"
        indexes: ClassVar[list[models.Index]] = [
            models.Index(fields=["last_seen_at"], name="pgjobs_worker_last_seen")
        ]
        permissions = [
            ("control_worker", "Can ask workers to go quiet, stop, or run again"),
        ]

    def __str__(self) -> str:
        return self.id
