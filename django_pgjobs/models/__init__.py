"""The tables: `pgjobs_job` (live work), `pgjobs_dead` (dead letters), and the queue
controls and schedules beside them; the tables of workflows (edges,
batches and their callbacks) are in `models.workflows`, the worker registry in
`models.workers`, the workers' counts for the dashboard in `models.stats`.

Fields, indexes and constraints only; every statement that moves jobs is a manager's
(`managers/`), and its SQL lives in `db/sql/`.
"""

from __future__ import annotations

from typing import Any, ClassVar

from django.db import models
from django.db.models import F, Q
from django.db.models.functions import Now

from django_pgjobs import managers
from django_pgjobs.models.stats import (  # the workers' per-minute and per-hour counts
    Dashboard as Dashboard,
)
from django_pgjobs.models.stats import (
    JobStats as JobStats,
)
from django_pgjobs.models.stats import (
    JobStatsHour as JobStatsHour,
)
from django_pgjobs.models.stats import (
    KindStats as KindStats,
)
from django_pgjobs.models.stats import (
    KindStatsHour as KindStatsHour,
)
from django_pgjobs.models.workers import Worker as Worker  # the worker registry
from django_pgjobs.models.workflows import (  # the tables of workflows (S29-S31)
    Batch as Batch,
)
from django_pgjobs.models.workflows import (
    BatchCallback as BatchCallback,
)
from django_pgjobs.models.workflows import (
    Dependency as Dependency,
)
from django_pgjobs.options import KIND_MAX_LENGTH, QUEUE_NAME_MAX_LENGTH
from django_pgjobs.states import LIVE_STATES, DeadCategory, JobState

#: How the reason of a letter of `pgjobs_end_parents` (S30) begins: the one writer that
#: names no category (see DeadJob.category).
DEPENDENCY_REASON_PREFIX = "dependency failed: "
#: The categories a statement writes into `pgjobs_dead.category`.
STORED_DEAD_CATEGORIES = [c.value for c in DeadCategory if c != DeadCategory.DEPENDENCY]


class JobColumns(models.Model):
    """The columns a job keeps whether it is live or dead."""

    queue = models.CharField(max_length=QUEUE_NAME_MAX_LENGTH)
    kind = models.CharField(max_length=KIND_MAX_LENGTH, help_text="The registered job name.")
    key = models.TextField(
        null=True, blank=True, help_text="Coalescing key: one live job per (kind, key)."
    )
    priority = models.SmallIntegerField(db_default=0, help_text="Higher runs first, -100..100.")
    run_after = models.DateTimeField(db_default=Now())
    attempts = models.IntegerField(db_default=0, help_text="Claims so far.")
    max_attempts = models.IntegerField()
    lease_s = models.IntegerField(help_text="Seconds a claim lasts without a heartbeat.")
    claimed_by = models.UUIDField(null=True, blank=True, help_text="The current claim's token.")
    claimed_until = models.DateTimeField(null=True, blank=True)
    claimed_at = models.DateTimeField(null=True, blank=True)
    started_at = models.DateTimeField(
        null=True, blank=True, help_text="When the job was first claimed."
    )
    worker_id = models.TextField(null=True, blank=True, help_text="Worker of the latest claim.")
    expires_at = models.DateTimeField(null=True, blank=True)
    payload = models.JSONField(db_default=models.Value({}, models.JSONField()))
    result = models.JSONField(null=True, blank=True)
    last_error = models.TextField(null=True, blank=True)
    errors = models.JSONField(
        db_default=models.Value([], models.JSONField()),
        help_text="Failed attempts, oldest first: attempt, at, error, traceback, worker_id.",
    )
    rerun_after = models.DateTimeField(null=True, blank=True)
    rerun_payload = models.JSONField(
        null=True, blank=True, help_text="A trigger that arrived while the job was running."
    )
    rerun_expires_at = models.DateTimeField(null=True, blank=True)
    result_ttl_s = models.IntegerField(
        null=True, blank=True, help_text="Seconds to keep the result after ack (null: delete)."
    )
    created_at = models.DateTimeField(db_default=Now())
    finished_at = models.DateTimeField(null=True, blank=True)
    timeout_s = models.FloatField(
        null=True, blank=True, help_text="Seconds an attempt may run (empty: no timeout)."
    )
    progress = models.JSONField(
        null=True,
        blank=True,
        help_text="What the handler last reported: fraction, message, data and when.",
    )
    limit_key = models.TextField(
        null=True,
        blank=True,
        help_text="The concurrency key value whose limits this job obeys (empty: none).",
    )
    concurrency_limit = models.IntegerField(
        null=True, blank=True, help_text="At most this many jobs of the key run at once."
    )
    rate_limit = models.IntegerField(
        null=True, blank=True, help_text="At most this many claims of the key per period."
    )
    rate_period_s = models.FloatField(null=True, blank=True, help_text="The rate's period.")
    has_parents = models.BooleanField(
        db_default=False, help_text="Written with after=: its dependencies name it (S29)."
    )
    has_children = models.BooleanField(
        db_default=False, help_text="Some job waits for its end (S29): its end tells them."
    )

    class Meta:
        abstract = True

    def __str__(self) -> str:
        return f"{self.kind}#{self.pk}"


