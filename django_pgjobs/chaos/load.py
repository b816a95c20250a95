"""The job stream of a chaos run: plain jobs, keyed triggers, rolled-back and poison bursts,
and workflows: chains of jobs after each other and batches with callbacks (S29-S31).

Every enqueue goes into the run's ledger: committed for sure, rolled back for sure (a
ghost), or uncertain (the connection broke under the commit).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from django.db import InterfaceError, OperationalError, transaction

from django_pgjobs.batches import Callback, batch
from django_pgjobs.chaos import poison
from django_pgjobs.chaos.facts import BatchWritten
from django_pgjobs.chaos.jobs import KEYED_KIND, LIMITED_KIND, POISON_KIND, WORK_KIND, work
from django_pgjobs.chaos.models import ChaosExecution
from django_pgjobs.chaos.state import RunState
from django_pgjobs.models import Job

#: Longest wait of the run's own enqueues for a row lock (a keyed trigger waits for its
#: job's fenced run, whose worker this run may have stopped).
LOCK_WAIT_S = 2.0
#: SQLSTATE of a lock wait that gave up (lock_timeout).
LOCK_NOT_AVAILABLE = "55P03"


class Load:
    """Enqueue the run's jobs and note each one in the ledger."""

    def __init__(self, state: RunState) -> None:
        self.state = state

    def options(self) -> dict[str, Any]:
        """The enqueue options every job of the run shares."""
        return {
            "queue": self.state.queue,
            "lease": self.state.config.lease,
            "max_attempts": self.state.config.max_attempts,
            "result_retention": 24 * 3600,
        }

    def plain_job(self, *, ghost: bool = False, sleep: float | None = None) -> dict[str, Any]:
        """A plain job of random length (or of `sleep` seconds); some fail once (flaky),
        a few always (doomed)."""
        random = self.state.random
        roll = random.random()
        if sleep is None:
            sleep = (
                random.uniform(0, 0.05)
                if roll < 0.7
                else random.uniform(0.05, 0.5)
                if roll < 0.95
                else random.uniform(0.5, 1.5)
            )
        payload: dict[str, Any] = {"run": self.state.run_id, "sleep": round(sleep, 3)}
        flavour = random.random()
        if flavour < 0.1:
            payload["flaky"] = True
        elif flavour < 0.13:
            payload["doomed"] = True
        if ghost:
            payload["ghost"] = True
        return {"kind": WORK_KIND, "payload": payload, **self.options()}

    def enqueue_plain(self, count: int, *, sleep: float | None = None) -> None:
        """Enqueue `count` plain jobs (of `sleep` seconds each, else of random lengths),
        in transactions of up to 100."""
        ledger = self.state.ledger
        while count > 0:
            size = min(count, 100)
            count -= size

            def write(ids: list[int], size: int = size) -> None:
                if size == 1:  # one at a time, and in bulk (S5)
                    job = self.plain_job(sleep=sleep)
                    kind, payload = job.pop("kind"), job.pop("payload")
                    ids.append(Job.objects.enqueue(kind, payload, using=self.state.alias, **job).id)
                else:
                    jobs = [self.plain_job(sleep=sleep) for _ in range(size)]
                    ids += [r.id for r in Job.objects.enqueue_many(jobs, using=self.state.alias)]

            ids, committed = self._write(write)
            if committed:
                ledger.committed.update(dict.fromkeys(ids))
            else:
                ledger.uncertain.update(ids)

    def enqueue_limited(self, count: int) -> None:
        """Enqueue `count` jobs of the run's rate-limited concurrency key (S34, S35)."""
        state = self.state
        jobs = [
            {
                "kind": LIMITED_KIND,
                "payload": {"run": state.run_id, "sleep": round(state.random.uniform(0, 0.3), 3)},
                **self.options(),
            }
            for _ in range(count)
        ]

        def write(ids: list[int]) -> None:
            ids += [result.id for result in Job.objects.enqueue_many(jobs, using=state.alias)]

        ids, committed = self._write(write)
        state.ledger.limited.update(ids)
        if committed:
            state.ledger.committed.update(dict.fromkeys(ids))
        else:
            state.ledger.uncertain.update(ids)

    def enqueue_workflow(self) -> None:
        """Write a chain (3 to 6 jobs, each after the one before) or a batch (2 to 12
        members, callbacks on success, failure and completion, some of them), each in one
        transaction. Members and links are plain jobs: some flaky, a few doomed."""
        state = self.state
        if state.random.random() < 0.5:
            self._chain(state.random.randint(3, 6))
        else:
            self._batch(state.random.randint(2, 12))

    def _chain(self, length: int) -> None:
        state = self.state

        def write(ids: list[int]) -> None:
            for _ in range(length):
                job = self.plain_job()
                kind, payload = job.pop("kind"), job.pop("payload")
                after = ids[-1:] or None
                ids.append(
                    Job.objects.enqueue(kind, payload, after=after, using=state.alias, **job).id
                )

        ids, committed = self._write(write)
        if committed:
            state.ledger.committed.update(dict.fromkeys(ids))
            state.ledger.chains.append(tuple(ids))
        else:
            state.ledger.uncertain.update(ids)

    def _batch(self, size: int) -> None:
        state = self.state
        target = work.using(**self.options())
        kinds = ("on_success", "on_failure", "on_complete")
        names = [name for name in kinds if state.random.random() < 0.6] or ["on_complete"]
        callbacks = {
            name: Callback(target, run=state.run_id, sleep=round(state.random.uniform(0, 0.1), 3))
            for name in names
        }
        written: list[BatchWritten] = []

        def write(ids: list[int]) -> None:
            with batch(
                on_success=callbacks.get("on_success"),
                on_failure=callbacks.get("on_failure"),
                on_complete=callbacks.get("on_complete"),
                using=state.alias,
            ) as b:
                for _ in range(size):
                    b.add(target, **self.plain_job()["payload"])
            assert b.id is not None
            ids += [member.id for member in b.members] + [job.id for job in b.callback_jobs]
            fires_on = [name.removeprefix("on_") for name in callbacks]
            written.append(
                BatchWritten(
                    id=b.id,
                    members=tuple(member.id for member in b.members),
                    callbacks=dict(zip(fires_on, (job.id for job in b.callback_jobs), strict=True)),
                )
            )

        ids, committed = self._write(write)
        if committed and written:
            state.ledger.committed.update(dict.fromkeys(written[0].members))
            state.ledger.batches.append(written[0])
        else:
            state.ledger.uncertain.update(ids)

    def cancel_running(self) -> tuple[int, int]:
        """Cancel one running job of the run without a key (S32; a keyed job's pending
        trigger would go with it, which the keys invariant does not allow for); return
        (its id, how many the cancel moved or told: 0 when it finished first), or (0, 0)
        when none runs."""
        state = self.state
        running = list(
            Job.objects.using(state.alias)
            .filter(queue=state.queue, state="running", key__isnull=True)
            .values_list("id", flat=True)[:50]
        )
        if not running:
            return 0, 0
        job_id = state.random.choice(running)
        return job_id, Job.objects.cancel_many([job_id], using=state.alias)

    def key(self, index: int) -> str:
        """The key of the run's `index`th keyed job."""
        return f"{self.state.run_id}:k{index}"

    def trigger(self, index: int) -> None:
        """Enqueue the next trigger of a key: merged into its live job, or a new job."""
        ledger = self.state.ledger
        key = self.key(index)
        version = ledger.versions.get(key, 0) + 1
        ledger.versions[key] = version
        sleep = round(self.state.random.uniform(0.2, 1.2), 3)
        payload = {"run": self.state.run_id, "v": version, "sleep": sleep}

        def write(ids: list[int]) -> None:
            ids.append(
                Job.objects.enqueue(
                    KEYED_KIND, payload, key=key, using=self.state.alias, **self.options()
                ).id
            )

        ids, committed = self._write(write)
        if committed:
            ledger.committed[ids[0]] = key
            ledger.last_triggers[key] = version
            ledger.uncertain_keys.discard(key)
            ledger.triggers += 1
        elif ids:
            ledger.uncertain.update(ids)
            ledger.uncertain_keys.add(key)

    def ghost_burst(self) -> None:
        """Enqueue jobs and a trigger inside a transaction that rolls back."""
        state = self.state
        size = state.random.randint(1, 20)

        def write(ids: list[int]) -> None:
            results = Job.objects.enqueue_many(
                [self.plain_job(ghost=True) for _ in range(size)], using=state.alias
            )
            ids += [result.id for result in results if result.inserted]
            if state.config.keys:
                key = self.key(state.random.randrange(state.config.keys))
                payload = {"run": state.run_id, "v": -1, "sleep": 0.0, "ghost": True}
                result = Job.objects.enqueue(
                    KEYED_KIND, payload, key=key, using=state.alias, **self.options()
                )
                if result.inserted:  # a merge returns a committed job's id: not a ghost
                    ids.append(result.id)

        ids, _ = self._write(write, roll_back=True)
        state.ledger.ghosts.update(ids)

    def poison_burst(self) -> None:
        """Enqueue a few jobs of hostile handlers (S27).

        Each must end dead, and the workers must keep going.
        """
        state = self.state
        names = sorted(poison.BEHAVIOURS)
        jobs = [
            {
                "kind": POISON_KIND,
                "payload": {"run": state.run_id, "how": state.random.choice(names)},
                **self.options(),
            }
            for _ in range(state.random.randint(1, 5))
        ]

        def write(ids: list[int]) -> None:
            ids += [result.id for result in Job.objects.enqueue_many(jobs, using=state.alias)]

        ids, committed = self._write(write)
        if committed:
            state.ledger.committed.update(dict.fromkeys(ids))
        else:
            state.ledger.uncertain.update(ids)

    def _write(
        self, write: Callable[[list[int]], None], *, roll_back: bool = False
    ) -> tuple[list[int], bool]:
        """Run `write` in a transaction; return the ids it collected and whether they committed.

        True means surely committed. A connection that breaks under it (a fault, a restart)
        leaves the commit unknown: those jobs are then counted neither as committed nor as lost.
        """
        state = self.state
        ids: list[int] = []
        try:
            with transaction.atomic(using=state.alias):
                # A keyed trigger waits for the row lock of its job's fenced run; if this
                # run stopped that worker (SIGSTOP), this loop resumes it (its timer only
                # a second after its time).
                ChaosExecution.objects.limit_lock_wait(LOCK_WAIT_S, using=state.alias)
                write(ids)
                if roll_back:
                    transaction.set_rollback(True, using=state.alias)
        except OperationalError as error:
            if getattr(error.__cause__, "sqlstate", None) == LOCK_NOT_AVAILABLE:
                # Rolled back for sure: the trigger never happened. Try another later.
                state.ledger.skipped_busy += 1
                return [], False
            state.on_event(f"an enqueue failed ({str(error).strip().splitlines()[0]}); going on")
            state.reconnect()
            return ids, False
        except InterfaceError as error:
            state.on_event(f"an enqueue failed ({str(error).strip().splitlines()[0]}); going on")
            state.reconnect()
            return ids, False
        return ids, not roll_back
