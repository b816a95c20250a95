"""Validate enqueue arguments and resolve them into the values a job row stores (S2, S4).

Resolution happens once, at enqueue: an explicit argument wins over the job's decorator
defaults, which win over the queue's settings, which win over the app defaults. `delay`
wins over `run_after`; `expires` counts from the enqueue. Nothing here touches the
database: a `ResolvedJob` is what the manager then writes in one statement.
"""

from __future__ import annotations

import math
import numbers
import re
from collections.abc import Mapping
from datetime import datetime, timedelta
from decimal import Decimal
from typing import Any, Final, NamedTuple

from django_pgjobs import exceptions
from django_pgjobs.conf import pgjobs_settings
from django_pgjobs.payloads import JSON_ENCODER, encode_payload

QUEUE_NAME_MAX_LENGTH: Final = 100
KIND_MAX_LENGTH: Final = 200
QUEUE_NAME_PATTERN: Final = re.compile(r"[A-Za-z0-9_.:-]+")
KIND_PATTERN: Final = re.compile(r"[A-Za-z0-9_.:-]+")
#: Queue names with this prefix belong to django_pgjobs itself.
RESERVED_QUEUE_PREFIX: Final = "pgjobs."
#: A key is part of a btree index entry, whose size PostgreSQL caps at about 2.7 kB.
KEY_MAX_BYTES: Final = 1024
CONFLICT_MODES: Final = ("replace", "keep_schedule", "ignore")
#: Longest delay, expiry or retention accepted: a century keeps every timestamp in range.
MAX_DURATION_S: Final = 100 * 365 * 86_400
#: Most jobs one claim statement may take.
MAX_CLAIM_SIZE: Final = 100_000

#: Marks an option the caller did not give (None can be a meaningful value).
UNSET: Final[Any] = type("Unset", (), {"__repr__": lambda self: "UNSET"})()


#: The values of one job's row in enqueue_many's JSON document, in order: what
#: ResolvedJob.as_json_row writes and ENQUEUE_JOBS reads by position (`i.row ->> n`).
ENQUEUE_ROW: Final = (
    "queue",
    "kind",
    "priority",
    "delay_s",
    "run_after",
    "max_attempts",
    "lease_s",
    "expires_s",
    "result_ttl_s",
    "timeout_s",
    "concurrency_limit",
    "rate_limit",
    "rate_period_s",
    "limit_key",
    "key",
    "payload",
)


class ResolvedJob(NamedTuple):
    """One job's row values, validated and resolved, ready for ENQUEUE_JOB(S)."""

    queue: str
    kind: str
    key: str | None
    payload_json: str
    priority: int
    delay_s: float | None
    run_after: datetime | None
    max_attempts: int
    lease_s: int
    expires_s: float | None
    result_ttl_s: int | None
    timeout_s: float | None = None
    #: The concurrency key value (S34) and its limits; all None for an unlimited job.
    limit_key: str | None = None
    concurrency_limit: int | None = None
    rate_limit: int | None = None
    rate_period_s: float | None = None

    def json_head(self) -> str:
        """The start of this job's row of ENQUEUE_JOBS' JSON document: every value of
        ENQUEUE_ROW but the limit key, key and payload, which the row ends with (jobs of
        one batch mostly share it)."""
        values = self.as_params()
        values["run_after"] = None if self.run_after is None else self.run_after.isoformat()
        return JSON_ENCODER.encode([values[name] for name in ENQUEUE_ROW[:-3]])[:-1]

    def as_json_row(self, head: str | None = None) -> str:
        """This job as a row of ENQUEUE_JOBS' JSON document (the payload spliced in as is).

        Args:
            head: `json_head()` of a job with the same options, when the caller has it.
        """
        key = "null" if self.key is None else JSON_ENCODER.encode(self.key)
        limit_key = "null" if self.limit_key is None else JSON_ENCODER.encode(self.limit_key)
        head = self.json_head() if head is None else head
        return f"{head},{limit_key},{key},{self.payload_json}]"

    def as_params(self) -> dict[str, Any]:
        return {
            "queue": self.queue,
            "kind": self.kind,
            "key": self.key,
            "payload": self.payload_json,
            "priority": self.priority,
            "delay_s": self.delay_s,
            "run_after": self.run_after,
            "max_attempts": self.max_attempts,
            "lease_s": self.lease_s,
            "expires_s": self.expires_s,
            "result_ttl_s": self.result_ttl_s,
            "timeout_s": self.timeout_s,
            "limit_key": self.limit_key,
            "concurrency_limit": self.concurrency_limit,
            "rate_limit": self.rate_limit,
            "rate_period_s": self.rate_period_s,
        }