def _shared_constraints(table: str) -> list[models.BaseConstraint]:
    return [
        models.CheckConstraint(
            condition=Q(priority__gte=-100, priority__lte=100), name=f"{table}_priority_range"
        ),
        models.CheckConstraint(condition=Q(attempts__gte=0), name=f"{table}_attempts_gte_0"),
        models.CheckConstraint(
            condition=Q(max_attempts__gte=1), name=f"{table}_max_attempts_gte_1"
        ),
        models.CheckConstraint(condition=Q(lease_s__gte=1), name=f"{table}_lease_s_gte_1"),
        models.CheckConstraint(
            condition=Q(timeout_s__gt=0) | Q(timeout_s__isnull=True),
            name=f"{table}_timeout_s_gt_0",
        ),
        # Limits belong to a key, and a rate is a number of claims per period.
        models.CheckConstraint(
            condition=Q(limit_key__isnull=False)
            | Q(concurrency_limit__isnull=True, rate_limit__isnull=True),
            name=f"{table}_limits_have_key",
        ),
        models.CheckConstraint(
            condition=Q(concurrency_limit__gte=1) | Q(concurrency_limit__isnull=True),
            name=f"{table}_concurrency_gte_1",
        ),
        models.CheckConstraint(
            condition=Q(rate_limit__isnull=True, rate_period_s__isnull=True)
            | Q(rate_limit__gte=1, rate_period_s__gt=0),
            name=f"{table}_rate_valid",
        ),
    ]


