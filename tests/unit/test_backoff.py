"""S14: equal-jitter exponential backoff in whole seconds."""

from __future__ import annotations

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