def resolve_job(
    kind: str,
    payload: Any = None,
    *,
    queue: Any = UNSET,
    key: Any = None,
    priority: Any = UNSET,
    run_after: Any = None,
    delay: Any = None,
    max_attempts: Any = UNSET,
    lease: Any = UNSET,
    expires: Any = UNSET,
    result_retention: Any = UNSET,
    timeout: Any = UNSET,
    defaults: Mapping[str, Any] | None = None,
) -> ResolvedJob:
    """Validate one job's arguments and resolve its options (S2).

    Args:
        defaults: the job's decorator defaults, if it is registered; keys are the option
            names (`queue`, `priority`, `max_attempts`, `lease`, `expires`,
            `result_retention`, `timeout`).

    Raises:
        InvalidJobOption: a subclass naming what is wrong; nothing is written.
    """
    defaults = defaults or {}
    kind = validate_kind(kind)

    def given(name: str, value: Any) -> Any:
        return defaults.get(name, UNSET) if value is UNSET else value

    queue = given("queue", queue)
    queue = validate_queue_name(pgjobs_settings.DEFAULT_QUEUE if queue is UNSET else queue)
    queue_options = pgjobs_settings.queue_options(queue)

    priority = given("priority", priority)
    max_attempts = given("max_attempts", max_attempts)
    lease = given("lease", lease)
    expires = given("expires", expires)
    result_retention = given("result_retention", result_retention)
    timeout = given("timeout", timeout)

    delay_s, run_after = validate_schedule(run_after, delay)
    expires_s = queue_options.expires_s if expires is UNSET else validate_expires(expires)
    if result_retention is UNSET:
        result_ttl_s = queue_options.result_retention_s
    else:
        result_ttl_s = validate_result_retention(result_retention)
    return ResolvedJob(
        queue=queue,
        kind=kind,
        key=validate_key(key),
        payload_json=encode_payload(payload),
        priority=queue_options.priority if priority is UNSET else validate_priority(priority),
        delay_s=delay_s,
        run_after=run_after,
        max_attempts=(
            queue_options.max_attempts
            if max_attempts is UNSET
            else validate_max_attempts(max_attempts)
        ),
        lease_s=queue_options.lease_s if lease is UNSET else validate_lease(lease),
        expires_s=expires_s,
        result_ttl_s=result_ttl_s,
        timeout_s=None if timeout is UNSET else validate_timeout(timeout),
    )


#: Names already found valid: most enqueues name a handful of queues and kinds.
_valid_queue_names: set[str] = set()
_valid_kinds: set[str] = set()


def validate_queue_name(queue: Any) -> str:
    """Return `queue` if it is a valid queue name, else raise InvalidQueueName."""
    if queue in _valid_queue_names and type(queue) is str:
        return queue
    if not isinstance(queue, str):
        raise exceptions.InvalidQueueName(
            f"Queue name must be a string, not {type(queue).__name__}."
        )
    if not queue:
        raise exceptions.InvalidQueueName("Queue name must not be empty.")
    if len(queue) > QUEUE_NAME_MAX_LENGTH:
        raise exceptions.InvalidQueueName(
            f"Queue name is {len(queue)} characters long; the limit is "
            f"{QUEUE_NAME_MAX_LENGTH} (it travels as the NOTIFY payload)."
        )
    if not QUEUE_NAME_PATTERN.fullmatch(queue):
        raise exceptions.InvalidQueueName(
            f"Queue name {queue!r} may only contain letters, digits and _ . : -"
        )
    if queue.startswith(RESERVED_QUEUE_PREFIX):
        raise exceptions.InvalidQueueName(
            f"Queue name {queue!r} uses the prefix {RESERVED_QUEUE_PREFIX!r}, "
            "which is reserved for django_pgjobs itself."
        )
    if len(_valid_queue_names) < 10_000:
        _valid_queue_names.add(queue)
    return queue


def validate_queue_names(queues: Any) -> list[str]:
    """Return a non-empty, de-duplicated list of valid queue names."""
    if isinstance(queues, str):
        queues = [queues]
    try:
        names = list(dict.fromkeys(queues))
    except TypeError:
        raise exceptions.InvalidQueueName(
            f"Queues must be a queue name or a list of them, not {type(queues).__name__}."
        ) from None
    if not names:
        raise exceptions.InvalidQueueName("At least one queue name is needed.")
    return [validate_queue_name(name) for name in names]


