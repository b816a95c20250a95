"""Per-key limits obeyed by four real `manage.py runjobs` processes (S34, S35), with
NOTIFY and without (S37: the PgBouncer setup, workers that poll): the recorded [claim,
end] intervals of one key never exceed its concurrency, a key's claims never exceed its
rate in any window of the period, and a limited key's backlog does not hold back the
other keys' jobs."""

from __future__ import annotations

from datetime import timedelta

import pytest

from django_pgjobs.models import Job
from tests.concurrency.test_limits import most_at_once, most_in_a_window, tenant_intervals
from tests.helpers import count, execute
from tests.spawn import Workers, listening_workers, ready_workers, wait_for

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]

WORKERS = 4


def start(workers: Workers, concurrency: int = 4) -> None:
    """Start the workers and wait until every one is up: the jobs enqueued next are
    shared among them, not all taken by the first one up."""
    for _ in range(WORKERS):
        workers.start(
            "--queue", "tenants", "--concurrency", str(concurrency), "--poll-interval", "0.2"
        )
    wait_for(lambda: ready_workers(workers) == WORKERS, timeout=60, what="every worker up")
    assert listening_workers() == (WORKERS if workers.listen else 0)


def test_s34_s37_four_processes_never_run_more_than_the_limit_of_one_key(
    workers: Workers, notify: bool
) -> None:
    # One job at a time per process: two runs of a key at once are two processes, so the
    # limit is reached, and held, across them (with four threads each, one process
    # could hold both slots of both keys for the whole run).
    start(workers, concurrency=1)
    Job.objects.enqueue_many(
        [{"kind": "tests.tenant", "payload": {"tenant": "a", "seconds": 0.03}}] * 120
        + [{"kind": "tests.tenant", "payload": {"tenant": "b", "seconds": 0.03}}] * 60
    )
    wait_for(lambda: count() == 0, timeout=90, what="every tenant job done")
    intervals = tenant_intervals()
    assert {tenant: len(runs) for tenant, runs in intervals.items()} == {"a": 120, "b": 60}
    assert most_at_once(intervals["a"]) == 2
    assert most_at_once(intervals["b"]) == 2
    workers_seen = {worker for (worker,) in execute("SELECT DISTINCT worker FROM tests_note")}
    assert len(workers_seen) > 1  # the limit held across processes, not inside one


def test_s34_s37_a_big_tenant_does_not_hold_back_a_hundred_others(
    workers: Workers, notify: bool
) -> None:
    start(workers)
    Job.objects.enqueue_many(
        [{"kind": "tests.tenant", "payload": {"tenant": "big", "seconds": 0.05}}] * 2000
    )
    Job.objects.enqueue_many(
        [{"kind": "tests.tenant", "payload": {"tenant": f"t{n}"}} for n in range(100)]
    )
    wait_for(
        lambda: count(where="limit_key <> 'tenant:big'") == 0,
        timeout=60,
        what="the hundred other tenants' jobs done",
    )
    assert count(where="limit_key = 'tenant:big'") > 1500  # they did not wait behind it


def test_s35_s37_four_processes_admit_a_keys_rate_and_no_more(
    workers: Workers, notify: bool
) -> None:
    start(workers)
    Job.objects.enqueue_many([{"kind": "tests.rated", "payload": {"key": "api"}}] * 20)
    wait_for(lambda: count() == 0, timeout=60, what="every rated job done")
    from datetime import datetime

    moments = [datetime.fromisoformat(text) for (text,) in execute("SELECT text FROM tests_note")]
    assert len(moments) == 20
    assert most_in_a_window(moments, timedelta(seconds=1)) == 5
