"""The sweeper (DESIGN S24): expiry, lapsed claims and retention (of done jobs, dead
letters, per-minute stats and rate-limit claims), in bounded batches; and the job
table's care (`TableCare`): a VACUUM when its dead rows are worth one and can go.

`Sweeper().run_once()` is what `manage.py sweepjobs` and every worker's loop call. Each
batch is one short statement that skips rows other transactions hold, so any number of
replicas may sweep at once without blocking or repeating one another's work. A sweeper
built with `take_turns=True` (the worker's) also runs each batch under a
transaction-level advisory lock and stops when another replica holds it, so replicas
do not all scan the same rows at the same moment.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass, fields

from django.db import DatabaseError, transaction
from psycopg.errors import LockNotAvailable

from django_pgjobs.conf import pgjobs_settings, seconds
from django_pgjobs.models import (
    Batch,
    DeadJob,
    Job,
    JobStats,
    KindStats,
    QueueControl,
    Worker,
)

logger = logging.getLogger("django_pgjobs.maintenance")


@dataclass(frozen=True, slots=True)
class SweepResult:
    """What one sweep moved and deleted."""

    expired: int = 0
    lapsed_requeued: int = 0
    lapsed_dead: int = 0
    triggers_promoted: int = 0
    dead_pruned: int = 0
    done_pruned: int = 0
    #: Jobs a retry, a lapse or a hand-back put back in line as their cancel came (S38).
    cancelled_in_line: int = 0
    #: Partitions of the dead-letter table made ahead, and dropped whole (S44); not rows,
    #: so not in `total`.
    partitions_made: int = 0
    partitions_dropped: int = 0
    #: False when another replica held the sweeper's turn and this sweep stopped early.
    complete: bool = True

    @property
    def total(self) -> int:
        return (
            self.expired
            + self.lapsed_requeued
            + self.lapsed_dead
            + self.triggers_promoted
            + self.dead_pruned
            + self.done_pruned
            + self.cancelled_in_line
        )

    def __str__(self) -> str:
        return " ".join(f"{f.name}={getattr(self, f.name)}" for f in fields(self))


class _TurnTaken(Exception):
    """Another replica is sweeping right now."""


class Sweeper:
    """Runs the maintenance passes of S24, each in batches of `batch_size` rows."""

    def __init__(
        self,
        *,
        batch_size: int | None = None,
        take_turns: bool = False,
        using: str | None = None,
    ) -> None:
        self.batch_size = batch_size or pgjobs_settings.SWEEP_BATCH
        self.take_turns = take_turns
        self.using = using or pgjobs_settings.DATABASE

    def run_once(self) -> SweepResult:
        """Sweep until every pass finds less than a full batch; return what it did."""
        counts = dict.fromkeys(
            (
                "expired",
                "lapsed_requeued",
                "lapsed_dead",
                "triggers_promoted",
                "dead_pruned",
                "done_pruned",
                "cancelled_in_line",
                "partitions_made",
                "partitions_dropped",
            ),
            0,
        )
        limit, using = self.batch_size, self.using

        def expire() -> int:
            dead, promoted = Job.objects.sweep_expired(limit, using=using)
            counts["expired"] += dead
            counts["triggers_promoted"] += promoted
            return dead + promoted

        def rescue_lapsed() -> int:
            rescued = Job.objects.rescue_lapsed(None, limit, using=using)
            counts["lapsed_requeued"] += rescued.requeued
            counts["lapsed_dead"] += rescued.dead
            counts["triggers_promoted"] += rescued.promoted
            return rescued.total

        def prune_done() -> int:
            return Job.objects.prune_done(limit, using=using)

        def sum_stats_hours() -> int:
            return JobStats.objects.sum_hours(using=using) + KindStats.objects.sum_hours(
                using=using
            )

        def prune_stats() -> int:
            return JobStats.objects.prune(limit, using=using) + KindStats.objects.prune(
                limit, using=using
            )

        def prune_workers() -> int:
            return Worker.objects.prune(limit, using=using)

        def prune_rate_claims() -> int:
            return QueueControl.objects.prune_rate_claims(limit, using=using)

        def settle_cancel_requests() -> int:
            cancelled = Job.objects.cancel_requested_in_line(limit, using=using)
            counts["cancelled_in_line"] += cancelled
            return cancelled + Job.objects.prune_cancel_requests(limit, using=using)

        configured = list(pgjobs_settings.QUEUES)
        retentions = {
            queue: pgjobs_settings.queue_options(queue).dead_retention_s for queue in configured
        }
        default_retention = pgjobs_settings.default_options().dead_retention_s
        # The range partitions go whole once their letters are older than the longest
        # retention (none while any queue keeps its letters forever); a shorter one is
        # kept by deleting letters, as is every retention in the default partition.
        kept = [*retentions.values(), default_retention]
        horizon = None if None in kept else max(r for r in kept if r is not None)

        def strays_only(retention_s: int) -> bool:
            return horizon is not None and retention_s >= horizon

        def prune_dead_of(queue: str, retention_s: int) -> Callable[[], int]:
            return lambda: DeadJob.objects.prune_in_queues(
                [queue], retention_s, limit, strays_only=strays_only(retention_s), using=using
            )

        def prune_dead_elsewhere(retention_s: int) -> Callable[[], int]:
            return lambda: DeadJob.objects.prune_outside_queues(
                configured,
                retention_s,
                limit,
                strays_only=strays_only(retention_s),
                using=using,
            )

        span = seconds(pgjobs_settings.DEAD_PARTITION_SPAN, "DEAD_PARTITION_SPAN")

        def make_partitions() -> int:
            return DeadJob.objects.make_partitions(span, using=using)

        def drop_partitions() -> int:
            assert horizon is not None
            return DeadJob.objects.drop_partitions(horizon, using=using)

        def prune_batches(retention_s: int) -> Callable[[], int]:
            return lambda: Batch.objects.prune(retention_s, limit, using=using)

        passes: list[tuple[str | None, Callable[[], int]]] = [
            (None, expire),
            (None, rescue_lapsed),
            ("done_pruned", prune_done),
            (None, sum_stats_hours),
            (None, prune_stats),
            (None, prune_rate_claims),
            (None, settle_cancel_requests),
            (None, prune_workers),
        ]
        for queue, retention in retentions.items():
            if retention is not None:
                passes.append(("dead_pruned", prune_dead_of(queue, retention)))
        if default_retention is not None:
            passes.append(("dead_pruned", prune_dead_elsewhere(default_retention)))
            # An ended batch (S31) is kept as long as a dead letter of the default queue.
            passes.append((None, prune_batches(default_retention)))
        complete = True
        try:
            counts["partitions_made"] = self._partitions(make_partitions)
            if horizon is not None:
                counts["partitions_dropped"] = self._partitions(drop_partitions)
            for counter, batch in passes:
                done = self._drain(batch)
                if counter is not None:
                    counts[counter] += done
        except _TurnTaken:
            complete = False
        result = SweepResult(**counts, complete=complete)
        if result.total or result.partitions_made or result.partitions_dropped:
            logger.info("sweep %s", result)
        return result

    def _partitions(self, step: Callable[[], int]) -> int:
        """Make or drop the dead-letter table's partitions (one statement, not batches).
        A lock not had at once is left to the next sweep; another failure (a role that
        may not call the functions, a migration not run) is logged as a warning with its
        reason, every sweep, and the rest of the sweep goes on: meanwhile letters go to
        the default partition, which is pruned row by row."""
        try:
            return self._run_batch(step)
        except _TurnTaken:
            raise
        except DatabaseError as error:
            waited = isinstance(error.__cause__, LockNotAvailable)
            logger.log(
                logging.INFO if waited else logging.WARNING,
                "the dead-letter partitions were left as they are (%s); the next sweep tries "
                "again, and meanwhile new letters go to pgjobs_dead_default",
                "a lock was not had at once" if waited else str(error).strip().splitlines()[0],
            )
            return 0

    def _drain(self, batch: Callable[[], int]) -> int:
        """Run `batch` until it handles less than a full batch; return the rows handled."""
        total = 0
        while True:
            done = self._run_batch(batch)
            total += done
            if done < self.batch_size:
                return total

    def _run_batch(self, batch: Callable[[], int]) -> int:
        if not self.take_turns:
            return batch()
        with transaction.atomic(using=self.using):
            if not Job.objects.try_sweep_lock(using=self.using):
                raise _TurnTaken
            return batch()


#: What a worker logs when its claims start reading from their queues' floors (the
#: horizon holds) and when they stop: the pressure benchmark, which starts its worker with
#: the package's own log handler, reads from these which its claims do.
FLOORS_ON = "claims read from their queues' floors"
FLOORS_OFF = "claims read each queue from its start"
#: The dead rows below which the table care neither VACUUMs nor engages the floors.
MIN_DEAD_ROWS = 1000
#: The dead rows worth a VACUUM however many live ones wait: a claim walks the dead
#: entries at the head of the claim index, not the backlog behind them (at 5,000 jobs/s
#: a backlog outgrew the dead rows and no VACUUM came: after ten minutes 184,000 dead
#: rows, claims of 4.4 ms and 764 buffers, and the worker fell behind).
DEAD_ENOUGH_ROWS = 50_000


#: How many times its statistics' size the job table grows before the table care ANALYZEs
#: it, so that the statements on it are planned for its size, and the size (pages) below
#: which its growth does not count.
REPLAN_GROWTH = 2
REPLAN_MIN_PAGES = 64


class TableCare:
    """VACUUM of the job table when its dead rows outnumber its live ones or reach
    `dead_enough` (and at least `min_dead`) and a VACUUM can remove them; claim floors
    while the horizon is held.

    Every claimed and every finished job leaves a dead row and dead index entries, which
    a claim walks past until VACUUM removes them. Autovacuum comes when it comes (up to a
    minute, longer when busy); this comes within the worker's interval. A VACUUM can
    remove only what died before the database's xmin horizon: while the horizon a VACUUM
    of this process ran under still holds (a transaction left open, a long report, a
    replication slot), another is in vain, and none is run until the horizon moves.
    The horizon is held when two looks in a row find it where it was and at least
    `min_dead` dead rows: meanwhile this process's claims read from their queues' floors
    (ClaimFloors), past the dead entries they would otherwise walk. A backlog does not
    delay that: the claims walk the dead entries however many live rows wait behind them.
    A table grown REPLAN_GROWTH times past the size of its statistics is ANALYZEd, so that
    every backend plans its statements for the table as it is.
    """

    def __init__(
        self,
        *,
        using: str | None = None,
        min_dead: int = MIN_DEAD_ROWS,
        dead_enough: int = DEAD_ENOUGH_ROWS,
    ) -> None:
        self.using = using or pgjobs_settings.DATABASE
        self.min_dead = min_dead
        self.dead_enough = dead_enough
        #: The horizon the last VACUUM of this process ran under (None: none ran yet).
        self._vacuumed_under: tuple[str | None] | None = None
        #: The horizon the last look found (None: none yet, or nothing held one).
        self._last_horizon: str | None = None
        self._held = False
        self._analyze_warned = False

    def run_once(self) -> bool:
        """Look, and VACUUM when it is due; return whether it ran. Claims read from
        their queues' floors while the horizon is held (ClaimFloors), and from the start
        once it moved and the VACUUM that follows ran: until then the dead entries the
        horizon kept are still in the claims' way."""
        dead, live, horizon = Job.objects.table_upkeep(using=self.using)
        still = horizon is not None and horizon == self._last_horizon
        self._last_horizon = horizon
        held = still and dead >= self.min_dead
        if held:
            self._claim_from_floors(True, horizon, dead)
        try:
            vacuumed = self._vacuum_if_due(dead, live, horizon)
        finally:
            if not held:
                self._claim_from_floors(False, horizon, dead)
        if not vacuumed:
            self._analyze_if_grown()
        return vacuumed

    def _analyze_if_grown(self) -> None:
        """ANALYZE the job table once it has grown REPLAN_GROWTH times past the size its
        statistics give: a worker keeps each statement's generic plan until new
        statistics come, and one made for a table of a few pages probes rows by a
        sequential scan, which at 80 MB took an ack one to two seconds. While the horizon
        is held, no VACUUM brings them; nor does one while a backlog grows."""
        pages, planned = Job.objects.table_pages(using=self.using)
        if pages <= REPLAN_GROWTH * max(planned, REPLAN_MIN_PAGES):
            return
        Job.objects.analyze(using=self.using)
        if Job.objects.table_pages(using=self.using)[1] != planned:
            logger.info(
                "analyzed the job table: %d pages, %d in the statistics before",
                pages,
                planned,
            )
        elif not self._analyze_warned:
            # Skipped: another ANALYZE or VACUUM of it ran, or this role does not own it.
            self._analyze_warned = True
            logger.warning(
                "the job table has %d pages, %d in its statistics, and an ANALYZE of it "
                "changed nothing (a VACUUM of it ran, or this role does not own it): if "
                "this repeats, run the workers as the table's owner (the role that ran the "
                "migrations), or keep autovacuum's ANALYZE of it on",
                pages,
                planned,
            )

    def _vacuum_if_due(self, dead: int, live: int, horizon: str | None) -> bool:
        in_vain = horizon is not None and self._vacuumed_under == (horizon,)
        if dead < max(self.min_dead, min(live, self.dead_enough)) or in_vain:
            return False  # few dead rows, or the horizon that held them still holds
        Job.objects.vacuum(using=self.using)
        self._vacuumed_under = (horizon,)
        logger.info("vacuumed the job table: %d dead rows beside %d live ones", dead, live)
        return True

    def _claim_from_floors(self, held: bool, horizon: str | None, dead: int) -> None:
        if held != self._held:
            logger.info(
                "the xmin horizon %s: %s",
                f"holds at {horizon} ({dead} dead rows, which no VACUUM removes while it holds)"
                if held
                else "moved",
                FLOORS_ON if held else FLOORS_OFF,
            )
            self._held = held
        Job.objects.claim_from_floors(held, using=self.using)

    def lower_floors(self) -> None:
        """While claims read from floors, read the floors from the start and lower them
        to a job put back behind one (ClaimFloors.lower): every FLOORS_RESET_S, on the
        maintenance thread, since that read walks every dead entry the horizon keeps."""
        Job.objects.lower_claim_floors(using=self.using)
