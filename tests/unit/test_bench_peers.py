"""The pure logic of `python -m bench --peers` (bench/peers.py): which of our figures is
set beside which of PgQueuer's and graphile-worker's, the ratio the table shows, the
latency percentiles and the drain rate read from PgQueuer's log. The peers themselves
are not run here (they download)."""

from __future__ import annotations

import pytest

from bench.harness import Figure, render_table
from bench.peers import GRAPHILE, PEER, compare, compare_wake, drain_rate, percentiles

OURS = [
    Figure("drain", "1 process, default settings, fresh table", 12_000, "jobs/s"),
    Figure("drain", "1 process, default settings, after VACUUM ANALYZE", 16_000, "jobs/s"),
    Figure("drain", "best of grid, fresh table: 2 process(es) x concurrency 64", 30_000, "jobs/s"),
    Figure("wake", "p50", 1.0, "ms"),
    Figure("wake", "p99", 3.0, "ms"),
]
THEIRS = [
    Figure("pgqueuer", "drain, 1 process, batch 10", 6_000, "jobs/s"),
    Figure("pgqueuer", "drain, 1 process, batch 100", 10_000, "jobs/s"),
    Figure("pgqueuer", "drain, 2 processes, batch 10", 9_000, "jobs/s"),
    Figure("pgqueuer", "drain, 2 processes, batch 100", 24_000, "jobs/s"),
    Figure("pgqueuer", "wake p50", 2.0, "ms"),
    Figure("pgqueuer", "wake p99", 5.0, "ms"),
]


def by_name(figures: list[Figure]) -> dict[str, Figure]:
    return {figure.name: figure for figure in figures}


def test_compare_sets_our_fresh_figures_beside_the_peers_and_its_best():
    compared = by_name(compare(OURS, THEIRS))
    default = compared["drain, 1 process, defaults (fresh) / its default (batch 10)"]
    assert (default.value, default.ceiling, default.ratio) == (12_000, 6_000, 2.0)
    best_single = compared["drain, 1 process, defaults (fresh) / its best 1-process setting"]
    assert best_single.ceiling == 10_000  # batch 100 beats batch 10; 2 processes excluded
    assert best_single.ratio == pytest.approx(1.2)
    assert best_single.met is True  # the target: >= 1.2x
    best = compared["drain, best of grid (fresh, <= 4 processes) / its best (<= 2 processes)"]
    assert (best.value, best.ceiling) == (30_000, 24_000)
    assert best.met is False  # 1.25x < 1.5x
    assert {f.benchmark for f in compared.values()} == {f"vs {PEER}"}


def test_compare_wake_ratios_are_ours_over_theirs_without_a_target():
    compared = by_name(compare(OURS, THEIRS))
    p50 = compared["wake p50, commit -> handler (lower is better)"]
    p99 = compared["wake p99, commit -> handler (lower is better)"]
    assert (p50.ratio, p99.ratio) == (0.5, 0.6)
    assert p50.met is None and p50.details["higher is better"] is False


def test_compare_leaves_out_what_either_side_lacks():
    assert compare(OURS[:1], THEIRS[-2:]) == []
    # Batch 10 alone is also the peer's best single process and its best overall.
    assert len(compare(OURS, THEIRS[:1])) == 3


def test_the_table_shows_peer_ratios_as_times_and_ceilings_as_percent():
    table = render_table([OURS[0], *compare(OURS, THEIRS)[:1]])
    assert "2.00x" in table
    with_ceiling = Figure("drain", "x", 50, "jobs/s", ceiling=200)
    assert "25%" in render_table([with_ceiling])


def test_percentiles_use_the_suites_nearest_rank_rule():
    result = percentiles(float(i) for i in range(1, 101))
    assert result == {"p50": 51.0, "p95": 95.0, "p99": 99.0, "max": 100.0}
    with pytest.raises(ValueError):
        percentiles([])


def test_drain_rate_is_jobs_over_first_pick_to_last_success_and_refuses_a_short_drain():
    window = {"first_pick": 100.0, "last_success": 104.0, "successful": 20_000}
    assert drain_rate(window, 20_000) == 5_000
    with pytest.raises(RuntimeError, match="19999 of 20000"):
        drain_rate({**window, "successful": 19_999}, 20_000)


def test_compare_wake_sets_ours_beside_graphiles_and_meets_at_or_below_its_p50():
    graphile = [
        Figure("graphile", "wake p50", 1.6, "ms"),
        Figure("graphile", "wake p95", 2.0, "ms"),
        Figure("graphile", "wake p99", 4.6, "ms"),
    ]
    compared = by_name(compare_wake(OURS, graphile, GRAPHILE))
    assert set(compared) == {
        "wake p50, commit -> handler (lower is better)",
        "wake p99, commit -> handler (lower is better)",
    }
    p50 = compared["wake p50, commit -> handler (lower is better)"]
    assert (p50.value, p50.ceiling, p50.met) == (1.0, 1.6, True)
    assert p50.benchmark == f"vs {GRAPHILE}"
    p99 = compared["wake p99, commit -> handler (lower is better)"]
    assert (p99.ratio, p99.met) == (pytest.approx(3.0 / 4.6), None)
    slower = [Figure("wake", "p50", 1.7, "ms")]
    assert (
        by_name(compare_wake(slower, graphile, GRAPHILE))[
            "wake p50, commit -> handler (lower is better)"
        ].met
        is False
    )
    assert compare_wake(OURS, [], GRAPHILE) == []


def test_every_measured_figure_carries_the_load_it_was_taken_at_and_the_table_shows_it():
    from bench.harness import measured

    figures = measured(lambda: [Figure("drain", "x", 1.0, "jobs/s")])
    low, high = (float(part) for part in figures[0].details["load"].split("-"))
    assert low >= 0 and high >= 0
    table = render_table(figures)
    assert table.splitlines()[0].split()[-1] == "load"
    assert table.splitlines()[-1].endswith(figures[0].details["load"])
    kept = measured(lambda: [Figure("drain", "y", 1.0, "jobs/s", details={"load": "given"})])
    assert kept[0].details["load"] == "given"


def test_compare_sets_our_enqueues_beside_pgqueuers_of_the_same_shape():
    ours = [
        Figure("enqueue", "enqueue in transaction.atomic()", 900, "jobs/s"),
        Figure("enqueue", "enqueue, one per transaction (autocommit)", 2_000, "jobs/s"),
        Figure("enqueue", "enqueue_many", 40_000, "jobs/s"),
    ]
    theirs = [
        Figure("pgqueuer", "enqueue, one per transaction (autocommit)", 1_875, "jobs/s"),
        Figure("pgqueuer", "enqueue, bulk", 50_000, "jobs/s"),
    ]
    compared = by_name(compare(ours, theirs))
    single = compared["enqueue, one per transaction (autocommit)"]
    assert (single.value, single.ceiling, single.met) == (2_000, 1_875, True)
    bulk = compared["enqueue, bulk (enqueue_many / its enqueue of lists)"]
    assert (bulk.ratio, bulk.met) == (0.8, False)
