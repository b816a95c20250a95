"""An append-only log per (session, subsystem) and how far each subsystem has replayed it."""

from django.db import models
from django.db.models.functions import Now


class Entry(models.Model):
    session_id = models.BigIntegerField()
    subsystem = models.CharField(max_length=50)
    body = models.TextField()
    created_at = models.DateTimeField(db_default=Now())

    class Meta:
        verbose_name_plural = "entries"
        indexes = [models.Index(fields=["session_id", "subsystem", "id"], name="replay_entry_seq")]

    def __str__(self) -> str:
        return f"{self.session_id}/{self.subsystem}#{self.id}"


class Watermark(models.Model):
    session_id = models.BigIntegerField()
    subsystem = models.CharField(max_length=50)
    replayed_to = models.BigIntegerField(default=0)
    replays = models.IntegerField(default=0)
    replayed_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["session_id", "subsystem"], name="replay_watermark_one")
        ]

    def __str__(self) -> str:
        return f"{self.session_id}/{self.subsystem} @ {self.replayed_to}"