class Job(JobColumns):
    """A live job: pending, running, or done while its result is retained."""

    id = models.BigAutoField(primary_key=True)
    state = models.CharField(max_length=16, choices=JobState.choices, db_default=JobState.PENDING)
    purge_at = models.DateTimeField(
        null=True, blank=True, help_text="When a done job's retained result is deleted."
    )
    parents_left = models.IntegerField(
        db_default=0, help_text="Parents not yet ended; waiting while above 0 (S29)."
    )
    trace_context = models.JSONField(
        null=True,
        blank=True,
        help_text="The W3C trace context of its enqueue (traceparent, tracestate), when it "
        "was enqueued inside a trace with tracing on: its runs link to it.",
    )

    objects: ClassVar[managers.JobManager] = managers.JobManager()

    class Meta:
        db_table = "pgjobs_job"
        indexes: ClassVar[list[models.Index]] = [
            # The claim walks this index in claim order and stops after LIMIT rows.
            models.Index(
                F("queue"),
                F("priority").desc(),
                F("run_after"),
                F("id"),
                name="pgjobs_job_claim",
                condition=Q(state=JobState.PENDING, limit_key__isnull=True),
            ),
            # Jobs with a concurrency key (S34): the keyed claim finds each key of a
            # queue by a probe here, and walks one key's jobs in claim order.
            models.Index(
                F("queue"),
                F("limit_key"),
                F("priority").desc(),
                F("run_after"),
                F("id"),
                name="pgjobs_job_keyed",
                condition=Q(state=JobState.PENDING, limit_key__isnull=False),
            ),
            # A key's running jobs, counted by the keyed claim.
            models.Index(
                fields=["limit_key"],
                name="pgjobs_job_keyed_running",
                condition=Q(state=JobState.RUNNING, limit_key__isnull=False),
            ),
            # Lapsed leases: crash recovery and the pre-claim dead-lettering.
            models.Index(
                fields=["claimed_until"],
                name="pgjobs_job_lease",
                condition=Q(state=JobState.RUNNING),
            ),
            # The worker's "sleep until the next scheduled job", one probe per queue.
            models.Index(
                fields=["queue", "run_after"],
                name="pgjobs_job_schedule",
                condition=Q(state=JobState.PENDING),
            ),
            models.Index(
                fields=["expires_at"],
                name="pgjobs_job_expiry",
                condition=Q(expires_at__isnull=False, state__in=LIVE_STATES),
            ),
            models.Index(
                fields=["purge_at"], name="pgjobs_job_purge", condition=Q(state=JobState.DONE)
            ),
            # The dashboard's counts of retrying and done jobs per queue.
            models.Index(
                fields=["queue"],
                name="pgjobs_job_retrying",
                condition=Q(state=JobState.PENDING, attempts__gt=0),
            ),
            models.Index(
                fields=["queue"], name="pgjobs_job_done", condition=Q(state=JobState.DONE)
            ),
            # The admin's "waiting" filter, newest first: a few rows among millions.
            models.Index(
                fields=["id"], name="pgjobs_job_waiting", condition=Q(state=JobState.WAITING)
            ),
            # The admin's kind filter, newest first, and its search of a kind by its start.
            # Partial on what every row holds, so that only a statement that names a kind
            # reads it: a claim's or an ack's probe by id must never walk it for its id.
            models.Index(
                fields=["kind", "id"],
                name="pgjobs_job_kind",
                opclasses=["text_pattern_ops", "int8_ops"],
                condition=Q(kind__isnull=False),
            ),
            # The console's running jobs per queue: which queues, how many (capped).
            models.Index(
                fields=["queue"], name="pgjobs_job_running", condition=Q(state=JobState.RUNNING)
            ),
            models.Index(
                fields=["key"],
                name="pgjobs_job_key_prefix",
                opclasses=["text_pattern_ops"],
                condition=Q(key__isnull=False),
            ),
        ]
        constraints: ClassVar[list[models.BaseConstraint]] = [
            # One live job per (kind, key): the enqueue's ON CONFLICT target.
            models.UniqueConstraint(
                fields=["kind", "key"],
                name="pgjobs_job_live_key",
                condition=Q(key__isnull=False, state__in=LIVE_STATES),
            ),
            models.CheckConstraint(
                condition=Q(state__in=JobState.values), name="pgjobs_job_state_valid"
            ),
            # A running job always has a claim, so its lease can lapse and be recovered.
            models.CheckConstraint(
                condition=~Q(state=JobState.RUNNING)
                | Q(
                    claimed_by__isnull=False,
                    claimed_until__isnull=False,
                    claimed_at__isnull=False,
                ),
                name="pgjobs_job_running_has_claim",
            ),
            *_shared_constraints("pgjobs_job"),
        ]

    def save(self, *args: Any, **kwargs: Any) -> None:
        raise TypeError(
            "Jobs are written by Job.objects (enqueue, claims, handles), never by save()."
        )


