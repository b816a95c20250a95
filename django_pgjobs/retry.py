"""The backoff curve (DESIGN S14): equal-jitter exponential, whole seconds.

A pure function of the attempt number: no clock, no database. The delay it returns is a
duration; the database adds it to its own `now()` (S22).
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass

_system_random = random.SystemRandom()


@dataclass(frozen=True, slots=True)
class Backoff:
    """Equal-jitter exponential backoff: `d = min(cap, base * 2**(attempt - 1))`, and the
    delay is a whole number of seconds drawn uniformly from `[ceil(d / 2), d]`."""

    base_s: int
    cap_s: int

    def __post_init__(self) -> None:
        if self.base_s < 1:
            raise ValueError(f"Backoff base must be at least 1 second, not {self.base_s}.")
        if self.cap_s < self.base_s:
            raise ValueError(f"Backoff cap ({self.cap_s}) must be at least its base.")

    def ceiling(self, attempt: int) -> int:
        """Return `d` for an attempt (1 for the first): the longest delay it may draw."""
        cap = self.cap_s
        exponent = max(attempt, 1) - 1
        # 2**exponent grows without bound; once base * 2**exponent passes the cap it
        # stays capped, so stop doubling early rather than build a huge integer.
        if exponent >= cap.bit_length():
            return cap
        return min(cap, self.base_s << exponent)

    def delay(self, attempt: int, rng: random.Random = _system_random) -> int:
        """Draw the delay before the retry that follows `attempt`, in whole seconds."""
        ceiling = self.ceiling(attempt)
        return rng.randint(math.ceil(ceiling / 2), ceiling)
