"""`Schedule.objects`: periodic schedules stored, their due ticks taken exactly once.

The cron arithmetic is the Scheduler's (`schedules`): this manager stores the ticks it is
given and reads the database's clock for it, nothing more.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from datetime import datetime
from typing import TYPE_CHECKING, Any

from django.db import models
from django.db.models.functions import Now

from django_pgjobs.db import connection as db
from django_pgjobs.db import sql
from django_pgjobs.records import DueSchedule, SyncResult

if TYPE_CHECKING:
    from django_pgjobs.models import Schedule


class ScheduleManager(models.Manager["Schedule"]):
    """Periodic jobs: store the declarations, fire due ticks exactly once, admin actions."""

    def clock(self, *, using: str | None = None) -> datetime:
        """The database's time now (S22): what every tick is computed from."""
        return db.clock(using)

    def store(
        self, declared: Iterable[tuple[Any, datetime]], *, using: str | None = None
    ) -> SyncResult:
        """Write each (schedules.Declaration, its next tick from now); retire the rows no
        longer declared. A schedule whose cron and timezone did not change keeps its next
        tick. In one transaction."""
        added = changed = 0
        names = []
        with db.atomic(using):
            for declaration, next_run_at in declared:
                names.append(declaration.name)
                params = {
                    "name": declaration.name,
                    "kind": declaration.kind,
                    "cron": declaration.cron,
                    "timezone": declaration.timezone,
                    "payload": json.dumps(declaration.payload),
                    "options": json.dumps(declaration.options),
                    "on_missed": declaration.on_missed,
                    "backfill_limit": declaration.backfill_limit,
                    "next_run_at": next_run_at,
                }
                for (inserted,) in db.fetchall(sql.UPSERT_SCHEDULE, params, using):
                    added += bool(inserted)
                    changed += not inserted
            retired = len(db.fetchall(sql.RETIRE_SCHEDULES, {"names": names}, using))
        return SyncResult(added=added, changed=changed, retired=retired)

    def due(self, *, limit: int = 100, using: str | None = None) -> list[DueSchedule]:
        """Up to `limit` enabled schedules whose next tick has come (the database's now)."""
        rows = db.fetchall(sql.DUE_SCHEDULES, {"limit": limit}, using)
        schedules = [DueSchedule._make(row) for row in rows]
        return [
            due._replace(payload=db.json_value(due.payload), options=db.json_value(due.options))
            for due in schedules
        ]

    def fire(
        self,
        due: DueSchedule,
        ticks: Sequence[datetime],
        following: datetime,
        *,
        using: str | None = None,
    ) -> list[int]:
        """Take `due`'s tick and enqueue a job per tick in `ticks`, in one transaction.

        Returns the jobs' ids, or [] when another replica took the tick first.
        """
        from django_pgjobs.models import Job

        alias = db.alias(using)
        params = {
            "name": due.name,
            "seen": due.next_run_at,
            "next_run_at": following,
            "last_tick": ticks[-1],
            "ticks": len(ticks),
        }
        with db.atomic(alias):
            if not db.fetchall(sql.ADVANCE_SCHEDULE, params, alias):
                return []
            job_ids = [
                Job.objects.enqueue(
                    due.kind, due.payload, run_after=tick, using=alias, **due.options
                ).id
                for tick in ticks
            ]
            db.rowcount(sql.RECORD_SCHEDULE_JOB, {"name": due.name, "job_id": job_ids[-1]}, alias)
        return job_ids

    def by_name(self, *, using: str | None = None) -> dict[str, Schedule]:
        """Every schedule, enabled or not, by name in name order."""
        found = self.using(db.alias(using)).order_by("name")
        return {schedule.name: schedule for schedule in found}

    def run_now(self, names: Sequence[str], *, using: str | None = None) -> list[int]:
        """Enqueue a job of each schedule now, leaving its next tick as it is."""
        from django_pgjobs.models import Job

        alias = db.alias(using)
        job_ids = []
        with db.atomic(alias):
            for schedule in self.using(alias).filter(name__in=names).order_by("name"):
                job_id = Job.objects.enqueue(
                    schedule.kind, schedule.payload, using=alias, **schedule.options
                ).id
                self.using(alias).filter(pk=schedule.pk).update(
                    last_job_id=job_id, runs=models.F("runs") + 1, updated_at=Now()
                )
                job_ids.append(job_id)
        return job_ids

    def disabled_declared(self, names: Sequence[str], *, using: str | None = None) -> list[Any]:
        """The declared schedules among `names` that are disabled, locked for the rest of
        the caller's transaction (a retired one stays disabled: declare it again)."""
        disabled = self.using(db.alias(using)).filter(name__in=names, enabled=False, declared=True)
        return list(disabled.order_by("name").select_for_update())

    def enable_at(self, next_runs: Mapping[str, datetime], *, using: str | None = None) -> int:
        """Enable each schedule of `next_runs` from the tick given for it."""
        alias = db.alias(using)
        with db.atomic(alias):
            for name, next_run_at in next_runs.items():
                self.using(alias).filter(pk=name).update(
                    enabled=True, next_run_at=next_run_at, updated_at=Now()
                )
        return len(next_runs)

    def disable(self, names: Sequence[str], *, using: str | None = None) -> int:
        return int(
            self.using(db.alias(using))
            .filter(name__in=names, enabled=True)
            .update(enabled=False, updated_at=Now())
        )

    def next_due_in(self, *, using: str | None = None) -> float | None:
        """Seconds until the next tick of an enabled schedule (None: no enabled schedule)."""
        ((seconds,),) = db.fetchall(sql.NEXT_SCHEDULE_IN, {}, using)
        return None if seconds is None else max(float(seconds), 0.0)
