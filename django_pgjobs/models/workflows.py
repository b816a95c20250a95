"""The tables of workflows (S29-S31): the edges between jobs, and batches with their
callbacks. No foreign keys to the jobs: a job moves between the live and the dead table,
its id kept."""

from __future__ import annotations

from typing import ClassVar

from django.db import models
from django.db.models import Q
from django.db.models.functions import Now

from django_pgjobs import managers


class Dependency(models.Model):
    """One edge of a workflow (S29, S30): `child_id` waits for `parent_id` to end.

    Written with the child, in its enqueue's statement; the statement that records the
    parent's end marks the edge (`ended`, and the parent's result, kept here for the
    child's `ctx.parent_results()` whatever the parent's retention) and moves the child
    on. No foreign keys: jobs move between the live and the dead table, ids kept.
    Deleted when the child is acked.
    """

    class OnFailure(models.TextChoices):
        CANCEL = "cancel", "Dead-letter the child with its parent"
        RUN = "run", "Run the child anyway"

    class Ended(models.TextChoices):
        DONE = "done", "Done"
        FAILED = "failed", "Dead or cancelled"

    id = models.BigAutoField(primary_key=True)
    child_id = models.BigIntegerField()
    parent_id = models.BigIntegerField()
    on_failure = models.CharField(max_length=8, choices=OnFailure.choices, db_default="cancel")
    ended = models.CharField(max_length=8, choices=Ended.choices, null=True, blank=True)
    parent_result = models.JSONField(null=True, blank=True)

    class Meta:
        db_table = "pgjobs_dependency"
        verbose_name_plural = "dependencies"
        indexes: ClassVar[list[models.Index]] = [
            # A parent's end finds the edges to its children.
            models.Index(fields=["parent_id"], name="pgjobs_dependency_parent"),
        ]
        constraints: ClassVar[list[models.BaseConstraint]] = [
            # A child's edges, one per parent; also how a child finds its parents.
            models.UniqueConstraint(
                fields=["child_id", "parent_id"], name="pgjobs_dependency_edge"
            ),
            models.CheckConstraint(
                condition=Q(on_failure__in=["cancel", "run"]),
                name="pgjobs_dependency_on_failure",
            ),
            models.CheckConstraint(
                condition=Q(ended__in=["done", "failed"]) | Q(ended__isnull=True),
                name="pgjobs_dependency_ended",
            ),
        ]

    def __str__(self) -> str:
        return f"{self.parent_id}->{self.child_id}"


class Batch(models.Model):
    """Member jobs with callbacks, released once by the last member's end (S31)."""

    class State(models.TextChoices):
        OPEN = "open", "Open: members may come, does not end until sealed"
        SEALED = "sealed", "Sealed: ends with its last member"
        SUCCEEDED = "succeeded", "Succeeded: every member done"
        FAILED = "failed", "Failed: some member dead or cancelled"

    id = models.BigAutoField(primary_key=True)
    state = models.CharField(max_length=10, choices=State.choices, db_default="open")
    members = models.IntegerField(db_default=0, help_text="Members written so far.")
    done = models.IntegerField(null=True, blank=True, help_text="Members done, at its end.")
    failed = models.IntegerField(null=True, blank=True, help_text="Members dead, at its end.")
    created_at = models.DateTimeField(db_default=Now())
    ended_at = models.DateTimeField(null=True, blank=True)

    objects: ClassVar[managers.BatchManager] = managers.BatchManager()

    class Meta:
        db_table = "pgjobs_batch"
        verbose_name_plural = "batches"
        indexes: ClassVar[list[models.Index]] = [
            # The sweeper prunes the batches that ended longest ago (PRUNE_BATCHES).
            models.Index(
                fields=["ended_at"],
                name="pgjobs_batch_ended",
                condition=Q(ended_at__isnull=False),
            ),
        ]
        constraints: ClassVar[list[models.BaseConstraint]] = [
            models.CheckConstraint(
                condition=Q(state__in=["open", "sealed", "succeeded", "failed"]),
                name="pgjobs_batch_state",
            )
        ]

    def __str__(self) -> str:
        return f"batch #{self.pk}"


class BatchCallback(models.Model):
    """A batch's callback job (S31): fired, or deleted unseen, as `fires_on` says."""

    class FiresOn(models.TextChoices):
        SUCCESS = "success", "Every member done"
        FAILURE = "failure", "Some member dead or cancelled"
        COMPLETE = "complete", "Every member ended, either way"

    job_id = models.BigIntegerField(primary_key=True)
    batch_id = models.BigIntegerField()
    fires_on = models.CharField(max_length=8, choices=FiresOn.choices)

    class Meta:
        db_table = "pgjobs_batch_callback"
        indexes: ClassVar[list[models.Index]] = [
            models.Index(fields=["batch_id"], name="pgjobs_batch_callback_batch")
        ]
        constraints: ClassVar[list[models.BaseConstraint]] = [
            models.CheckConstraint(
                condition=Q(fires_on__in=["success", "failure", "complete"]),
                name="pgjobs_fires_on",
            )
        ]

    def __str__(self) -> str:
        return f"batch #{self.batch_id} on {self.fires_on}: job {self.job_id}"
