"""Periodic jobs: cron schedules whose every tick enqueues one job, exactly once.

Declare a schedule with `@job(schedule="*/5 * * * *")` (or `schedule=Cron(...)` for a
timezone, a payload and options), or in `PGJOBS["SCHEDULES"]`. Every worker syncs the
declared schedules into `pgjobs_schedule` as it starts and then evaluates them: the
replica that advances a due schedule's `next_run_at` first (a conditional update) enqueues
the tick's job in the same transaction, so any number of replicas enqueue each tick once.
Times come from the database's clock; Python only does the cron arithmetic on them.

Cron arithmetic is croniter's (`pip install 'django-pgjobs[cron]'`).
"""

from __future__ import annotations

import json
import zoneinfo
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

from django.core.exceptions import ImproperlyConfigured

from django_pgjobs import options, registry
from django_pgjobs.conf import pgjobs_settings
from django_pgjobs.exceptions import InvalidCron, InvalidJobOption
from django_pgjobs.payloads import encode_payload

ON_MISSED = ("skip", "backfill")
#: The enqueue options a schedule may give its jobs (durations in seconds).
SCHEDULE_OPTIONS = (
    "queue",
    "key",
    "priority",
    "max_attempts",
    "lease",
    "expires",
    "result_retention",
)


class Cron:
    """When a job runs by itself, and what it is given each time.

        @job(schedule=Cron("0 3 * * *", timezone="Europe/Paris", payload={"full": True}))
        def nightly_report(full): ...

    Args:
        expression: five cron fields (minute hour day month weekday) or an alias such
            as "@hourly" or "@daily".
        timezone: an IANA zone the fields are read in ("UTC" by default).
        payload: the job's payload at every tick.
        on_missed: after downtime, "skip" runs the latest missed tick once; "backfill"
            runs each missed tick, up to `backfill_limit` of the latest.
        options: enqueue options of every tick's job: queue, key, priority,
            max_attempts, lease, expires, result_retention.
    """

    __slots__ = ("backfill_limit", "expression", "on_missed", "options", "payload", "timezone")

    def __init__(
        self,
        expression: str,
        *,
        timezone: str = "UTC",
        payload: Mapping[str, Any] | None = None,
        on_missed: str = "skip",
        backfill_limit: int = 10,
        **options: Any,
    ) -> None:
        self.expression = validate_cron(expression)
        self.timezone = validate_timezone(timezone)
        self.payload = dict(payload or {})
        if on_missed not in ON_MISSED:
            raise InvalidCron(f"on_missed must be 'skip' or 'backfill', not {on_missed!r}.")
        self.on_missed = on_missed
        if not isinstance(backfill_limit, int) or isinstance(backfill_limit, bool):
            raise InvalidCron(f"backfill_limit must be a whole number, not {backfill_limit!r}.")
        if backfill_limit < 1:
            raise InvalidCron(f"backfill_limit must be at least 1, not {backfill_limit}.")
        self.backfill_limit = backfill_limit
        unknown = sorted(set(options) - set(SCHEDULE_OPTIONS))
        if unknown:
            raise InvalidCron(
                f"Unknown schedule options {', '.join(unknown)}; "
                f"a schedule takes {', '.join(SCHEDULE_OPTIONS)}."
            )
        self.options = options

    def __repr__(self) -> str:
        return f"Cron({self.expression!r}, timezone={self.timezone!r})"


@dataclass(frozen=True, slots=True)
class Declaration:
    """A schedule as declared: what `pgjobs_schedule` is synced to."""

    name: str
    kind: str
    cron: str
    timezone: str
    payload: dict[str, Any] = field(default_factory=dict)
    options: dict[str, Any] = field(default_factory=dict)
    on_missed: str = "skip"
    backfill_limit: int = 10

    @classmethod
    def of(cls, name: str, kind: str, cron: Cron) -> Declaration:
        """Validate a schedule of `kind` as a job would be enqueued at its ticks."""
        kind = options.validate_kind(kind)
        resolved = dict(cron.options)
        try:
            options.resolve_job(
                kind, cron.payload, defaults=registry.decorator_defaults(kind), **resolved
            )
        except InvalidJobOption as error:
            raise InvalidCron(f"Schedule {name!r}: {error}") from None
        return cls(
            name=name,
            kind=kind,
            cron=cron.expression,
            timezone=cron.timezone,
            payload=json.loads(encode_payload(cron.payload)),
            options={key: _as_json(value) for key, value in resolved.items()},
            on_missed=cron.on_missed,
            backfill_limit=cron.backfill_limit,
        )


def declared_schedules() -> dict[str, Declaration]:
    """Every schedule declared by a registered job and by `PGJOBS["SCHEDULES"]`, by name.

    Raises:
        InvalidCron: a declaration is invalid, or two declare the same name.
    """
    declared: dict[str, Declaration] = {}
    for kind in registry.registered_kinds():
        definition = registry.get_definition(kind)
        if definition is not None and definition.schedule is not None:
            declared[kind] = Declaration.of(kind, kind, definition.schedule)
    configured = pgjobs_settings.SCHEDULES
    if not isinstance(configured, Mapping):
        raise InvalidCron("PGJOBS['SCHEDULES'] must be a dict of name -> schedule.")
    for name, entry in configured.items():
        if not isinstance(name, str) or not name:
            raise InvalidCron(f"Schedule names must be non-empty strings, not {name!r}.")
        if name in declared:
            raise InvalidCron(
                f"Schedule {name!r} is declared both by @job(schedule=...) and in "
                "PGJOBS['SCHEDULES']; give the setting's another name."
            )
        declared[name] = _from_setting(name, entry)
    return declared


