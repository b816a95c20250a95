"""JSON and text that PostgreSQL stores as they are: payloads and results checked (S4,
S27), error texts cleaned (S27).

A payload is a JSON object, a result any JSON value; both are checked before they reach
SQL, so the database never refuses one: no NaN, no NUL, no lone surrogate, no integer
Python cannot write, nothing nested past PAYLOAD_MAX_DEPTH, nothing past
MAX_PAYLOAD_BYTES. Error texts are not refused but cleaned: escaped, then bounded.
"""

from __future__ import annotations

import json
import math
from typing import Any, Final

from django_pgjobs import exceptions
from django_pgjobs.conf import pgjobs_settings

#: Deepest nesting of lists and objects accepted in a payload.
PAYLOAD_MAX_DEPTH: Final = 100
#: Integers in payloads and results: Python refuses to write longer ones as text.
PAYLOAD_INT_MAX_DIGITS: Final = 4000
_INT_LIMIT: Final = 10**PAYLOAD_INT_MAX_DIGITS
#: Longest error text kept of one failed attempt (and of a dead letter's reason), and
#: longest traceback: past them the middle is cut out, and the cut is marked (S27).
ERROR_TEXT_MAX_CHARS: Final = 2_000
TRACEBACK_MAX_CHARS: Final = 20_000
#: Longest progress message kept, and most bytes of one progress report's JSON.
PROGRESS_MESSAGE_MAX_CHARS: Final = 1_000
PROGRESS_MAX_BYTES: Final = 16_384


def encode_payload(payload: Any) -> str:
    """Return the payload as JSON text, or raise InvalidPayload saying what is wrong.

    A payload is a JSON object: a dict with string keys whose values are strings,
    numbers (finite), booleans, None, lists (tuples are stored as lists) and dicts of
    the same, at most PAYLOAD_MAX_DEPTH deep and MAX_PAYLOAD_BYTES long. None means {}.
    """
    if payload is None:
        return "{}"
    limit = pgjobs_settings.MAX_PAYLOAD_BYTES
    if type(payload) is dict:
        text = _plain_json(payload)
        if text is not None and utf8_size(text) <= limit:
            return text
    if not isinstance(payload, dict):
        raise exceptions.InvalidPayload(
            f"Payload must be a dict (a JSON object), not {type(payload).__name__}."
        )
    _check_json_value(payload, "payload", 0)
    text = JSON_ENCODER.encode(payload)
    try:
        size = len(text.encode("utf-8"))
    except UnicodeEncodeError:
        raise exceptions.InvalidPayload(
            "Payload holds a string that is not valid Unicode text (a lone surrogate)."
        ) from None
    if size > limit:
        raise exceptions.InvalidPayload(
            f"Payload is {size} bytes of JSON; the limit is {limit} "
            "(PGJOBS['MAX_PAYLOAD_BYTES']). Store large data in a table and pass its id."
        )
    return text


def encode_result(result: Any) -> str | None:
    """Return a job's result as JSON text (None for None), or raise InvalidPayload.

    A result is JSON data of the same kinds as a payload (any JSON value, not only an
    object), at most MAX_PAYLOAD_BYTES long.
    """
    if result is None:
        return None
    limit = pgjobs_settings.MAX_PAYLOAD_BYTES
    text = _plain_json(result)
    if text is None:
        _check_json_value(result, "result", 0)
        text = JSON_ENCODER.encode(result)
    try:
        size = utf8_size(text)
    except UnicodeEncodeError:
        raise exceptions.InvalidPayload(
            "The result holds a string that is not valid Unicode text (a lone surrogate)."
        ) from None
    if size > limit:
        raise exceptions.ResultTooLarge(
            f"result is {size} bytes of JSON; the limit is {limit} "
            "(PGJOBS['MAX_PAYLOAD_BYTES']): store large results in a table and return its id."
        )
    return text


def encode_progress(fraction: Any, message: Any, data: dict[str, Any]) -> str:
    """Return a progress report as JSON text: {"fraction", "message", "data"}.

    `fraction` is None or a number from 0 to 1; `message` None or text (cleaned and
    bounded like an error text); `data` JSON values, at most PROGRESS_MAX_BYTES in all.

    Raises:
        InvalidPayload: saying what is wrong (the handler's bug: nothing is stored).
    """
    if fraction is not None:
        if isinstance(fraction, bool) or not isinstance(fraction, int | float):
            raise exceptions.InvalidPayload(
                f"progress fraction must be a number from 0 to 1, not {safe_str(fraction)[:80]!r}."
            )
        fraction = float(fraction)
        if not 0.0 <= fraction <= 1.0:  # NaN fails this too
            raise exceptions.InvalidPayload(
                f"progress fraction must be a number from 0 to 1, not {fraction!r}."
            )
    if message is not None:
        message = storable_text(message, PROGRESS_MESSAGE_MAX_CHARS)
    report = {"fraction": fraction, "message": message, "data": data}
    try:
        text = encode_result(report)
    except exceptions.InvalidPayload as error:
        raise exceptions.InvalidPayload(f"progress data: {error}") from None
    assert text is not None
    if utf8_size(text) > PROGRESS_MAX_BYTES:
        raise exceptions.InvalidPayload(
            f"a progress report is at most {PROGRESS_MAX_BYTES:,} bytes of JSON; this one is "
            f"{utf8_size(text):,}. Report a summary; keep large data in a table."
        )
    return text


