"""The scheduler: every worker syncs the declared schedules into `pgjobs_schedule` as it
starts, then enqueues the jobs of the ticks that come due, each tick exactly once over any
number of replicas (the replica that advances a schedule's `next_run_at` first enqueues
the tick's job in the same transaction). The ticks are computed here, from the
database's clock; the ScheduleManager only stores them.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence

from django.core.exceptions import ImproperlyConfigured
from django.db import transaction

from django_pgjobs.conf import pgjobs_settings
from django_pgjobs.exceptions import InvalidJobOption
from django_pgjobs.models import Schedule
from django_pgjobs.records import SyncResult
from django_pgjobs.schedules import declared_schedules, due_ticks, next_tick

logger = logging.getLogger("django_pgjobs.schedules")


class Scheduler:
    """Syncs the declared schedules and enqueues the jobs of the ticks that are due."""

    def __init__(self, *, using: str | None = None) -> None:
        self.using = using or pgjobs_settings.DATABASE

    def sync(self) -> SyncResult:
        """Write every declared schedule, each with its next tick from the database's
        now (kept where its cron and timezone did not change); disable those no longer
        declared."""
        declarations = declared_schedules().values()
        with transaction.atomic(using=self.using):
            now = Schedule.objects.clock(using=self.using)
            result = Schedule.objects.store(
                [(each, next_tick(each.cron, each.timezone, now)) for each in declarations],
                using=self.using,
            )
        if result.added or result.changed or result.retired:
            logger.info(
                "schedules synced: %s added, %s changed, %s retired",
                result.added,
                result.changed,
                result.retired,
            )
        return result

    def enable(self, names: Sequence[str]) -> int:
        """Enable schedules from their next tick after now (missed ticks are not run).

        A retired schedule (no longer declared) stays disabled: declare it again."""
        with transaction.atomic(using=self.using):
            now = Schedule.objects.clock(using=self.using)
            disabled = Schedule.objects.disabled_declared(names, using=self.using)
            next_runs = {each.name: next_tick(each.cron, each.timezone, now) for each in disabled}
            return Schedule.objects.enable_at(next_runs, using=self.using)

    def run_due(self) -> float | None:
        """Enqueue the jobs of every due tick; return seconds until the next tick (None:
        no enabled schedule)."""
        for due in Schedule.objects.due(using=self.using):
            try:
                ticks = due_ticks(
                    due.cron,
                    due.timezone,
                    due.next_run_at,
                    due.now,
                    due.on_missed,
                    due.backfill_limit,
                )
                following = next_tick(due.cron, due.timezone, due.now)
                job_ids = Schedule.objects.fire(due, ticks, following, using=self.using)
            except (InvalidJobOption, ImproperlyConfigured, ValueError, KeyError) as error:
                # A row no declaration wrote (edited by hand): stop it, say why.
                logger.error("schedule %s disabled: %s", due.name, error)
                Schedule.objects.disable([due.name], using=self.using)
                continue
            if job_ids:
                logger.info(
                    "schedule %s: enqueued job %s for %s",
                    due.name,
                    ", ".join(map(str, job_ids)),
                    ", ".join(f"{tick:%Y-%m-%d %H:%M}" for tick in ticks),
                )
        return Schedule.objects.next_due_in(using=self.using)