class DeadJob(JobColumns):
    """A dead letter: a job that failed, ran out of attempts, or expired. Same id as it had."""

    id = models.BigIntegerField(primary_key=True)
    reason = models.TextField(help_text="Why it died: 'max attempts exceeded', 'failed', ...")
    #: Written by every statement of `db/sql` that inserts a dead letter, in that
    #: statement. Empty (NULL) where no writer named it: the letters of the workflows'
    #: `pgjobs_end_parents` function (S30), whose reasons read "dependency failed: <id>"
    #: ("dependency" is never stored: it is read from that), and letters older than
    #: migration 0010 whose reason matched no category, or that a worker of an older
    #: version wrote during an upgrade. Read it through `filed_category` and
    #: `in_category`, which tell those apart by the reason.
    category = models.CharField(
        max_length=16,
        choices=DeadCategory.choices,
        null=True,
        blank=True,
        help_text="Why it died, in a word (empty: a dependency failed, or not recorded).",
    )
    died_at = models.DateTimeField(db_default=Now())

    objects: ClassVar[managers.DeadJobManager] = managers.DeadJobManager()

    class Meta:
        db_table = "pgjobs_dead"
        verbose_name = "dead letter"
        indexes: ClassVar[list[models.Index]] = [
            models.Index(fields=["died_at"], name="pgjobs_dead_died_at"),
            models.Index(fields=["queue", "died_at"], name="pgjobs_dead_queue"),
            # The admin's reason filter, newest first; with a queue too.
            models.Index(fields=["category", "died_at"], name="pgjobs_dead_category"),
            models.Index(
                fields=["queue", "category", "died_at"], name="pgjobs_dead_queue_category"
            ),
            # The admin's kind filter, newest first, and its search of a kind by its start.
            models.Index(
                fields=["kind", "died_at", "id"],
                name="pgjobs_dead_kind",
                opclasses=["text_pattern_ops", "timestamptz_ops", "int8_ops"],
                condition=Q(kind__isnull=False),  # as pgjobs_job_kind
            ),
            models.Index(
                fields=["key"],
                name="pgjobs_dead_key_prefix",
                opclasses=["text_pattern_ops"],
                condition=Q(key__isnull=False),
            ),
        ]
        constraints: ClassVar[list[models.BaseConstraint]] = [
            # "dependency" is read from NULL and the reason, never stored (see category).
            models.CheckConstraint(
                condition=Q(category__in=STORED_DEAD_CATEGORIES) | Q(category__isnull=True),
                name="pgjobs_dead_category_valid",
            ),
            *_shared_constraints("pgjobs_dead"),
        ]

    def save(self, *args: Any, **kwargs: Any) -> None:
        raise TypeError("Dead jobs are written by the queue, never by save().")

    @property
    def filed_category(self) -> DeadCategory | None:
        """The letter's category: the stored one, else "dependency" for a letter of
        `pgjobs_end_parents`; None when it was never recorded."""
        if self.category:
            return DeadCategory(self.category)
        if self.reason.startswith(DEPENDENCY_REASON_PREFIX):
            return DeadCategory.DEPENDENCY
        return None

    @staticmethod
    def in_category(category: DeadCategory | None) -> Q:
        """The letters whose `filed_category` is `category` (None: not recorded)."""
        of_end_parents = Q(reason__startswith=DEPENDENCY_REASON_PREFIX)
        if category is None:
            return Q(category__isnull=True) & ~of_end_parents
        if category == DeadCategory.DEPENDENCY:
            return Q(category__isnull=True) & of_end_parents
        return Q(category=category)


class QueueControl(models.Model):
    """A queue's controls, enforced at claim time by every replica: paused, and the most
    jobs of it running at once across all of them (`max_running`).

    Rows exist for queues someone paused or limited, and for every configured queue.
    """

    name = models.CharField(max_length=QUEUE_NAME_MAX_LENGTH, primary_key=True)
    paused = models.BooleanField(
        db_default=False, help_text="No replica claims a paused queue's jobs; enqueues land."
    )
    paused_at = models.DateTimeField(null=True, blank=True)
    max_running = models.IntegerField(
        null=True,
        blank=True,
        help_text="At most this many of the queue's jobs run at once, across every worker "
        "(empty: no limit). A lapsed lease frees its slot.",
    )
    rate_limit = models.IntegerField(
        null=True,
        blank=True,
        help_text="At most this many of the queue's jobs claimed per period (empty: none).",
    )
    rate_period_s = models.FloatField(null=True, blank=True, help_text="The rate's period.")
    limit_from_settings = models.BooleanField(
        db_default=False,
        help_text="The limit comes from PGJOBS['QUEUES'][name]['MAX_RUNNING'] and is set "
        "again by every worker that starts.",
    )
    updated_at = models.DateTimeField(db_default=Now())

    objects: ClassVar[managers.QueueControlManager] = managers.QueueControlManager()

    class Meta:
        db_table = "pgjobs_queue"
        verbose_name = "queue"
        constraints: ClassVar[list[models.BaseConstraint]] = [
            models.CheckConstraint(
                condition=Q(max_running__gte=1) | Q(max_running__isnull=True),
                name="pgjobs_queue_max_running_gte_1",
            ),
            models.CheckConstraint(
                condition=Q(rate_limit__isnull=True, rate_period_s__isnull=True)
                | Q(rate_limit__gte=1, rate_period_s__gt=0),
                name="pgjobs_queue_rate_valid",
            ),
        ]

    def __str__(self) -> str:
        return self.name


