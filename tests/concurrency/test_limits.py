"""Per-key concurrency (S34) and rate limits (S35), enforced in the claim statements;
bad limits refused at definition or enqueue with nothing written."""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from django_pgjobs import job
from django_pgjobs.exceptions import InvalidLimit
from django_pgjobs.limits import Rate
from django_pgjobs.models import Job, QueueControl
from tests import jobs
from tests.helpers import count, execute, row, running_worker, wait_until

pytestmark = pytest.mark.django_db(transaction=True)


def tenant_intervals() -> dict[str, list[tuple[datetime, datetime]]]:
    """Each tenant job's [start, end] by the database's clock: inside the time between
    its claim's commit and its ack's, when it holds a slot of its key."""
    intervals: dict[str, list[tuple[datetime, datetime]]] = {}
    rows = execute(
        "SELECT split_part(s.text, ' ', 1), s.created_at, e.created_at FROM tests_note AS s "
        "JOIN tests_note AS e ON e.token = s.token AND e.text LIKE '%% end' "
        "WHERE s.text LIKE '%% start'"
    )
    for tenant, started, ended in rows:
        intervals.setdefault(tenant, []).append((started, ended))
    return intervals


def most_at_once(intervals: list[tuple[datetime, datetime]]) -> int:
    events = sorted([(start, 1) for start, _ in intervals] + [(end, -1) for _, end in intervals])
    running = most = 0
    for _, step in events:
        running += step
        most = max(most, running)
    return most


def most_in_a_window(moments: list[datetime], window: timedelta) -> int:
    moments = sorted(moments)
    most = start = 0
    for end in range(len(moments)):
        while moments[end] - moments[start] >= window:
            start += 1
        most = max(most, end - start + 1)
    return most


class TestS34ConcurrencyKeys:
    def test_s34_the_key_and_its_limit_travel_with_each_job(self) -> None:
        job_id = jobs.tenant.enqueue(tenant="acme").id
        assert row(job_id, "limit_key", "concurrency_limit", "rate_limit") == (
            "tenant:acme",
            2,
            None,
        )
        assert Job.objects.get_job(job_id).limit_key == "tenant:acme"
        batch = Job.objects.enqueue_many(
            [{"kind": "tests.tenant", "payload": {"tenant": str(n % 3)}} for n in range(6)]
        )
        keys = [row(result.id, "limit_key")[0] for result in batch]
        assert keys == [f"tenant:{n % 3}" for n in range(6)]

    def test_s34_at_most_n_of_one_key_run_at_once_across_threads(self) -> None:
        Job.objects.enqueue_many(
            [{"kind": "tests.tenant", "payload": {"tenant": "a", "seconds": 0.05}}] * 30
            + [{"kind": "tests.tenant", "payload": {"tenant": "b", "seconds": 0.05}}] * 30
        )
        with running_worker(queues=["tenants"], concurrency=8, poll_interval=0.1):
            wait_until(lambda: count() == 0, timeout=30)
        intervals = tenant_intervals()
        assert {tenant: len(runs) for tenant, runs in intervals.items()} == {"a": 30, "b": 30}
        assert most_at_once(intervals["a"]) <= 2 and most_at_once(intervals["b"]) <= 2
        assert most_at_once(intervals["a"]) == 2  # the limit is used, not just respected

    def test_s34_a_limited_key_does_not_hold_back_other_keys_or_unkeyed_jobs(self) -> None:
        Job.objects.enqueue_many(
            [{"kind": "tests.tenant", "payload": {"tenant": "big", "seconds": 0.2}}] * 200
        )
        Job.objects.enqueue_many(
            [{"kind": "tests.tenant", "payload": {"tenant": f"t{n}"}} for n in range(40)]
            + [{"kind": "tests.record", "queue": "tenants", "payload": {"label": "free"}}] * 40
        )
        with running_worker(queues=["tenants"], concurrency=8, poll_interval=0.1):
            wait_until(
                lambda: count(where="limit_key IS DISTINCT FROM 'tenant:big'") == 0, timeout=30
            )
            left = count(where="limit_key = 'tenant:big'")
        assert left >= 150  # the others were done while the big tenant's backlog waited

    def test_s34_unkeyed_claims_walk_past_a_keyed_backlog(self) -> None:
        Job.objects.enqueue_many(
            [{"kind": "tests.tenant", "payload": {"tenant": "x"}}] * 500, on_conflict="replace"
        )
        plan = execute(
            "EXPLAIN (FORMAT JSON) SELECT id FROM pgjobs_job AS j WHERE j.state = 'pending' "
            "AND j.limit_key IS NULL AND j.queue = 'tenants' ORDER BY j.priority DESC, "
            "j.run_after, j.id LIMIT 10"
        )
        assert "pgjobs_job_claim" in str(plan)  # the claim index holds no keyed job

    @pytest.mark.parametrize(
        ("options", "match"),
        [
            ({"concurrency_key": lambda p: p["t"], "concurrency": 0}, "concurrency"),
            ({"concurrency_key": lambda p: p["t"], "concurrency": -2}, "concurrency"),
            ({"concurrency_key": lambda p: p["t"], "concurrency": 2.5}, "concurrency"),
            ({"concurrency_key": lambda p: p["t"], "concurrency": True}, "concurrency"),
            ({"concurrency": 2}, "concurrency_key"),
            ({"concurrency_key": lambda p: p["t"]}, "concurrency_key needs"),
            ({"rate": "fast"}, "rate must look like"),
            ({"rate": "0/m"}, "count"),
            ({"rate": "5/0s"}, "period"),
            ({"rate": "5/2d"}, "period"),
            ({"concurrency_key": "", "concurrency": 1}, "concurrency key value"),
        ],
    )
    def test_s34_s35_bad_limits_are_refused_at_definition(
        self, options: dict[str, Any], match: str
    ) -> None:
        with pytest.raises(InvalidLimit, match=match):
            job(name="tests.never_defined", **options)(lambda t: None)

    def test_s34_a_key_function_that_raises_refuses_the_enqueue_and_writes_nothing(
        self,
    ) -> None:
        with pytest.raises(InvalidLimit, match=r"concurrency_key of tests\.bad_key raised Zero"):
            Job.objects.enqueue("tests.bad_key", {"n": 0})
        with pytest.raises(InvalidLimit, match="jobs\\[1\\]: The concurrency_key"):
            Job.objects.enqueue_many(
                [{"kind": "tests.bad_key", "payload": {"n": n}} for n in (1, 0, 2)]
            )
        assert count() == 0

    @settings(max_examples=60, deadline=None, suppress_health_check=list(HealthCheck))
    @given(
        value=st.one_of(
            st.none(),
            st.booleans(),
            st.integers(),
            st.floats(allow_nan=True),
            st.text(max_size=300),
            st.binary(max_size=10),
            st.lists(st.integers(), max_size=3),
        )
    )
    def test_s34_any_key_value_is_stored_as_given_or_refused_clearly(self, value: Any) -> None:
        """Whatever a key function returns: a clear error and nothing written, or a job
        whose key is that value as text (None: an unlimited job)."""
        before = count()
        try:
            result = Job.objects.enqueue("tests.hostile_key", {"value": repr(value)}, queue="x")
        except InvalidLimit as error:
            assert "concurrency" in str(error)
            assert count() == before
            return
        stored = row(result.id, "limit_key")[0]
        expected = None if value is None else str(value)
        assert stored == expected
        execute("DELETE FROM pgjobs_job")


