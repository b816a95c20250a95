"""S4: bad input gets a specific exception and writes nothing."""

from __future__ import annotations

import enum
import math
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from django_pgjobs import exceptions
from django_pgjobs.models import Job
from django_pgjobs.options import KEY_MAX_BYTES, QUEUE_NAME_MAX_LENGTH
from tests.helpers import count, execute, row, scalar

pytestmark = pytest.mark.django_db

BAD_ENQUEUES: list[tuple[dict[str, Any], type[Exception], str]] = [
    ({"queue": ""}, exceptions.InvalidQueueName, "empty"),
    ({"queue": "q" * (QUEUE_NAME_MAX_LENGTH + 1)}, exceptions.InvalidQueueName, "NOTIFY"),
    ({"queue": "pgjobs.internal"}, exceptions.InvalidQueueName, "reserved"),
    ({"queue": "with space"}, exceptions.InvalidQueueName, "letters, digits"),
    ({"queue": "emails'; DROP TABLE pgjobs_job; --"}, exceptions.InvalidQueueName, "letters"),
    ({"queue": 7}, exceptions.InvalidQueueName, "string"),
    ({"payload": [1, 2]}, exceptions.InvalidPayload, "dict"),
    ({"payload": "text"}, exceptions.InvalidPayload, "dict"),
    ({"payload": {"x": float("nan")}}, exceptions.InvalidPayload, "nan"),
    ({"payload": {"x": [float("inf")]}}, exceptions.InvalidPayload, "inf"),
    ({"payload": {"x": object()}}, exceptions.InvalidPayload, "not JSON"),
    ({"payload": {"x": {1: "int key"}}}, exceptions.InvalidPayload, "keys must be strings"),
    ({"payload": {"x": "\ud800"}}, exceptions.InvalidPayload, "surrogate"),
    ({"payload": {"x": "nul\x00"}}, exceptions.InvalidPayload, "NUL"),
    ({"payload": {"x": b"bytes"}}, exceptions.InvalidPayload, "bytes"),
    ({"payload": {"x": datetime(2020, 1, 1)}}, exceptions.InvalidPayload, "datetime"),
    ({"priority": 101}, exceptions.InvalidPriority, "-100 to 100"),
    ({"priority": -101}, exceptions.InvalidPriority, "-100 to 100"),
    ({"priority": 1.5}, exceptions.InvalidPriority, "whole number"),
    ({"priority": True}, exceptions.InvalidPriority, "whole number"),
    ({"max_attempts": 0}, exceptions.InvalidMaxAttempts, "at least 1"),
    ({"max_attempts": -3}, exceptions.InvalidMaxAttempts, "at least 1"),
    ({"max_attempts": "3"}, exceptions.InvalidMaxAttempts, "whole number"),
    ({"lease": 0}, exceptions.InvalidLease, "positive"),
    ({"lease": -1}, exceptions.InvalidLease, "positive"),
    ({"lease": timedelta(0)}, exceptions.InvalidLease, "positive"),
    ({"lease": float("inf")}, exceptions.InvalidLease, "finite"),
    ({"on_conflict": "merge"}, exceptions.InvalidConflictMode, "replace"),
    ({"on_conflict": None}, exceptions.InvalidConflictMode, "replace"),
    ({"delay": -1}, exceptions.InvalidSchedule, "negative"),
    ({"delay": "soon"}, exceptions.InvalidSchedule, "seconds"),
    ({"delay": 1e12}, exceptions.InvalidSchedule, "century"),
    ({"run_after": datetime(2030, 1, 1)}, exceptions.InvalidSchedule, "timezone-aware"),
    ({"run_after": "2030-01-01"}, exceptions.InvalidSchedule, "datetime"),
    ({"expires": 0}, exceptions.InvalidExpiry, "positive"),
    ({"expires": -5}, exceptions.InvalidExpiry, "positive"),
    ({"key": 42}, exceptions.InvalidKey, "string"),
    ({"key": ""}, exceptions.InvalidKey, "empty"),
    ({"key": "k" * (KEY_MAX_BYTES + 1)}, exceptions.InvalidKey, "bytes"),
    ({"key": "é" * (KEY_MAX_BYTES // 2 + 1)}, exceptions.InvalidKey, "bytes"),
    ({"key": "\ud800"}, exceptions.InvalidKey, "surrogate"),
    ({"key": "a\x00b"}, exceptions.InvalidKey, "NUL"),
    ({"result_retention": -1}, exceptions.InvalidResultRetention, "negative"),
]


@pytest.mark.parametrize(("options", "error", "message"), BAD_ENQUEUES)
def test_s4_bad_enqueue_raises_a_specific_error_and_writes_nothing(
    options: dict[str, Any], error: type[Exception], message: str
) -> None:
    kwargs = dict(options)
    payload = kwargs.pop("payload", {"ok": True})
    with pytest.raises(error, match=f"(?i){message}"):
        Job.objects.enqueue("demo.t", payload, **kwargs)
    assert count() == 0


@pytest.mark.parametrize("kind", ["", "has space", "k" * 201, None, "semi;colon"])
def test_s4_bad_kind(kind: Any) -> None:
    with pytest.raises(exceptions.InvalidKind):
        Job.objects.enqueue(kind)
    assert count() == 0


def test_s4_every_error_is_a_value_error_and_a_pgjobs_error() -> None:
    for _, error, _ in BAD_ENQUEUES:
        assert issubclass(error, exceptions.InvalidJobOption)
        assert issubclass(error, ValueError) and issubclass(error, exceptions.PgJobsError)


def test_s4_payload_size_is_capped() -> None:
    from django.test import override_settings

    with override_settings(PGJOBS={"MAX_PAYLOAD_BYTES": 100}):
        with pytest.raises(exceptions.InvalidPayload, match="limit is 100"):
            Job.objects.enqueue("demo.t", {"blob": "x" * 200})
        # Counted in bytes of UTF-8: 68 characters, 128 bytes.
        with pytest.raises(exceptions.InvalidPayload, match="128 bytes"):
            Job.objects.enqueue("demo.t", {"t": "é" * 60})
        Job.objects.enqueue("demo.t", {"blob": "x" * 50})
        Job.objects.enqueue("demo.t", {"t": "é" * 40})  # 88 bytes
    assert count() == 2


def test_s4_deep_nesting_is_refused() -> None:
    deep: dict[str, Any] = {}
    node = deep
    for _ in range(150):
        node["next"] = {}
        node = node["next"]
    with pytest.raises(exceptions.InvalidPayload, match="deeper"):
        Job.objects.enqueue("demo.t", deep)
    assert count() == 0


class _Text(str):
    pass


class _Level(enum.IntEnum):
    HIGH = 3


def _nested(depth: int) -> dict[str, Any]:
    """A payload whose innermost value is `depth` levels down."""
    value: Any = 1
    for _ in range(depth):
        value = {"n": value}
    return value  # type: ignore[no-any-return]


@pytest.mark.parametrize(
    ("payload", "stored"),
    [
        ({"text": "\\u0000 is six characters"}, {"text": "\\u0000 is six characters"}),
        ({"café": "crème", "emoji": "🎉"}, {"café": "crème", "emoji": "🎉"}),
        ({"pair": (1, "two")}, {"pair": [1, "two"]}),
        ({"n": int("9" * 4000)}, {"n": int("9" * 4000)}),
        ({"level": _Level.HIGH, _Text("key"): _Text("value")}, {"level": 3, "key": "value"}),
        (_nested(100), _nested(100)),
    ],
)
def test_s4_payloads_near_the_limits_of_each_rule_are_stored_as_given(
    payload: dict[str, Any], stored: dict[str, Any]
) -> None:
    """Most payloads pass a quick check of their JSON text; these sit where it hands them
    to the full one, which must accept them all the same."""
    assert row(Job.objects.enqueue("demo.t", payload).id, "payload") == (stored,)


@pytest.mark.parametrize(
    ("payload", "message"),
    [
        ({"n": 10**4000}, "more than 4000 digits"),
        ({1: "int key"}, "keys must be strings"),
        ({"nul\x00key": 1}, "NUL"),
        ({"deep": _nested(100)}, "deeper"),
        ({"x": -math.inf}, "inf"),
    ],
)
def test_s4_payloads_just_past_a_rule_are_refused(payload: dict[Any, Any], message: str) -> None:
    with pytest.raises(exceptions.InvalidPayload, match=message):
        Job.objects.enqueue_many([{"kind": "demo.t"}, {"kind": "demo.t", "payload": payload}])
    assert count() == 0


@pytest.mark.parametrize(
    ("worker_id", "error"),
    [
        ("", exceptions.InvalidWorkerId),
        ("   ", exceptions.InvalidWorkerId),
        (None, exceptions.InvalidWorkerId),
    ],
)
def test_s4_empty_worker_id_at_claim(worker_id: Any, error: type[Exception]) -> None:
    Job.objects.enqueue("demo.t")
    with pytest.raises(error):
        Job.objects.claim_batch("default", 1, worker_id)
    assert row(Job.objects.get().id, "state") == ("pending",)


@pytest.mark.parametrize("queues", [[], "", ["ok", "bad name"], 5])
def test_s4_bad_queues_at_claim(queues: Any) -> None:
    with pytest.raises(exceptions.InvalidQueueName):
        Job.objects.claim_batch(queues, 1, "w1")


def test_s4_claim_size_must_be_whole() -> None:
    with pytest.raises(exceptions.InvalidClaimSize):
        Job.objects.claim_batch("default", 2.5, "w1")  # type: ignore[arg-type]


def test_s4_a_result_that_is_not_json_is_refused_and_the_job_stays_claimed() -> None:
    Job.objects.enqueue("demo.t")
    handle = Job.objects.claim_one("default", "w1")
    with pytest.raises(exceptions.InvalidPayload):
        handle.ack({"when": datetime.now(UTC)})
    assert row(handle.id, "state") == ("running",)


def test_s4_sql_looking_strings_are_data() -> None:
    evil = "x'); DELETE FROM pgjobs_job; --"
    job_id = Job.objects.enqueue("demo.t", {evil: evil}, key=evil).id
    assert row(job_id, "payload", "key") == ({evil: evil}, evil)


# Hypothesis: random enqueue arguments either raise the documented exception with nothing
# written, or make exactly the row the rules say.

json_scalars = st.none() | st.booleans() | st.integers() | st.floats() | st.text()
json_values = st.recursive(
    json_scalars,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(), inner, max_size=4),
    max_leaves=20,
)
maybe = st.none() | st.just(...)


def _expected_errors(arguments: dict[str, Any]) -> set[type[Exception]]:
    """What S4 says about these arguments: every exception that applies (empty: valid)."""
    problems: set[type[Exception]] = set()
    queue = arguments["queue"]
    if (
        not queue
        or len(queue) > QUEUE_NAME_MAX_LENGTH
        or not all(c.isascii() and (c.isalnum() or c in "_.:-") for c in queue)
        or queue.startswith("pgjobs.")
    ):
        problems.add(exceptions.InvalidQueueName)
    key = arguments["key"]
    if key is not None:
        try:
            size = len(key.encode())
        except UnicodeEncodeError:
            size = KEY_MAX_BYTES + 1
        if not key or "\x00" in key or size > KEY_MAX_BYTES:
            problems.add(exceptions.InvalidKey)
    if not _is_storable(arguments["payload"]):
        problems.add(exceptions.InvalidPayload)
    if not -100 <= arguments["priority"] <= 100:
        problems.add(exceptions.InvalidPriority)
    delay = arguments["delay"]
    if delay is not None and (math.isnan(delay) or not 0 <= delay <= 100 * 365 * 86400):
        problems.add(exceptions.InvalidSchedule)
    return problems


def same_json(stored: Any, given: Any) -> bool:
    """Compare as JSON stored in jsonb: numbers go through PostgreSQL's numeric, so a float
    comes back as the same value, as an int when written in exponent notation."""
    if isinstance(given, float) or isinstance(stored, float):
        return isinstance(stored, int | float) and float(stored) == float(given)
    if isinstance(given, dict):
        return (
            isinstance(stored, dict)
            and stored.keys() == given.keys()
            and all(same_json(stored[k], given[k]) for k in given)
        )
    if isinstance(given, list | tuple):
        return (
            isinstance(stored, list)
            and len(stored) == len(given)
            and all(same_json(a, b) for a, b in zip(stored, given, strict=True))
        )
    return type(stored) is type(given) and stored == given


def _is_storable(value: Any) -> bool:
    if isinstance(value, float):
        return math.isfinite(value)
    if isinstance(value, str):
        try:
            value.encode()
        except UnicodeEncodeError:
            return False
        return "\x00" not in value
    if isinstance(value, list):
        return all(_is_storable(item) for item in value)
    if isinstance(value, dict):
        return all(_is_storable(k) and _is_storable(v) for k, v in value.items())
    return True


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    queue=st.one_of(
        st.just("default"), st.text(max_size=110), st.sampled_from(["pgjobs.x", "a:b-c.d_e"])
    ),
    key=st.none() | st.text(max_size=40) | st.text(min_size=1020, max_size=1100),
    payload=st.dictionaries(st.text(max_size=10), json_values, max_size=5),
    priority=st.integers(min_value=-150, max_value=150),
    delay=st.none()
    | st.floats(allow_infinity=False, min_value=-10, max_value=1e5)
    | st.just(float("nan")),
)
def test_s4_property_enqueue_raises_documented_error_or_writes_the_documented_row(
    queue: str, key: str | None, payload: dict[str, Any], priority: int, delay: float | None
) -> None:
    arguments = {
        "queue": queue,
        "key": key,
        "payload": payload,
        "priority": priority,
        "delay": delay,
    }
    expected = _expected_errors(arguments)
    execute("DELETE FROM pgjobs_job")
    if expected:
        with pytest.raises(tuple(expected)):
            Job.objects.enqueue(
                "demo.prop", payload, queue=queue, key=key, priority=priority, delay=delay
            )
        assert count() == 0
        return
    job_id = Job.objects.enqueue(
        "demo.prop", payload, queue=queue, key=key, priority=priority, delay=delay
    ).id
    stored = row(job_id, "queue", "kind", "key", "payload", "priority", "state", "attempts")
    assert stored[:3] == (queue, "demo.prop", key)
    assert same_json(stored[3], payload)
    assert stored[4:] == (priority, "pending", 0)
    offset = scalar("SELECT extract(epoch FROM run_after - now()) FROM pgjobs_job")
    assert abs(float(offset) - (delay or 0)) < 1
