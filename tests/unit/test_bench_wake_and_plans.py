"""The pure logic of the wake-up breakdown (bench/wake.py) and of the plan capture
(bench/plans.py): segments cut from a probed worker's events, the statements counted
per claim, a plan's shape without its numbers, and its timings read back."""

from __future__ import annotations

import pytest

from bench.plans import plan_numbers, plan_shape
from bench.wake import claim_statements, segments

#: One job (id 7) committed at t=10.000 s: its wake-up, claim, hand-off, thread, handler.
EVENTS = [
    ["woke", 9.0, [1]],  # an earlier job's wake-up: stale for job 7
    ["claim_start", 9.001, []],
    ["claim_end", 9.002, []],
    ["woke", 10.0003, [1]],
    ["claim_start", 10.0004, []],
    ["sql -- Claim up to 42 pending jobs", 10.0005, []],
    ["claim_end", 10.0015, [7]],
    ["submit", 10.0016, [7]],
    ["sql -- Seconds from now() until a job", 10.0017, []],
    ["executor_start", 10.0019, [7]],
]


def test_segments_cut_commit_to_handler_into_its_steps():
    found = segments(EVENTS, {7: 10.0}, {7: 10.002})
    assert [round(found[name][0], 3) for name in ("notify", "loop", "claim")] == [0.3, 0.1, 1.1]
    assert [round(found[name][0], 3) for name in ("hand_off", "thread", "executor")] == [
        0.1,
        0.3,
        0.1,
    ]
    assert round(found["total"][0], 3) == 2.0
    assert found["statements"] == [1.0]  # only the claim ran inside claim_batch


def test_a_notification_read_just_before_the_commit_returned_still_counts():
    found = segments(EVENTS, {7: 10.001}, {7: 10.002})  # commit_at after the wake-up
    assert round(found["notify"][0], 3) == -0.7


def test_a_job_claimed_by_a_loop_awake_anyway_is_left_out():
    events = [e for e in EVENTS if e[1] != 10.0003]  # no wake-up of its own
    assert segments(events, {7: 10.0}, {7: 10.002})["total"] == []


def test_claim_statements_counts_each_sequence_inside_claim_batch():
    events = [
        *EVENTS,
        ["claim_start", 11.0, []],
        ["sql -- The queues with a limit", 11.1, []],
        ["sql -- Claim up to 42 pending jobs", 11.2, []],
        ["claim_end", 11.3, []],
    ]
    assert claim_statements(events) == {
        "(none)": 1,
        "-- Claim up to 42 pending jobs": 1,
        "-- The queues with a limit + -- Claim up to 42 pending jobs": 1,
    }


PLAN = """Nested Loop Left Join  (cost=1.0..2.0 rows=100 width=8) (actual time=1..2 rows=100 loops=1)
  Buffers: shared hit=905 dirtied=2
  ->  Index Scan using pgjobs_job_schedule on pgjobs_job j  (cost=0.14..8.15 rows=1 width=2) (actual time=0.1..0.5 rows=900 loops=1)
        Index Cond: ((queue)::text = q.name)
Planning Time: 6.031 ms
Execution Time: 9.308 ms"""  # noqa: E501


def test_plan_shape_keeps_the_nodes_and_drops_the_numbers():
    assert plan_shape(PLAN) == [
        "Nested Loop Left Join",
        "Index Scan using pgjobs_job_schedule on pgjobs_job j",
    ]
    assert plan_shape(PLAN.replace("rows=900", "rows=5")) == plan_shape(PLAN)


def test_plan_numbers_reads_times_and_the_top_buffers():
    assert plan_numbers(PLAN) == {
        "planning_ms": pytest.approx(6.031),
        "execution_ms": pytest.approx(9.308),
        "buffers": "shared hit=905 dirtied=2",
    }
