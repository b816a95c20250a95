"""Hostile rows: a row edited by hand into nonsense either is refused by the database or
meets a real worker that dead-letters (or, for an unknown kind, retries) it with a reason
and goes on with the next job. Hostile enqueue arguments, and the code paths a crafted row
could abuse: unit/test_hostile.py."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from django.db import IntegrityError, transaction

from django_pgjobs.models import Job
from django_pgjobs.worker import Worker
from tests import jobs
from tests.helpers import count, dead_row, execute, row

#: What a worker says of a kind it has no handler for (S25): what to do about it.
UNKNOWN_KIND_GUIDE = (
    "this worker has no handler of that name. Workers know the @job functions of every "
    "installed app's jobs.py, of the modules in PGJOBS['JOB_MODULES'] and of runjobs "
    "--import: a kind defined elsewhere (shop/tasks.py, say) is known only where something "
    "imports its module. After deploying a new kind, restart the workers; otherwise check "
    "the spelling."
)


@pytest.mark.django_db(transaction=True)
class TestRowsEditedByHand:
    """A row changed behind the queue's back either is refused by the database or meets a
    worker that dead-letters (or, for an unknown kind, retries) it with a reason, and goes
    on with the next job."""

    def drain(self) -> None:
        worker = Worker(burst=True, sweep_interval=0, poll_interval=0.2, concurrency=2)
        assert worker.run() == 0

    @pytest.fixture
    def neighbour(self) -> Iterator[int]:
        """A sound job beside the nonsense: it must still run."""
        job_id = jobs.record.enqueue(label="neighbour").id
        yield job_id
        assert row(job_id) is None and count("tests_note", "text = 'neighbour'") == 1

    @pytest.mark.parametrize(
        ("payload", "reason"),
        [
            ("[1, 2]", "payload is not a JSON object: list"),
            ('"text"', "payload is not a JSON object: str"),
            ("null", "payload is not a JSON object: NoneType"),
            ('{"label": "x", "surprise": 1}', "unexpected keyword argument 'surprise'"),
            ('{"label": ["not", "a", "string"], "sleep": "soon"}', None),
        ],
    )
    def test_a_payload_that_cannot_be_the_handlers_arguments_is_dead_lettered(
        self, neighbour: int, payload: str, reason: str | None
    ) -> None:
        job_id = jobs.record.enqueue(label="victim").id
        execute("UPDATE pgjobs_job SET payload = %s::jsonb WHERE id = %s", [payload, job_id])
        self.drain()
        if reason is None:  # the arguments bind; the handler itself fails, and is retried
            assert row(job_id, "state", "attempts")[0] == "pending"
            assert "TypeError" in row(job_id, "last_error")[0]
        else:
            (dead_reason,) = dead_row(job_id, "reason")
            assert reason in dead_reason

    def test_an_unknown_kind_is_retried_with_its_reason_then_dead_lettered(
        self, neighbour: int
    ) -> None:
        job_id = Job.objects.enqueue("tests.record", {"label": "x"}, max_attempts=2).id
        execute("UPDATE pgjobs_job SET kind = 'builtins.eval' WHERE id = %s", [job_id])
        self.drain()
        assert row(job_id, "state", "last_error") == (
            "pending",
            f"unknown job kind 'builtins.eval': {UNKNOWN_KIND_GUIDE}",
        )
        execute("UPDATE pgjobs_job SET run_after = now() WHERE id = %s", [job_id])
        self.drain()
        assert dead_row(job_id, "reason", "last_error") == (
            "max attempts exceeded",
            f"unknown job kind 'builtins.eval': {UNKNOWN_KIND_GUIDE}",
        )

    @pytest.mark.parametrize(
        "change",
        [
            "lease_s = -5",
            "max_attempts = 0",
            "attempts = -1",
            "priority = 1000",
            "state = 'exploded'",
            "state = 'running', claimed_by = NULL",
            "state = 'running', claimed_until = NULL, claimed_by = gen_random_uuid()",
            "kind = NULL",
            "payload = NULL",
        ],
    )
    def test_the_database_refuses_nonsense_the_queue_could_not_recover_from(
        self, neighbour: int, change: str
    ) -> None:
        job_id = jobs.record.enqueue(label="victim").id
        before = row(job_id, "state", "lease_s", "attempts", "payload")
        with pytest.raises(IntegrityError), transaction.atomic():
            execute(f"UPDATE pgjobs_job SET {change} WHERE id = %s", [job_id])
        assert row(job_id, "state", "lease_s", "attempts", "payload") == before
        self.drain()
        assert row(job_id) is None  # ran as enqueued

    def test_more_attempts_than_allowed_still_runs_once_and_dead_letters_on_failure(
        self, neighbour: int
    ) -> None:
        job_id = jobs.misbehave.enqueue(how="error").id
        execute("UPDATE pgjobs_job SET attempts = 50 WHERE id = %s", [job_id])
        self.drain()
        assert dead_row(job_id, "reason", "attempts") == ("max attempts exceeded", 51)
