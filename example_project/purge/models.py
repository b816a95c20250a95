"""An append-only event log that a job purges in bounded batches."""

from django.db import models
from django.db.models.functions import Now


class Event(models.Model):
    name = models.CharField(max_length=100)
    created_at = models.DateTimeField(db_default=Now())

    class Meta:
        indexes = [models.Index(fields=["created_at"], name="purge_event_created_at")]

    def __str__(self) -> str:
        return self.name
