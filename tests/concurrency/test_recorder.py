"""The writes of a worker's outcomes (its recorder) where they meet faults: a row a
request holds (S39) and an outage at the try after it; a recorder slower than the
claims."""

from __future__ import annotations

import pytest

from django_pgjobs.claims import JobHandle, Outcome, Verdict
from django_pgjobs.db import connection as db
from django_pgjobs.models import Job
from django_pgjobs.worker.completer import Completer
from django_pgjobs.worker.faults import Faults
from django_pgjobs.worker.recorder import BATCHES_BEHIND, Recorder
from django_pgjobs.worker.stats import MinuteCounts, WorkerStats
from tests.helpers import count, execute, other_connection, row_held

pytestmark = pytest.mark.django_db(transaction=True)


def a_recorder() -> Recorder:
    """A worker's recorder on the default database, its thread not started."""
    return Recorder(
        Job.objects, WorkerStats(), MinuteCounts("default"), using="default", wake=lambda: None
    )


def test_s39_an_outcome_set_aside_outlives_an_outage_at_its_next_try() -> None:
    """An ack waits for a row a request holds and is set aside, its claim kept. The
    request ends, but the server drops the connection just before the next try: the
    ack stays set aside, its claim still kept, and is recorded at the try after."""
    job_id = Job.objects.enqueue("tests.record", {"label": "held"}).id
    (handle,) = Job.objects.claim_batch("default", 1, "w-recorder")
    kept: list[JobHandle] = []
    let_go: list[JobHandle] = []
    completer = Completer(
        Job.objects, WorkerStats(), Faults("default"), keep=kept.append, let_go=let_go.append
    )
    execute("SET lock_timeout = '200ms'")  # a worker's bounded lock wait, shorter
    with row_held(job_id):
        completer.take(Outcome(handle, Verdict.ACK, 0.0))
        assert completer.flush()
    assert kept == [handle] and let_go == []
    assert completer.unflushed

    pid = db.backend_pid("default")
    with other_connection() as conn:
        conn.execute("SELECT pg_terminate_backend(%s)", [pid])
    assert not completer.flush(last=True)  # the outage, at the try
    assert completer.unflushed
    assert let_go == []
    assert count("pgjobs_job", "id = %s AND state = 'running'", [job_id]) == 1

    assert completer.flush(last=True)  # reconnected
    assert not completer.unflushed
    assert let_go == [handle]
    assert count("pgjobs_job", "id = %s", [job_id]) == 0


def test_outcomes_waiting_to_be_written_past_a_few_claims_count_as_claims_held() -> None:
    """A recorder slower than the claims slows them down: outcomes handed over past
    BATCHES_BEHIND claims' worth are counted by the loop as claims it holds, until
    written."""
    Job.objects.enqueue_many([{"kind": "tests.record"}] * 6)
    handles = Job.objects.claim_batch("default", 6, "w-recorder")
    recorder = a_recorder()
    batch = 1  # concurrency 1, no prefetch
    for handle in handles:
        recorder.take(Outcome(handle, Verdict.ACK, 0.0))
    assert recorder.behind(batch) == 6 - BATCHES_BEHIND * batch
    recorder.start()
    try:
        assert recorder.write_soon(wait=10)
        assert recorder.behind(batch) == 0
        assert recorder.unflushed  # written, not yet applied by the loop
        assert recorder.apply(lambda handle: None, lambda handle: None)  # look again
        assert not recorder.unflushed
    finally:
        recorder.stop()
    assert count("pgjobs_job") == 0


def test_s39_outcomes_set_aside_count_once_among_the_claims_held() -> None:
    """Outcomes set aside behind rows a request holds keep their claims (the loop holds
    them again): they are not counted a second time as outcomes the recorder is behind
    on, which would hold back claims for jobs no one holds."""
    ids = [result.id for result in Job.objects.enqueue_many([{"kind": "tests.record"}] * 6)]
    handles = Job.objects.claim_batch("default", 6, "w-recorder")
    recorder = a_recorder()
    kept: list[JobHandle] = []
    batch = 1  # concurrency 1, no prefetch: more than BATCHES_BEHIND outcomes set aside
    recorder.start()
    try:
        with row_held(*ids):
            for handle in handles:
                recorder.take(Outcome(handle, Verdict.ACK, 0.0))
            assert recorder.write_soon(wait=30)
            recorder.apply(kept.append, lambda handle: None)
            assert sorted(handle.id for handle in kept) == sorted(ids)  # held again
            assert recorder.unflushed  # set aside, to be tried again
            assert recorder.behind(batch) == 0
        recorder.finish()
    finally:
        recorder.stop()
    assert count("pgjobs_job") == 0
