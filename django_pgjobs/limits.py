"""Limits a job kind brings to its jobs (S34, S35): a concurrency key, how many jobs of
one key value may run at once, and how many claims of it a period admits.

The limits travel in each job's row (`limit_key`, `concurrency_limit`, `rate_limit`,
`rate_period_s`): the claim statements enforce them in the database, whichever worker
claims. A key value is shared by every kind that gives it (prefix values, e.g.
"tenant:7", to keep limits apart).

    @job(concurrency_key=lambda p: f"tenant:{p['tenant']}", concurrency=2, rate="100/m")
    def summarise(tenant, document_id): ...
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Final

from django_pgjobs.exceptions import InvalidLimit
from django_pgjobs.payloads import safe_str

#: Most characters of a concurrency key value (it is part of two index entries).
LIMIT_KEY_MAX_LENGTH: Final = 200
#: Most jobs of one key allowed to run at once, and most claims per period.
MAX_CONCURRENCY: Final = 100_000
MAX_RATE: Final = 1_000_000
#: The longest period a rate may count over: the sweeper keeps a day of claims.
MAX_RATE_PERIOD_S: Final = 86_400.0

_UNITS: Final = {
    "s": 1.0,
    "sec": 1.0,
    "second": 1.0,
    "m": 60.0,
    "min": 60.0,
    "minute": 60.0,
    "h": 3600.0,
    "hour": 3600.0,
    "d": 86_400.0,
    "day": 86_400.0,
}
_RATE: Final = re.compile(r"\s*(\d+)\s*/\s*(\d+(?:\.\d+)?)?\s*([a-z]+)\s*", re.IGNORECASE)


@dataclass(frozen=True, slots=True)
class Rate:
    """At most `limit` claims in any window of `period_s` seconds, on the database clock."""

    limit: int
    period_s: float

    @classmethod
    def parse(cls, rate: Any) -> Rate:
        """A rate from "100/m", "5/s", "1000/h", "10/d", "3/10s" (or a Rate, or a
        (limit, seconds) pair).

        Raises:
            InvalidLimit: saying what a rate looks like.
        """
        if isinstance(rate, Rate):
            return cls._checked(rate.limit, rate.period_s, rate)
        if isinstance(rate, tuple) and len(rate) == 2:
            limit, period = rate
            if _is_int(limit) and isinstance(period, int | float) and not isinstance(period, bool):
                return cls._checked(limit, float(period), rate)
        if isinstance(rate, str):
            match = _RATE.fullmatch(rate)
            unit = _unit(match.group(3)) if match is not None else None
            if match is not None and unit is not None:
                count = float(match.group(2)) if match.group(2) else 1.0
                return cls._checked(int(match.group(1)), count * unit, rate)
        raise InvalidLimit(
            f"rate must look like '100/m' (claims per s, m, h or d; '3/10s' for three per "
            f"ten seconds), not {safe_str(rate)[:100]!r}."
        )

    @classmethod
    def _checked(cls, limit: int, period_s: float, given: object) -> Rate:
        if not 1 <= limit <= MAX_RATE:
            raise InvalidLimit(f"rate {given!r}: the count must be 1 to {MAX_RATE:,}.")
        if not (math.isfinite(period_s) and 0 < period_s <= MAX_RATE_PERIOD_S):
            raise InvalidLimit(f"rate {given!r}: the period must be more than 0 and at most a day.")
        return cls(limit, period_s)

    def __str__(self) -> str:
        for unit, seconds in (("d", 86_400.0), ("h", 3600.0), ("m", 60.0), ("s", 1.0)):
            if self.period_s == seconds:
                return f"{self.limit}/{unit}"
        return f"{self.limit}/{self.period_s:g}s"


@dataclass(frozen=True, slots=True)
class Limits:
    """A kind's limits: the key its jobs are counted under, and the bounds per key value.

    `key` is a function of the payload returning the key value (None: this job is not
    limited), or a fixed value. A rate without a key limits the kind as a whole (its
    key value is the kind's name).
    """

    key: Callable[[dict[str, Any]], Any] | str | None
    concurrency: int | None
    rate: Rate | None

    @classmethod
    def of(cls, *, key: Any = None, concurrency: Any = None, rate: Any = None) -> Limits | None:
        """The limits the decorator was given, validated (None: none).

        Raises:
            InvalidLimit: naming the bad option.
        """
        if key is None and concurrency is None and rate is None:
            return None
        if key is not None and not callable(key):
            key = validate_limit_key(key)
        if concurrency is not None:
            if not _is_int(concurrency) or not 1 <= concurrency <= MAX_CONCURRENCY:
                raise InvalidLimit(
                    f"concurrency must be a whole number from 1 to {MAX_CONCURRENCY:,}, "
                    f"not {safe_str(concurrency)[:100]!r}."
                )
            if key is None:
                raise InvalidLimit(
                    "concurrency needs a concurrency_key: the value its jobs are counted "
                    "under (a queue's limit is set with jobsctl limit or PGJOBS['QUEUES'])."
                )
        parsed = None if rate is None else Rate.parse(rate)
        if key is not None and concurrency is None and parsed is None:
            raise InvalidLimit("concurrency_key needs a concurrency, a rate, or both.")
        return cls(key=key, concurrency=concurrency, rate=parsed)

    def key_value(self, kind: str, payload: Mapping[str, Any] | None) -> str | None:
        """The key value of a job of `kind` with `payload` (None: not limited).

        Raises:
            InvalidLimit: the key function raised or returned no usable value; the
                enqueue writes nothing.
        """
        if self.key is None:
            return kind
        if not callable(self.key):
            return self.key
        try:
            value = self.key(dict(payload or {}))
        except Exception as error:
            raise InvalidLimit(
                f"The concurrency_key of {kind} raised {type(error).__name__}: "
                f"{safe_str(error)[:200]}. Nothing was written."
            ) from error
        if value is None:
            return None
        if isinstance(value, int) and not isinstance(value, bool):
            value = str(value)
        try:
            return validate_limit_key(value)
        except InvalidLimit as error:
            raise InvalidLimit(
                f"The concurrency_key of {kind}: {error} Nothing was written."
            ) from None


def validate_limit_key(value: Any) -> str:
    """A concurrency key value: non-empty text of at most LIMIT_KEY_MAX_LENGTH characters."""
    if not isinstance(value, str):
        raise InvalidLimit(
            f"A concurrency key value must be a string or a whole number, not "
            f"{type(value).__name__}."
        )
    if not value or len(value) > LIMIT_KEY_MAX_LENGTH:
        raise InvalidLimit(
            f"A concurrency key value must be 1 to {LIMIT_KEY_MAX_LENGTH} characters, not "
            f"{len(value)}."
        )
    if "\x00" in value or any(0xD800 <= ord(char) <= 0xDFFF for char in value):
        raise InvalidLimit("A concurrency key value must be text without NUL or lone surrogates.")
    return value


def _unit(name: str) -> float | None:
    """Seconds of a unit name ("m", "min", "minutes" ...), or None."""
    name = name.lower()
    if name not in _UNITS and len(name) > 3 and name.endswith("s"):
        name = name[:-1]  # "minutes", "hours", "days", "seconds"
    return _UNITS.get(name)


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)