def validate_kind(kind: Any) -> str:
    if kind in _valid_kinds and type(kind) is str:
        return kind
    if not isinstance(kind, str):
        definition = getattr(kind, "definition", None)
        if definition is not None:  # a @job function: it enqueues itself
            name = getattr(kind, "__name__", "f")
            raise exceptions.InvalidKind(
                f"Job kind must be a string (a kind's name, such as {definition.kind!r}), not "
                f"the @job function {name}: call {name}.enqueue(...), or "
                f"{name}.using(after=..., queue=...).enqueue(...) for options."
            )
        raise exceptions.InvalidKind(f"Job kind must be a string, not {type(kind).__name__}.")
    if not kind:
        raise exceptions.InvalidKind("Job kind must not be empty.")
    if len(kind) > KIND_MAX_LENGTH:
        raise exceptions.InvalidKind(
            f"Job kind is {len(kind)} characters long; the limit is {KIND_MAX_LENGTH}."
        )
    if not KIND_PATTERN.fullmatch(kind):
        raise exceptions.InvalidKind(
            f"Job kind {kind!r} may only contain letters, digits and _ . : -"
        )
    if len(_valid_kinds) < 10_000:
        _valid_kinds.add(kind)
    return kind


def validate_key(key: Any) -> str | None:
    if key is None:
        return None
    if not isinstance(key, str):
        raise exceptions.InvalidKey(f"Job key must be a string or None, not {type(key).__name__}.")
    if not key:
        raise exceptions.InvalidKey("Job key must not be empty (use None for no key).")
    if "\x00" in key:
        raise exceptions.InvalidKey("Job key must not contain NUL characters.")
    try:
        size = len(key.encode("utf-8"))
    except UnicodeEncodeError:
        raise exceptions.InvalidKey(
            "Job key is not valid Unicode text (it holds a lone surrogate)."
        ) from None
    if size > KEY_MAX_BYTES:
        raise exceptions.InvalidKey(
            f"Job key is {size} bytes in UTF-8; the limit is {KEY_MAX_BYTES}."
        )
    return key


def validate_priority(priority: Any) -> int:
    if not _is_int(priority) or not -100 <= priority <= 100:
        raise exceptions.InvalidPriority(
            f"Priority must be a whole number from -100 to 100, not {priority!r}."
        )
    return int(priority)


def validate_max_attempts(max_attempts: Any) -> int:
    if not _is_int(max_attempts) or max_attempts < 1:
        raise exceptions.InvalidMaxAttempts(
            f"max_attempts must be a whole number of at least 1, not {max_attempts!r}."
        )
    if max_attempts > 2**31 - 1:
        raise exceptions.InvalidMaxAttempts(f"max_attempts {max_attempts} is too large.")
    return int(max_attempts)


def validate_lease(lease: Any) -> int:
    """Return the lease in whole seconds (fractions round up); at least 1 second."""
    seconds = _duration_seconds(lease, "lease", exceptions.InvalidLease)
    if seconds <= 0:
        raise exceptions.InvalidLease(f"lease must be positive, not {lease!r}.")
    whole = math.ceil(seconds)
    if whole > 2**31 - 1:
        raise exceptions.InvalidLease(f"lease of {lease!r} is longer than 2**31 - 1 seconds.")
    return whole


def validate_timeout(timeout: Any) -> float | None:
    """Return a timeout in seconds (None: none); it must be positive (S33)."""
    if timeout is None:
        return None
    seconds = _duration_seconds(timeout, "timeout", exceptions.InvalidTimeout)
    if seconds <= 0:
        raise exceptions.InvalidTimeout(
            f"timeout must be a positive duration (or None for none), not {timeout!r}."
        )
    return seconds


def validate_extend(extend: Any) -> float:
    """Return a heartbeat extension in seconds; it must be positive."""
    seconds = _duration_seconds(extend, "extend", exceptions.InvalidLease)
    if seconds <= 0:
        raise exceptions.InvalidLease(
            f"A heartbeat must extend the lease by a positive time, not {extend!r}."
        )
    return seconds


def validate_expires(expires: Any) -> float | None:
    if expires is None:
        return None
    seconds = _duration_seconds(expires, "expires", exceptions.InvalidExpiry)
    if seconds <= 0:
        raise exceptions.InvalidExpiry(f"expires must be a positive duration, not {expires!r}.")
    return seconds