class TestS35RateLimits:
    def test_s35_a_key_admits_at_most_its_rate_of_claims_per_period(self) -> None:
        Job.objects.enqueue_many([{"kind": "tests.rated", "payload": {"key": "k"}}] * 16)
        with running_worker(queues=["tenants"], concurrency=8, poll_interval=0.1):
            wait_until(lambda: count() == 0, timeout=30)
        moments = [
            datetime.fromisoformat(text)
            for (text,) in execute("SELECT text FROM tests_note WHERE worker = 'k'")
        ]
        assert len(moments) == 16
        assert most_in_a_window(moments, timedelta(seconds=1)) == 5  # 5/s, used in full
        assert max(moments) - min(moments) >= timedelta(seconds=3)  # 16 at 5/s: 3 s at least

    def test_s35_a_queue_admits_at_most_its_rate(self) -> None:
        assert QueueControl.objects.set_rate("metered", "4/s") is True
        assert QueueControl.objects.set_rate("metered", Rate(4, 1.0)) is False
        Job.objects.enqueue_many([{"kind": "tests.claim_time", "queue": "metered"}] * 10)
        with running_worker(queues=["metered"], concurrency=8, poll_interval=0.1):
            wait_until(lambda: count() == 0, timeout=30)
        claims = [
            datetime.fromisoformat(text) for (text,) in execute("SELECT text FROM tests_note")
        ]
        assert len(claims) == 10
        assert most_in_a_window(claims, timedelta(seconds=1)) == 4
        assert max(claims) - min(claims) >= timedelta(seconds=2)  # 10 at 4/s
        status = {s.queue: s for s in QueueControl.objects.status()}
        assert status["metered"].rate == "4/s"

    def test_s35_a_bad_queue_rate_is_refused_and_nothing_is_written(self) -> None:
        with pytest.raises(InvalidLimit):
            QueueControl.objects.set_rate("metered", "fast")
        assert count("pgjobs_queue") == 0

    @pytest.mark.parametrize(
        ("text", "limit", "period"),
        [
            ("100/m", 100, 60),
            ("5/s", 5, 1),
            ("1000/h", 1000, 3600),
            ("3/10s", 3, 10),
            ("10/day", 10, 86400),
            (" 7 / minutes ", 7, 60),
        ],
    )
    def test_s35_rates_read_as_people_write_them(self, text: str, limit: int, period: int) -> None:
        assert Rate.parse(text) == Rate(limit, float(period))
