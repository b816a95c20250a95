"""What the benchmark handlers record."""

from django.db import models


class Stamp(models.Model):
    """When a handler's first line ran, by wall clock (time.time()), for wake latency."""

    job_id = models.BigIntegerField(unique=True)
    started = models.FloatField()

    def __str__(self) -> str:
        return f"{self.job_id}@{self.started}"
