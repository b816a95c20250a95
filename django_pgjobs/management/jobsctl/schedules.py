"""`jobsctl schedules`: every schedule, and enable, disable or run one now as the admin's
Schedules page does. Schedules live in PGJOBS["DATABASE"] and enqueue there."""

from __future__ import annotations

import difflib
from collections.abc import Sequence

from django.core.management.base import CommandError

from django_pgjobs.conf import pgjobs_settings
from django_pgjobs.management.jobsctl.databases import in_database
from django_pgjobs.management.jobsctl.output import Output, when
from django_pgjobs.models import Schedule
from django_pgjobs.scheduler import Scheduler


def listing(out: Output) -> None:
    schedules = Schedule.objects.by_name(using=pgjobs_settings.DATABASE)
    if not schedules:
        out.line(
            "No schedules: declare them with @job(schedule=...) or PGJOBS['SCHEDULES'] "
            "(workers sync them as they start)."
        )
        return
    header = ("schedule", "kind", "cron", "timezone", "state", "next run", "last run", "runs")
    rows = [
        (
            schedule.name,
            schedule.kind,
            schedule.cron,
            schedule.timezone,
            _state(schedule),
            when(schedule.next_run_at) if schedule.enabled else "-",
            when(schedule.last_run_at),
            str(schedule.runs),
        )
        for schedule in schedules.values()
    ]
    out.table(header, rows)


def _state(schedule: Schedule) -> str:
    if schedule.enabled:
        return "enabled"
    return "disabled" if schedule.declared else "retired"


def enable(out: Output, names: Sequence[str]) -> None:
    """Enable the disabled ones of `names` from their next tick (missed ticks are not
    run), as the admin's action does."""
    database = pgjobs_settings.DATABASE
    schedules = _named(names, action="enable")
    retired = [name for name, schedule in schedules.items() if not schedule.declared]
    if retired:
        raise CommandError(
            f"Retired (no code or setting declares {'it' if len(retired) == 1 else 'them'} "
            f"any more): {', '.join(retired)}. Declare {'it' if len(retired) == 1 else 'them'} "
            "again (@job(schedule=...) or PGJOBS['SCHEDULES']) and restart a worker, which "
            "enables it. Nothing was enabled."
        )
    Scheduler(using=database).enable(list(schedules))
    now = Schedule.objects.by_name(using=database)
    for name, before in schedules.items():
        after = now[name]
        if before.enabled:
            out.line(f"{name}: enabled already; next run {when(after.next_run_at)}.")
        else:
            out.line(
                f"Enabled {name}{in_database(database)}: next run {when(after.next_run_at)} "
                "(the ticks missed while disabled are not run)."
            )


def disable(out: Output, names: Sequence[str]) -> None:
    database = pgjobs_settings.DATABASE
    schedules = _named(names, action="disable")
    Schedule.objects.disable(list(schedules), using=database)
    for name, before in schedules.items():
        if not before.enabled:
            retired = "" if before.declared else " (retired: no code or setting declares it)"
            out.line(f"{name}: disabled already{retired}.")
        else:
            out.line(
                f"Disabled {name}{in_database(database)}: no tick of it enqueues a job until "
                f"it is enabled again (jobsctl schedules enable {name})."
            )


def run_now(out: Output, names: Sequence[str]) -> None:
    """Enqueue a job of each of `names` now, their next ticks as they are: the admin's
    "Run now", whether the schedule is enabled or not."""
    database = pgjobs_settings.DATABASE
    schedules = _named(names, action="run")
    Schedule.objects.run_now(list(schedules), using=database)
    now = Schedule.objects.by_name(using=database)
    for name, schedule in schedules.items():
        tick = (
            f"its next tick stays {when(schedule.next_run_at)}"
            if schedule.enabled
            else f"it stays {_state(schedule)}"
        )
        out.line(
            f"Enqueued job {now[name].last_job_id} ({schedule.kind}) for schedule "
            f"{name}{in_database(database)}; {tick}."
        )


def _named(names: Sequence[str], *, action: str) -> dict[str, Schedule]:
    """The schedules `names` name, in name order; a CommandError naming the unknown ones
    (matched against the stored names, never sent to the database as they are)."""
    schedules = Schedule.objects.by_name(using=pgjobs_settings.DATABASE)
    unknown = [name for name in dict.fromkeys(names) if name not in schedules]
    if unknown:
        guesses = "".join(
            f" Did you mean {' or '.join(map(repr, close))} for {name!r}?"
            for name in unknown
            if (close := difflib.get_close_matches(name, list(schedules), n=2, cutoff=0.6))
        )
        known = ", ".join(schedules) or "none (workers sync the declared ones as they start)"
        raise CommandError(
            f"No schedule is named {', '.join(map(repr, unknown))}.{guesses} The schedules: "
            f"{known}. Nothing was {'run' if action == 'run' else action + 'd'}."
        )
    return {name: schedules[name] for name in sorted(set(names))}
