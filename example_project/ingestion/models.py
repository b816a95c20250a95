"""Documents whose semantic summary is computed by a slow remote step."""

from django.db import models


class Document(models.Model):
    title = models.CharField(max_length=200)
    text = models.TextField()
    summary = models.TextField(blank=True, default="")
    ingested_at = models.DateTimeField(null=True, blank=True)
    ingested_by_claim = models.UUIDField(null=True, blank=True)

    def __str__(self) -> str:
        return self.title
