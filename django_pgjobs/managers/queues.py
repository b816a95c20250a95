"""`QueueControl.objects`: pause, resume and limit queues; every replica's claims obey."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import fields
from typing import TYPE_CHECKING, Any

from django.db import models

from django_pgjobs import options
from django_pgjobs.conf import pgjobs_settings
from django_pgjobs.db import connection as db
from django_pgjobs.db import sql
from django_pgjobs.exceptions import InvalidJobOption
from django_pgjobs.limits import Rate
from django_pgjobs.records import Count, QueueOverview, QueueStatus

if TYPE_CHECKING:
    from django_pgjobs.models import QueueControl  # noqa: F401

#: Per database, per queue: whether it has a limit or a rate (claimed by
#: CLAIM_LIMITED_JOBS), as this process last learnt it. The fast claim, which covers
#: every queue of a claim that LOCK_LIMITED_QUEUES did not lock (a limit lifted, a queue
#: paused), says which of its queues have one; it skips those by itself, as the keyed
#: claim does, so knowledge gone stale costs a claim statement, never a limit. A worker
#: reads LIMITED_QUEUES only for a queue it knows nothing of, not before every wake-up's
#: claim.
_limits_known: dict[str, dict[str, bool]] = {}


def limited_queues(alias: str, names: Sequence[str]) -> frozenset[str]:
    """Those of `names` with a limit on their running jobs or a rate, as last learnt."""
    known = _limits_known.setdefault(alias, {})
    if any(name not in known for name in names):
        limited = {row[0] for row in db.fetchall(sql.LIMITED_QUEUES, {}, alias)}
        known.update({name: name in limited for name in names})
    return frozenset(name for name in names if known.get(name))


def limits_seen(alias: str, queues: Iterable[str], limited: Iterable[str]) -> bool:
    """A claim statement read which of `queues` have a limit (`limited`); return whether
    it found one this process took for unlimited (its jobs were skipped: claim again)."""
    known = _limits_known.setdefault(alias, {})
    found = set(limited)
    newly = any(name in found and known.get(name) is False for name in queues)
    known.update({name: name in found for name in queues})
    return newly


def forget_limits() -> None:
    """Make the next claim read afresh which queues have a limit (after a change)."""
    _limits_known.clear()


class QueueControlManager(models.Manager["QueueControl"]):
    """Pause, resume and limit queues; every replica's claims obey at once."""

    def pause(self, queues: str | Sequence[str], *, using: str | None = None) -> list[str]:
        """Pause `queues` (rows are made for queues without one); return their names."""
        names = options.validate_queue_names(queues)
        return sorted(row[0] for row in db.fetchall(sql.PAUSE_QUEUES, {"queues": names}, using))

    def resume(self, queues: str | Sequence[str], *, using: str | None = None) -> list[str]:
        """Resume the paused ones of `queues` and wake their workers; return those resumed."""
        names = options.validate_queue_names(queues)
        params = {"queues": names, **db.wake_params()}
        return sorted(row[0] for row in db.fetchall(sql.RESUME_QUEUES, params, using))

    def set_limit(self, queue: str, max_running: int | None, *, using: str | None = None) -> bool:
        """Allow at most `max_running` running jobs of `queue` across every worker (None:
        no limit). Returns False when the limit was already so.

        Raises:
            InvalidJobOption: a bad queue name or limit.
            ValueError: the queue's limit is set in settings (change it there).
        """
        name = options.validate_queue_name(queue)
        limit = _validated_limit(max_running)
        configured = pgjobs_settings.queue_limits()
        if name in configured:
            raise ValueError(
                f"Queue {name!r} has its limit in settings "
                f"(PGJOBS['QUEUES'][{name!r}]['MAX_RUNNING'] = {configured[name]}): "
                "change it there."
            )
        changed = self._write_limit(name, limit, from_settings=False, using=using)
        forget_limits()
        return changed

    def set_rate(self, queue: str, rate: Any, *, using: str | None = None) -> bool:
        """Admit at most `rate` claims of `queue`'s jobs per period across every worker
        ("100/m", a Rate, or None for no rate; S35), counted on the database clock.
        Returns False when the rate was already so.

        Raises:
            InvalidLimit: a bad queue name or rate ("fast"); nothing is written.
        """
        name = options.validate_queue_name(queue)
        parsed = None if rate is None else Rate.parse(rate)
        params = {
            "queue": name,
            "rate_limit": None if parsed is None else parsed.limit,
            "rate_period_s": None if parsed is None else parsed.period_s,
            **db.wake_params(),
        }
        changed = bool(db.fetchall(sql.SET_QUEUE_RATE, params, using))
        forget_limits()
        return changed

    def prune_rate_claims(self, limit: int, *, using: str | None = None) -> int:
        """Delete up to `limit` rate-limit claims older than any rate period (S35): the
        claims prune their own scope's, this the rest (scopes no longer claimed)."""
        return db.rowcount(sql.PRUNE_RATE_CLAIMS, {"limit": limit}, using)

    def sync_settings(self, *, using: str | None = None) -> None:
        """Apply the limits of PGJOBS['QUEUES'] (as every worker does when it starts)."""
        configured = pgjobs_settings.queue_limits()
        with db.atomic(using):
            for name, limit in sorted(configured.items()):
                self._write_limit(name, limit, from_settings=True, using=using)
            db.fetchall(sql.LIFT_SETTINGS_LIMITS, {"queues": sorted(configured)}, using)
        forget_limits()

    def _write_limit(
        self, name: str, limit: int | None, *, from_settings: bool, using: str | None
    ) -> bool:
        params = {
            "queue": name,
            "max_running": limit,
            "from_settings": from_settings,
            **db.wake_params(),
        }
        return bool(db.fetchall(sql.SET_QUEUE_LIMIT, params, using))

    def status(self, *, using: str | None = None) -> list[QueueStatus]:
        """Every queue with jobs, dead letters, a control or a setting, at a glance."""
        from django_pgjobs.models import Job

        alias = db.alias(using)
        controls = {row.name: row for row in self.using(alias).all()}
        overview = {row.queue: row for row in Job.objects.overview(using=alias)}
        empty = QueueOverview("", Count(0), Count(0), Count(0), Count(0), None)
        statuses = []
        for name in sorted(set(overview) | set(controls)):
            seen = overview.get(name, empty)
            control = controls.get(name)
            counts = {field.name: getattr(seen, field.name) for field in fields(QueueOverview)}
            counts["queue"] = name
            statuses.append(
                QueueStatus(
                    **counts,
                    paused=bool(control and control.paused),
                    max_running=control.max_running if control else None,
                    rate=_rate_of(control),
                )
            )
        return statuses

    def names(self, *, using: str | None = None) -> list[str]:
        """Every queue the database knows of: with a row (a control), jobs or dead
        letters; and the configured ones (PGJOBS["QUEUES"])."""
        from django_pgjobs.models import Job

        alias = db.alias(using)
        controlled = self.using(alias).values_list("name", flat=True)
        live = Job.objects.queue_names(using=alias)
        dead = Job.objects.queue_names(dead=True, using=alias)
        return sorted({*controlled, *live, *dead})

    def holding_anything(self, queues: Sequence[str], *, using: str | None = None) -> list[str]:
        """Those of `queues` the database has a row, a job in any state (waiting and done
        too) or a dead letter of."""
        names = options.validate_queue_names(list(queues))
        rows = db.fetchall(sql.QUEUES_HOLDING_ANYTHING, {"queues": names}, using)
        return [row[0] for row in rows]

    def ensure(self, queues: Iterable[str], *, using: str | None = None) -> None:
        """Give every queue of `queues` a row (no pause, no limit) if it has none."""
        names = options.validate_queue_names(list(queues)) if queues else []
        self.using(db.alias(using)).bulk_create(
            [self.model(name=name) for name in names], ignore_conflicts=True
        )


def _rate_of(control: Any) -> str | None:
    if control is None or control.rate_limit is None or control.rate_period_s is None:
        return None
    return str(Rate(control.rate_limit, control.rate_period_s))


def _validated_limit(max_running: Any) -> int | None:
    if max_running is None:
        return None
    if not isinstance(max_running, int) or isinstance(max_running, bool) or max_running < 1:
        raise InvalidJobOption(
            f"A queue's max_running must be a whole number >= 1 or None, not {max_running!r}."
        )
    if max_running > 2**31 - 1:
        raise InvalidJobOption(f"max_running {max_running} is too large.")
    return max_running
