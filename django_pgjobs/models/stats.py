"""The counts the workers keep for the dashboard (`pgjobs_stats`, `pgjobs_kind_stats`), so
that its charts and percentiles never scan the job table, and the dashboard's place in the
admin's index."""

from __future__ import annotations

from typing import ClassVar

from django.db import models

from django_pgjobs import managers
from django_pgjobs.options import KIND_MAX_LENGTH, QUEUE_NAME_MAX_LENGTH


class JobStats(models.Model):
    """Jobs finished per minute and queue, kept by the workers for the admin's chart.

    A small rollup instead of keeping every done row: each worker adds its counts every
    few seconds; the sweeper drops minutes older than a day.
    """

    minute = models.DateTimeField()
    queue = models.CharField(max_length=QUEUE_NAME_MAX_LENGTH)
    succeeded = models.IntegerField(db_default=0)
    retried = models.IntegerField(db_default=0)
    dead = models.IntegerField(db_default=0)
    cancelled = models.IntegerField(db_default=0)

    objects: ClassVar[managers.JobStatsManager] = managers.JobStatsManager()

    class Meta:
        db_table = "pgjobs_stats"
        verbose_name_plural = "job stats"
        constraints: ClassVar[list[models.BaseConstraint]] = [
            models.UniqueConstraint(fields=["minute", "queue"], name="pgjobs_stats_minute_queue")
        ]

    def __str__(self) -> str:
        return f"{self.queue}@{self.minute:%H:%M}"


class KindStats(models.Model):
    """Per minute and kind: runs, and histograms of their queue wait (run_after to
    claimed_at, both on the database clock) and run time, kept by the workers for the
    dashboard's percentiles. Bucket i counts values up to LATENCY_BUCKETS_S[i] seconds
    (the last: any longer); the sweeper drops minutes older than a day."""

    minute = models.DateTimeField()
    kind = models.CharField(max_length=KIND_MAX_LENGTH)
    runs = models.IntegerField(db_default=0)
    wait_hist = models.JSONField(help_text="Runs per queue-wait bucket (a list of counts).")
    run_hist = models.JSONField(help_text="Runs per run-time bucket (a list of counts).")

    objects: ClassVar[managers.KindStatsManager] = managers.KindStatsManager()

    class Meta:
        db_table = "pgjobs_kind_stats"
        verbose_name_plural = "kind stats"
        constraints: ClassVar[list[models.BaseConstraint]] = [
            models.UniqueConstraint(fields=["minute", "kind"], name="pgjobs_kind_stats_minute_kind")
        ]

    def __str__(self) -> str:
        return f"{self.kind}@{self.minute:%H:%M}"


class Dashboard(JobStats):
    """The admin's dashboard: a proxy of the per-minute counts it charts, so that the
    page has a place in the admin's index (and no table of its own)."""

    class Meta:
        proxy = True
        verbose_name = verbose_name_plural = "dashboard"