def validate_result_retention(retention: Any) -> int | None:
    if retention is None:
        return None
    seconds = _duration_seconds(retention, "result_retention", exceptions.InvalidResultRetention)
    if seconds < 0:
        raise exceptions.InvalidResultRetention(
            f"result_retention must not be negative, not {retention!r}."
        )
    whole = math.ceil(seconds)
    if whole > 2**31 - 1:
        raise exceptions.InvalidResultRetention(
            f"result_retention of {retention!r} is longer than 2**31 - 1 seconds."
        )
    return whole or None


def validate_schedule(run_after: Any, delay: Any) -> tuple[float | None, datetime | None]:
    """Return (delay in seconds, run_after); `delay` wins when both are given (S2).

    Both are checked either way: a bad `run_after` is an error even beside a delay.
    """
    if run_after is not None:
        if not isinstance(run_after, datetime):
            raise exceptions.InvalidSchedule(
                f"run_after must be a datetime, not {type(run_after).__name__}."
            )
        if run_after.tzinfo is None or run_after.utcoffset() is None:
            raise exceptions.InvalidSchedule(
                f"run_after must be timezone-aware; got the naive datetime {run_after!r}."
            )
    if delay is not None:
        seconds = _duration_seconds(delay, "delay", exceptions.InvalidSchedule)
        if seconds < 0:
            raise exceptions.InvalidSchedule(f"delay must not be negative, not {delay!r}.")
        return seconds, None
    return None, run_after


def validate_conflict_mode(on_conflict: Any) -> str:
    if on_conflict not in CONFLICT_MODES:
        raise exceptions.InvalidConflictMode(
            f"on_conflict must be one of {', '.join(map(repr, CONFLICT_MODES))}, "
            f"not {on_conflict!r}."
        )
    return str(on_conflict)


def validate_worker_id(worker_id: Any) -> str:
    if not isinstance(worker_id, str) or not worker_id.strip():
        raise exceptions.InvalidWorkerId(
            f"worker_id must be a non-empty string, not {worker_id!r}."
        )
    if "\x00" in worker_id:
        raise exceptions.InvalidWorkerId("worker_id must not contain NUL characters.")
    return worker_id


def validate_claim_size(n: Any) -> int:
    if not _is_int(n):
        raise exceptions.InvalidClaimSize(
            f"The number of jobs to claim must be a whole number, not {n!r}."
        )
    if n > MAX_CLAIM_SIZE:
        raise exceptions.InvalidClaimSize(
            f"A claim takes at most {MAX_CLAIM_SIZE:,} jobs, not {n:,}: claim in batches."
        )
    return int(n)


def validate_retry_delay(delay: Any) -> float | None:
    """Return a retry delay in seconds (None: the backoff), or raise InvalidSchedule.

    A delay is a number of seconds (int, float, Decimal, Fraction) or a timedelta. A delay in
    the past (negative) means now: a Retry-After that passed while the handler ran is
    an ordinary thing. NaN, infinity, more than a century, or not a number at all is a
    handler's bug (S27).
    """
    if delay is None:
        return None
    if isinstance(delay, timedelta):
        seconds = delay.total_seconds()
    elif isinstance(delay, bool) or not isinstance(delay, numbers.Real | Decimal):
        raise exceptions.InvalidSchedule(
            f"A retry delay must be a number of seconds or a timedelta, not {delay!r}."
        )
    else:
        try:
            seconds = float(delay)
        except (ValueError, OverflowError):  # a signalling NaN, a huge Fraction
            seconds = math.nan
    if math.isnan(seconds) or math.isinf(seconds):
        raise exceptions.InvalidSchedule(
            f"A retry delay must be a finite number of seconds, not {delay!r}."
        )
    if seconds > MAX_DURATION_S:
        raise exceptions.InvalidSchedule(
            f"A retry delay of {delay!r} is longer than a century, the longest accepted."
        )
    return max(seconds, 0.0)


def _duration_seconds(value: Any, name: str, error: type[exceptions.InvalidJobOption]) -> float:
    if isinstance(value, timedelta):
        seconds = value.total_seconds()
    elif isinstance(value, int | float) and not isinstance(value, bool):
        seconds = float(value)
        if not math.isfinite(seconds):
            raise error(f"{name} must be a finite number of seconds, not {value!r}.")
    else:
        raise error(f"{name} must be a number of seconds or a timedelta, not {value!r}.")
    if abs(seconds) > MAX_DURATION_S:
        raise error(f"{name} of {value!r} is longer than a century, the longest accepted.")
    return seconds


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)
