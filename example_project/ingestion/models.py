"""Collections of documents whose semantic summary a slow remote step computes."""

from django.db import models


class Collection(models.Model):
    name = models.CharField(max_length=100, unique=True)
    indexed_at = models.DateTimeField(
        null=True, blank=True, help_text="When its index was last built (reindex_collection)."
    )
    indexed_documents = models.IntegerField(default=0, help_text="Documents in that index.")
    index_failures = models.IntegerField(
        default=0, help_text="Documents whose summary failed in that reindex."
    )

    def __str__(self) -> str:
        return self.name


class Document(models.Model):
    collection = models.ForeignKey(Collection, on_delete=models.CASCADE, related_name="documents")
    title = models.CharField(max_length=200)
    text = models.TextField()
    dirty = models.BooleanField(default=True, help_text="Changed since its last ingestion.")
    summary = models.TextField(blank=True, default="")
    ingested_at = models.DateTimeField(null=True, blank=True)
    ingested_by_claim = models.UUIDField(null=True, blank=True)

    class Meta:
        indexes = [
            models.Index(
                fields=["collection"], name="ingestion_dirty", condition=models.Q(dirty=True)
            )
        ]

    def __str__(self) -> str:
        return self.title
