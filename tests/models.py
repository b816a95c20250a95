"""Tables the tests write to from handlers and fences."""

from django.db import models
from django.db.models.functions import Now


class Note(models.Model):
    """A row written by a handler, a fence or a test, to check what committed."""

    text = models.TextField()
    job_id = models.BigIntegerField(null=True)
    token = models.UUIDField(null=True)
    attempt = models.IntegerField(null=True)
    worker = models.TextField(null=True)
    created_at = models.DateTimeField(db_default=Now())

    def __str__(self) -> str:
        return self.text
