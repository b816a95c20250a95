"""`Job.objects`' upkeep of the job table: what the sweeper and the table care run
(expiry, pruning, the table's dead rows and the xmin horizon, VACUUM, claim floors), and
what a claim costs now. `JobManager` builds on it."""

from __future__ import annotations

from django_pgjobs.conf import pgjobs_settings
from django_pgjobs.db import connection as db
from django_pgjobs.db import sql
from django_pgjobs.managers import claiming
from django_pgjobs.managers.floors import ClaimFloors, claim_floors
from django_pgjobs.managers.reads import JobReads
from django_pgjobs.records import ClaimCost

#: Advisory lock key of the sweeper: "pgjobs" as a number, so other locks rarely clash.
SWEEP_LOCK_ID = int.from_bytes(b"pgjobsSW", "big") & 0x7FFF_FFFF_FFFF_FFFF


class JobUpkeep(JobReads):
    """Keep the job table: sweep, prune, VACUUM, and read from floors while the xmin
    horizon is held (and read jobs: JobReads)."""

    def sweep_expired(self, limit: int, *, using: str | None = None) -> tuple[int, int]:
        """Dead-letter up to `limit` live jobs past `expires_at` (S24).

        Returns (dead-lettered, triggers promoted).
        """
        params = {"limit": limit, "errors_kept": pgjobs_settings.ERRORS_KEPT, **db.wake_params()}
        ((dead, promoted, _dependents),) = db.fetchall(sql.SWEEP_EXPIRED, params, using)
        return int(dead), int(promoted)

    def prune_cancel_requests(self, limit: int, *, using: str | None = None) -> int:
        """Delete up to `limit` cancel requests whose job has ended (S38, S24)."""
        return db.rowcount(sql.PRUNE_CANCEL_REQUESTS, {"limit": limit}, using)

    def prune_done(self, limit: int, *, using: str | None = None) -> int:
        """Delete up to `limit` done jobs whose result retention has ended (S24)."""
        return int(db.fetchall(sql.PRUNE_DONE, {"limit": limit}, using)[0][0])

    def table_upkeep(self, *, using: str | None = None) -> tuple[int, int, str | None]:
        """The job table's dead and live rows, and the database's xmin horizon (the
        oldest transaction id something still needs; None: nothing holds one)."""
        ((dead, live, horizon),) = db.fetchall(sql.JOB_TABLE_UPKEEP, {}, using)
        return int(dead or 0), int(live or 0), horizon

    def table_pages(self, *, using: str | None = None) -> tuple[int, int]:
        """The job table's size in pages now, and the size its statistics give, which
        the cached plans of the statements on it were made for."""
        ((pages, planned),) = db.fetchall(sql.JOB_TABLE_PAGES, {}, using)
        return int(pages), int(planned)

    def analyze(self, *, using: str | None = None) -> None:
        """ANALYZE the job table (skipped when another ANALYZE or VACUUM of it runs): every
        backend then plans its statements on it anew; outside any transaction."""
        db.utility(sql.ANALYZE_JOB_TABLE, using)

    def vacuum(self, *, using: str | None = None) -> None:
        """VACUUM the job table (skipped when another VACUUM of it runs); outside any
        transaction."""
        db.utility(sql.VACUUM_JOB_TABLE, using)

    def claim_from_floors(self, held: bool, *, using: str | None = None) -> None:
        """Whether this process's claims read from their queues' floors: while the xmin
        horizon is held (see ClaimFloors)."""
        claim_floors(db.alias(using)).engage(held)

    def lower_claim_floors(self, *, using: str | None = None) -> None:
        """Read this process's claim floors from the start and lower them to what is
        found (ClaimFloors.lower), while they are engaged: a job put back behind its
        queue's floor is claimed from then on."""
        claim_floors(db.alias(using)).lower()

    def reads_from_floors(self, *, using: str | None = None) -> bool:
        """Whether this process's claims read from their queues' floors now."""
        return claim_floors(db.alias(using)).engaged

    def claim_cost(
        self,
        queues: list[str],
        *,
        floors: ClaimFloors | None = None,
        using: str | None = None,
    ) -> ClaimCost:
        """What a claim of a few jobs of `queues` costs now (time, buffers, plan), as a
        worker's connection runs it, from `floors` (None: from each queue's start), in a
        transaction rolled back: no job is taken."""
        return claiming.claim_cost(queues, floors, db.alias(using))

    def try_sweep_lock(self, *, using: str | None = None) -> bool:
        """Take the sweeper's turn for the current transaction (False: another has it)."""
        ((taken,),) = db.fetchall(sql.SWEEP_LOCK, {"lock_id": SWEEP_LOCK_ID}, using)
        return bool(taken)