def storable_text(value: object, limit: int) -> str:
    """Return `value` as text PostgreSQL stores as it is (S27): NUL escaped as `\\x00`,
    lone surrogates as `\\udXXX`, at most `limit` characters (the middle cut out and
    the cut marked). A value whose `str()` raises reads as its class and that failure.
    """
    text = value if type(value) is str else safe_str(value)
    if "\x00" in text:
        text = text.replace("\x00", "\\x00")
    if not text.isascii():
        try:
            text.encode("utf-8")
        except UnicodeEncodeError:
            text = text.encode("utf-8", "backslashreplace").decode("utf-8")
    if len(text) > limit:
        head = limit // 2
        cut = len(text) - limit
        tail = text[len(text) - (limit - head) :]
        text = f"{text[:head]}\n... [{cut:,} characters cut] ...\n{tail}"
    return text


def safe_str(value: object) -> str:
    """`str(value)`, or what it is when its `__str__` fails (a handler's own classes)."""
    try:
        text = str(value)
        return str.__str__(text)
    except BaseException as error:  # a hostile __str__ must not take the worker down
        return f"<str() raised {type(error).__name__} on a {type(value).__name__}>"


_SCALARS = (str, int, float, bool, type(None))
_EXACT_SCALARS: Final = frozenset(_SCALARS)
#: One encoder for payloads and results (values already checked by _check_json_value).
JSON_ENCODER = json.JSONEncoder(ensure_ascii=False, allow_nan=False, separators=(",", ":"))


def _plain_json(value: Any) -> str | None:
    """The JSON text of `value` when it is plainly fine, else None (then _check_json_value
    decides, and says what is wrong).

    The quick answer for the common value: built of the exact JSON types, with string keys,
    at most PAYLOAD_MAX_DEPTH deep (_of_json_types), and whose text is short enough that no
    integer in it can reach PAYLOAD_INT_MAX_DIGITS, holds no escaped NUL, encodes without
    NaN or infinity, and is ASCII or valid UTF-8. Anything else, including subclasses of
    the JSON types, takes the full check.
    """
    if not _of_json_types(value, 0):
        return None
    try:
        text = JSON_ENCODER.encode(value)
    except ValueError:  # NaN or infinity
        return None
    if len(text) >= PAYLOAD_INT_MAX_DIGITS or "\\u0000" in text:
        return None
    if not text.isascii():
        try:
            text.encode("utf-8")
        except UnicodeEncodeError:
            return None
    return text


def utf8_size(text: str) -> int:
    """Bytes of `text` in UTF-8 (text known to encode)."""
    return len(text) if text.isascii() else len(text.encode("utf-8"))


def _of_json_types(value: Any, depth: int) -> bool:
    """Whether `value` holds only str, int, float, bool, None, list, tuple and dict (exactly
    those types), dicts keyed by str, nested at most PAYLOAD_MAX_DEPTH deep."""
    kind = type(value)
    if kind in _EXACT_SCALARS:
        return True
    if depth >= PAYLOAD_MAX_DEPTH:
        return False
    if kind is dict:
        for key in value:
            if type(key) is not str:
                return False
        value = value.values()
    elif kind is not list and kind is not tuple:
        return False
    for item in value:
        if type(item) not in _EXACT_SCALARS and not _of_json_types(item, depth + 1):
            return False
    return True


def _check_json_value(value: Any, path: str, depth: int) -> None:
    if depth > PAYLOAD_MAX_DEPTH:
        raise exceptions.InvalidPayload(f"{path} is nested deeper than {PAYLOAD_MAX_DEPTH} levels.")
    if isinstance(value, dict):
        for item_key, item in value.items():
            if not isinstance(item_key, str):
                raise exceptions.InvalidPayload(
                    f"Payload keys must be strings; {path} has the key {item_key!r}."
                )
            if "\x00" in item_key:
                raise exceptions.InvalidPayload(f"{path} has a key with a NUL character.")
            _check_json_value(item, f"{path}[{item_key!r}]", depth + 1)
    elif isinstance(value, list | tuple):
        for index, item in enumerate(value):
            _check_json_value(item, f"{path}[{index}]", depth + 1)
    elif isinstance(value, float):
        if not math.isfinite(value):
            raise exceptions.InvalidPayload(f"{path} is {value!r}, which JSON cannot hold.")
    elif isinstance(value, int) and not isinstance(value, bool):
        if abs(value) >= _INT_LIMIT:
            raise exceptions.InvalidPayload(
                f"{path} is an integer of more than {PAYLOAD_INT_MAX_DIGITS} digits; "
                "store it as a string."
            )
    elif isinstance(value, str):
        if "\x00" in value:
            raise exceptions.InvalidPayload(
                f"{path} holds a NUL character, which PostgreSQL's jsonb cannot store."
            )
    elif not isinstance(value, _SCALARS):
        name = type(value).__name__
        article = "an" if name[:1].lower() in "aeiou" else "a"
        raise exceptions.InvalidPayload(
            f"{path} is {article} {name}, which is not JSON; use plain data "
            "(str, int, float, bool, None, list, dict)."
        )