class RateClaim(models.Model):
    """One claim counted against a rate limit (S35): a queue's ("queue:<name>") or a
    concurrency key's ("key:<value>"). A claim under a limit of N per period is admitted
    while fewer than N of its scope's rows are younger than the period, on the database
    clock; the claims prune their scope's old rows, the sweeper the rest."""

    id = models.BigAutoField(primary_key=True)
    scope = models.TextField()
    at = models.DateTimeField(db_default=Now())

    class Meta:
        db_table = "pgjobs_rate_claim"
        indexes: ClassVar[list[models.Index]] = [
            models.Index(fields=["scope", "at"], name="pgjobs_rate_claim_scope_at")
        ]

    def __str__(self) -> str:
        return f"{self.scope}@{self.at}"


class CancelRequest(models.Model):
    """A cancel of a running job whose row a transaction held when it came (S38): a
    fence, a transaction-mode job, a heartbeat or an ack at that moment. Written by the
    statement that accepted the cancel, without waiting for the row; the job's worker
    reads it at its next heartbeat (or sooner, by NOTIFY), tells the handler, and every
    later end of that claim is a cancellation: an ack, a retry or a lapse of it moves
    the job to the dead table with the request's reason. Keyed by job, it binds the job
    until the job ends: when a retry, a rescue or a hand-back put the job back in line
    as the cancel came, its next claim dead-letters it unrun (or the sweeper does).
    `claimed_by` is the claim the cancel saw."""

    job_id = models.BigIntegerField(primary_key=True)
    claimed_by = models.UUIDField()
    reason = models.TextField()
    requested_at = models.DateTimeField(db_default=Now())

    class Meta:
        db_table = "pgjobs_cancel_request"

    def __str__(self) -> str:
        return f"cancel of job {self.job_id}: {self.reason}"


class Schedule(models.Model):
    """A periodic job: a cron expression whose every tick enqueues one job, exactly once
    across any number of replicas (the replica that advances `next_run_at` first enqueues
    the tick's job in the same transaction).

    Declared in PGJOBS["SCHEDULES"] or with @job(schedule=...), and synced by every worker
    as it starts; a schedule no longer declared is disabled and kept with its history.
    """

    class OnMissed(models.TextChoices):
        SKIP = "skip", "Run once for the latest missed tick"
        BACKFILL = "backfill", "Run every missed tick, up to the backfill limit"

    name = models.CharField(max_length=KIND_MAX_LENGTH, primary_key=True)
    kind = models.CharField(max_length=KIND_MAX_LENGTH)
    cron = models.CharField(max_length=200, help_text="Five-field cron, or @hourly, @daily ...")
    timezone = models.CharField(max_length=64, db_default="UTC")
    payload = models.JSONField(db_default=models.Value({}, models.JSONField()))
    options = models.JSONField(
        db_default=models.Value({}, models.JSONField()),
        help_text="Enqueue options of every tick's job: queue, key, priority, max_attempts, "
        "lease, expires, result_retention.",
    )
    on_missed = models.CharField(max_length=16, choices=OnMissed.choices, db_default="skip")
    backfill_limit = models.IntegerField(db_default=10)
    enabled = models.BooleanField(db_default=True)
    declared = models.BooleanField(
        db_default=True, help_text="False once no code or setting declares it any more."
    )
    next_run_at = models.DateTimeField(help_text="The next tick, by the database's clock.")
    last_run_at = models.DateTimeField(null=True, blank=True, help_text="The last tick run.")
    last_job_id = models.BigIntegerField(null=True, blank=True)
    runs = models.IntegerField(db_default=0, help_text="Jobs enqueued by this schedule.")
    created_at = models.DateTimeField(db_default=Now())
    updated_at = models.DateTimeField(db_default=Now())

    objects: ClassVar[managers.ScheduleManager] = managers.ScheduleManager()

    class Meta:
        db_table = "pgjobs_schedule"
        indexes: ClassVar[list[models.Index]] = [
            models.Index(
                fields=["next_run_at"], name="pgjobs_schedule_due", condition=Q(enabled=True)
            )
        ]
        constraints: ClassVar[list[models.BaseConstraint]] = [
            models.CheckConstraint(
                condition=Q(on_missed__in=["skip", "backfill"]), name="pgjobs_schedule_on_missed"
            ),
            models.CheckConstraint(
                condition=Q(backfill_limit__gte=1), name="pgjobs_schedule_backfill_limit_gte_1"
            ),
        ]

    def __str__(self) -> str:
        return self.name
