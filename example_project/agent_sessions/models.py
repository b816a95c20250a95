"""Agent sessions: provisioned and torn down by jobs, never by the request itself."""

from django.db import models
from django.db.models.functions import Now


class AgentSession(models.Model):
    class Status(models.TextChoices):
        PROVISIONING = "provisioning"
        READY = "ready"
        DELETING = "deleting"

    name = models.CharField(max_length=100)
    status = models.CharField(max_length=16, choices=Status.choices, default=Status.PROVISIONING)
    created_at = models.DateTimeField(db_default=Now())
    provisioned_at = models.DateTimeField(null=True, blank=True)

    def __str__(self) -> str:
        return self.name
