"""The counts the workers keep for the dashboard, so that its charts and percentiles never
scan the job table: per minute (`pgjobs_stats`, `pgjobs_kind_stats`, kept a day), and per
hour (`pgjobs_stats_hour`, `pgjobs_kind_stats_hour`, kept STATS_HOURS_KEPT hours), which
the sweeper sums from the minutes once each hour has ended. Also the dashboard's place
in the admin's index."""

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
    """Per minute, queue and kind: runs, and histograms of their queue wait (run_after to
    claimed_at, both on the database clock) and run time, kept by the workers for the
    dashboard's percentiles. Bucket i counts values up to LATENCY_BUCKETS_S[i] seconds
    (the last: any longer); the sweeper drops minutes older than a day."""

    minute = models.DateTimeField()
    queue = models.CharField(
        max_length=QUEUE_NAME_MAX_LENGTH,
        db_default="",
        help_text="Empty in minutes written before the counts were kept per queue.",
    )
    kind = models.CharField(max_length=KIND_MAX_LENGTH)
    runs = models.IntegerField(db_default=0)
    wait_hist = models.JSONField(help_text="Runs per queue-wait bucket (a list of counts).")
    run_hist = models.JSONField(help_text="Runs per run-time bucket (a list of counts).")

    objects: ClassVar[managers.KindStatsManager] = managers.KindStatsManager()

    class Meta:
        db_table = "pgjobs_kind_stats"
        verbose_name_plural = "kind stats"
        constraints: ClassVar[list[models.BaseConstraint]] = [
            models.UniqueConstraint(
                fields=["minute", "queue", "kind"], name="pgjobs_kind_stats_minute_queue_kind"
            )
        ]

    def __str__(self) -> str:
        return f"{self.queue}/{self.kind}@{self.minute:%H:%M}"


class JobStatsHour(models.Model):
    """A queue's jobs finished in one hour: the sum of its minutes in `pgjobs_stats`,
    written once by the sweeper after the hour has ended; the week's chart reads these."""

    hour = models.DateTimeField()
    queue = models.CharField(max_length=QUEUE_NAME_MAX_LENGTH)
    succeeded = models.IntegerField()
    retried = models.IntegerField()
    dead = models.IntegerField()
    cancelled = models.IntegerField()

    class Meta:
        db_table = "pgjobs_stats_hour"
        verbose_name_plural = "job stats per hour"
        constraints: ClassVar[list[models.BaseConstraint]] = [
            models.UniqueConstraint(fields=["hour", "queue"], name="pgjobs_stats_hour_queue")
        ]

    def __str__(self) -> str:
        return f"{self.queue}@{self.hour:%Y-%m-%d %H:00}"


class KindStatsHour(models.Model):
    """A queue's kind in one hour: runs and the sums of their histograms from
    `pgjobs_kind_stats`, written once by the sweeper after the hour has ended; the day's
    and the week's percentiles read these."""

    hour = models.DateTimeField()
    queue = models.CharField(max_length=QUEUE_NAME_MAX_LENGTH)
    kind = models.CharField(max_length=KIND_MAX_LENGTH)
    runs = models.IntegerField()
    wait_hist = models.JSONField(help_text="Runs per queue-wait bucket (a list of counts).")
    run_hist = models.JSONField(help_text="Runs per run-time bucket (a list of counts).")

    class Meta:
        db_table = "pgjobs_kind_stats_hour"
        verbose_name_plural = "kind stats per hour"
        constraints: ClassVar[list[models.BaseConstraint]] = [
            models.UniqueConstraint(
                fields=["hour", "queue", "kind"], name="pgjobs_kind_stats_hour_queue_kind"
            )
        ]

    def __str__(self) -> str:
        return f"{self.queue}/{self.kind}@{self.hour:%Y-%m-%d %H:00}"


class Dashboard(JobStats):
    """The admin's dashboard: a proxy of the per-minute counts it charts, so that the
    page has a place in the admin's index (and no table of its own)."""

    class Meta:
        proxy = True
        verbose_name = verbose_name_plural = "dashboard"
