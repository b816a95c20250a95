"""S14: equal-jitter exponential backoff in whole seconds."""

from __future__ import annotations

import itertools
import math
import random
from collections import Counter

import pytest

from django_pgjobs.retry import Backoff


@pytest.mark.parametrize(("base", "cap"), [(1, 3600), (10, 3600), (3, 100), (7, 7)])
def test_s14_draws_stay_in_the_equal_jitter_window_and_under_the_cap(base: int, cap: int) -> None:
    backoff = Backoff(base_s=base, cap_s=cap)
    rng = random.Random(1234)
    for attempt in range(1, 40):
        d = min(cap, base * 2 ** (attempt - 1))
        assert backoff.ceiling(attempt) == d
        draws = [backoff.delay(attempt, rng) for _ in range(300)]
        assert all(isinstance(x, int) for x in draws)
        assert min(draws) >= math.ceil(d / 2) and max(draws) <= d <= cap


def test_s14_draws_are_uniform_over_the_window() -> None:
    """A chi-squared test over [ceil(d/2), d] for d = 40: 21 values, 21,000 draws."""
    backoff = Backoff(base_s=10, cap_s=3600)
    rng = random.Random(99)
    draws = Counter(backoff.delay(3, rng) for _ in range(21_000))
    assert sorted(draws) == list(range(20, 41))
    expected = 1000
    chi2 = sum((observed - expected) ** 2 / expected for observed in draws.values())
    # 20 degrees of freedom: P(chi2 > 45.3) = 0.001.
    assert chi2 < 45.3


def test_s14_huge_attempt_numbers_stay_capped() -> None:
    assert Backoff(base_s=10, cap_s=3600).ceiling(10_000) == 3600
    assert Backoff(base_s=10, cap_s=3600).delay(2**40) <= 3600


def test_s14_first_attempt_waits_base() -> None:
    backoff = Backoff(base_s=8, cap_s=3600)
    assert backoff.ceiling(1) == 8
    assert {backoff.delay(1, random.Random(i)) for i in range(200)} == {4, 5, 6, 7, 8}


@pytest.mark.parametrize(("base", "cap"), [(0, 10), (5, 4)])
def test_s14_rejects_a_bad_curve(base: int, cap: int) -> None:
    with pytest.raises(ValueError):
        Backoff(base_s=base, cap_s=cap)


def test_a_worker_reconnects_at_once_after_one_failure_and_backs_off_after_more() -> None:
    """One ended connection (the server is up) costs at most 50 ms of waiting; a streak
    of failures (a restart, a failover) backs off, jittered, growing to the cap."""
    import statistics

    from django_pgjobs.worker.faults import RECONNECT_BACKOFF_CAP_S, reconnect_delay

    firsts = [reconnect_delay(1) for _ in range(2000)]
    assert min(firsts) >= 0 and max(firsts) <= 0.05
    assert len({round(delay, 4) for delay in firsts}) > 100  # jittered, not one instant
    medians = [statistics.median(reconnect_delay(n) for _ in range(200)) for n in range(2, 40)]
    assert min(reconnect_delay(2) for _ in range(200)) >= 0.2
    # Growing; at the cap the steps are equal, and the jitter may swap two medians.
    assert all(later >= earlier * 0.8 for earlier, later in itertools.pairwise(medians))
    assert medians[0] < 1 and medians[-1] > RECONNECT_BACKOFF_CAP_S / 2
    assert max(reconnect_delay(n) for n in range(1, 100) for _ in range(20)) <= 10