def _from_setting(name: str, entry: Any) -> Declaration:
    if not isinstance(entry, Mapping):
        raise InvalidCron(f"PGJOBS['SCHEDULES'][{name!r}] must be a dict.")
    entry = dict(entry)
    missing = [key for key in ("kind", "cron") if key not in entry]
    if missing:
        raise InvalidCron(
            f"PGJOBS['SCHEDULES'][{name!r}] needs {' and '.join(map(repr, missing))}."
        )
    kind, expression = entry.pop("kind"), entry.pop("cron")
    try:
        cron = Cron(expression, **entry)
    except (TypeError, InvalidJobOption) as error:  # TypeError: a keyword given twice
        raise InvalidCron(f"PGJOBS['SCHEDULES'][{name!r}]: {error}") from None
    return Declaration.of(name, kind, cron)


def _as_json(value: Any) -> Any:
    if isinstance(value, timedelta):
        return value.total_seconds()
    return value


# Cron arithmetic -------------------------------------------------------------------------


def _croniter() -> Any:
    try:
        from croniter import croniter
    except ImportError:  # pragma: no cover - the test extra installs it
        raise ImproperlyConfigured(
            "Schedules need croniter: pip install 'django-pgjobs[cron]'."
        ) from None
    return croniter


def validate_cron(expression: Any) -> str:
    """Return a five-field cron expression (or @alias), or raise InvalidCron."""
    if not isinstance(expression, str) or not expression.strip():
        raise InvalidCron(f"A cron expression must be a non-empty string, not {expression!r}.")
    text = " ".join(expression.split())
    parts = text.split(" ")
    if not text.startswith("@") and len(parts) != 5:
        raise InvalidCron(
            f"Cron expression {text!r} has {len(parts)} fields; five are needed: "
            "minute hour day-of-month month day-of-week."
        )
    croniter = _croniter()
    if not croniter.is_valid(text):
        raise InvalidCron(f"{text!r} is not a valid cron expression.")
    try:
        croniter(text, datetime(2000, 1, 1, tzinfo=UTC)).get_next(datetime)
    except Exception:  # croniter's CroniterBadDateError: no date matches
        raise InvalidCron(f"{text!r} never fires (no date matches it).") from None
    return text


def validate_timezone(name: Any) -> str:
    if not isinstance(name, str) or not name:
        raise InvalidCron(f"A schedule's timezone must be an IANA name, not {name!r}.")
    try:
        zoneinfo.ZoneInfo(name)
    except (zoneinfo.ZoneInfoNotFoundError, ValueError):
        raise InvalidCron(f"Unknown timezone {name!r} (use an IANA name).") from None
    return name


def next_tick(expression: str, timezone: str, after: datetime) -> datetime:
    """The first tick strictly after `after`, in UTC (see `runs_at_wall_time`)."""
    zone = zoneinfo.ZoneInfo(timezone)
    walker = _croniter()(expression, after.astimezone(zone))
    while True:
        tick = walker.get_next(datetime)
        if not _second_time_round(expression, tick):
            return tick.astimezone(UTC)  # type: ignore[no-any-return]


def runs_at_wall_time(expression: str) -> bool:
    """Whether a schedule runs once per local wall-clock tick across a change of the
    clocks: every expression with fixed hours ("30 2 * * *", "0 9,17 * * 1-5").

    The rule, as cron's own: when the clocks go back, a fixed-hour tick whose local time
    happens twice runs at its first occurrence only; when they go forward, one whose
    local time does not exist runs once, at the moment the clocks jump (03:00 for a
    02:30 tick in Europe/Paris). An expression whose hour field has a `*` ("*/15 * * *
    *", "0 */2 * * *") keeps to real time instead: its ticks in a repeated hour run both
    times round, as they are real intervals. Use timezone UTC to have no change at all.
    """
    if expression.startswith("@"):
        return expression != "@hourly"  # @daily, @weekly, @monthly, @yearly: at 00:00
    return "*" not in expression.split(" ")[1]


def _second_time_round(expression: str, tick: datetime) -> bool:
    """Whether `tick` (aware, local) is the second occurrence of a repeated local time
    of a schedule that runs at wall-clock times."""
    first = tick.replace(fold=0)
    second = tick.replace(fold=1)
    if first.utcoffset() == second.utcoffset():  # an ordinary local time
        return False
    repeated = tick.utcoffset() == second.utcoffset()
    return repeated and runs_at_wall_time(expression)


def due_ticks(
    expression: str,
    timezone: str,
    due: datetime,
    now: datetime,
    on_missed: str,
    backfill_limit: int,
) -> list[datetime]:
    """The ticks to run now, oldest first, for a schedule due at `due` (a tick <= `now`).

    "skip": the latest tick not after `now`. "backfill": every tick from `due` to `now`,
    at most the latest `backfill_limit` of them.
    """
    zone = zoneinfo.ZoneInfo(timezone)
    limit = 1 if on_missed == "skip" else backfill_limit
    # Walk back from just after now: get_prev returns ticks strictly before its start.
    walker = _croniter()(expression, (now + timedelta(microseconds=1)).astimezone(zone))
    ticks: list[datetime] = []
    while len(ticks) < limit:
        local = walker.get_prev(datetime)
        tick = local.astimezone(UTC)
        if tick < due:
            break
        if not _second_time_round(expression, local):
            ticks.append(tick)
    return list(reversed(ticks)) or [due]
