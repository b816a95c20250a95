"""Hostile input: random and malicious enqueue arguments (S4), and the code paths a crafted
row could abuse (no pickle, no eval, no import of a stored path, every SQL value a
parameter). Rows edited by hand into nonsense: concurrency/test_hostile.py. Admin
permissions and CSRF: test_admin.py."""

from __future__ import annotations

import ast
import json
import math
from datetime import UTC, datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import pytest
from django.test import override_settings
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from django_pgjobs import exceptions, labels
from django_pgjobs.models import Job
from django_pgjobs.options import CONFLICT_MODES, KEY_MAX_BYTES, MAX_DURATION_S
from django_pgjobs.payloads import PAYLOAD_INT_MAX_DIGITS, PAYLOAD_MAX_DEPTH
from tests.helpers import count, execute, row, scalar
from tests.unit.test_validation import same_json

PACKAGE = Path(__file__).resolve().parent.parent.parent / "django_pgjobs"
PAYLOAD_LIMIT = 4096
INT32_MAX = 2**31 - 1

# -- strategies -----------------------------------------------------------------------

SQL_LOOKING = [
    "'; DROP TABLE pgjobs_job; --",
    "x') OR ('1'='1",
    '" OR ""="',
    "%(queue)s",
    "%s",
    "$1",
    "\\",
    "{}",
    "NULL",
    "pgjobs_job",
    "1; SELECT pg_sleep(10)",
    "E'\\x00'",
]
#: Every code point, lone surrogates included (hypothesis leaves them out by default).
any_text = st.text(alphabet=st.characters(exclude_categories=()), max_size=12)
odd_text = any_text | st.sampled_from(SQL_LOOKING)
scalars = (
    st.none()
    | st.booleans()
    | st.integers()
    | st.sampled_from([10**PAYLOAD_INT_MAX_DIGITS - 1, -(10**PAYLOAD_INT_MAX_DIGITS)])
    | st.floats()  # NaN and the infinities included
    | odd_text
)
values = st.recursive(
    scalars,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(odd_text, inner, max_size=3),
    max_leaves=25,
)


def nested(depth: int) -> dict[str, Any]:
    """A payload whose innermost object sits `depth` levels below the top."""
    node: dict[str, Any] = {}
    for _ in range(depth):
        node = {"n": node}
    return node


payloads = (
    st.none()
    | st.dictionaries(odd_text, values, max_size=4)
    | st.integers(PAYLOAD_MAX_DEPTH - 2, PAYLOAD_MAX_DEPTH + 2).map(nested)
    | st.integers(PAYLOAD_LIMIT - 16, PAYLOAD_LIMIT - 8).map(lambda n: {"blob": "x" * n})
    | st.sampled_from([[1, 2], "text", 3, 1.5, True])
)
durations = (
    st.floats(min_value=-10, max_value=2 * MAX_DURATION_S)
    | st.sampled_from([0, 0.2, 1, float("nan"), float("inf"), INT32_MAX + 0.5, "60", True])
    | st.integers(-5, 10**6).map(lambda s: timedelta(seconds=s))
)
moments = (
    st.datetimes(timezones=st.just(UTC), min_value=datetime(1900, 1, 1))
    | st.datetimes(
        timezones=st.sampled_from([timezone(timedelta(hours=14)), timezone(-timedelta(hours=12))]),
        min_value=datetime(1900, 1, 1),
    )
    | st.datetimes(min_value=datetime(1900, 1, 1))  # naive: refused
    | st.sampled_from(["2030-01-01", 0])
)
options = st.fixed_dictionaries(
    {},
    optional={
        "queue": st.sampled_from(["default", "slow", "a:b-c.d_e", "pgjobs.x", ""]) | odd_text,
        "key": st.none() | odd_text | st.text(min_size=1020, max_size=1030),
        "on_conflict": st.sampled_from([*CONFLICT_MODES, "merge", None, ""]),
        "priority": st.integers(-150, 150) | st.sampled_from([1.5, True, "1"]),
        "run_after": moments,
        "delay": st.none() | durations,
        "max_attempts": st.integers(-3, INT32_MAX + 3) | st.sampled_from([1, 2, 1.0, "3", False]),
        "lease": durations,
        "expires": st.none() | durations,
        "result_retention": st.none() | durations,
    },
)

# -- the oracle: what S4 says about a set of arguments -----------------------------------


def _text_ok(text: str) -> bool:
    try:
        text.encode()
    except UnicodeEncodeError:
        return False
    return "\x00" not in text


def _depth(value: Any, level: int = 0) -> int:
    if isinstance(value, dict):
        return max([_depth(v, level + 1) for v in value.values()], default=level)
    if isinstance(value, list):
        return max([_depth(v, level + 1) for v in value], default=level)
    return level


def _storable(value: Any) -> bool:
    if isinstance(value, bool) or value is None:
        return True
    if isinstance(value, int):
        return bool(abs(value) < 10**PAYLOAD_INT_MAX_DIGITS)
    if isinstance(value, float):
        return math.isfinite(value)
    if isinstance(value, str):
        return _text_ok(value)
    if isinstance(value, list):
        return all(_storable(item) for item in value)
    if isinstance(value, dict):
        return all(_text_ok(k) and _storable(v) for k, v in value.items())
    return False


def _payload_ok(payload: Any) -> bool:
    if payload is None:
        return True
    if not isinstance(payload, dict) or not _storable(payload):
        return False
    if _depth(payload) > PAYLOAD_MAX_DEPTH:
        return False
    text = json.dumps(payload, ensure_ascii=False, separators=(",", ":"))
    return len(text.encode()) <= PAYLOAD_LIMIT


def _seconds(value: Any) -> float | None:
    """A duration argument in seconds, or None if it is not one."""
    if isinstance(value, timedelta):
        return value.total_seconds()
    if isinstance(value, int | float) and not isinstance(value, bool):
        seconds = float(value)
        if math.isfinite(seconds) and abs(seconds) <= MAX_DURATION_S:
            return seconds
    return None


def _whole(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def expected_errors(arguments: dict[str, Any]) -> set[type[Exception]]:
    problems: set[type[Exception]] = set()
    queue = arguments.get("queue", "default")
    if (
        not isinstance(queue, str)
        or not queue
        or len(queue) > 100
        or not all(c.isascii() and (c.isalnum() or c in "_.:-") for c in queue)
        or queue.startswith("pgjobs.")
    ):
        problems.add(exceptions.InvalidQueueName)
    key = arguments.get("key")
    if key is not None and (not key or not _text_ok(key) or len(key.encode()) > KEY_MAX_BYTES):
        problems.add(exceptions.InvalidKey)
    if arguments.get("on_conflict", "replace") not in CONFLICT_MODES:
        problems.add(exceptions.InvalidConflictMode)
    if not _payload_ok(arguments.get("payload")):
        problems.add(exceptions.InvalidPayload)
    priority = arguments.get("priority", 0)
    if not _whole(priority) or not -100 <= priority <= 100:
        problems.add(exceptions.InvalidPriority)
    run_after = arguments.get("run_after")
    if run_after is not None and (not isinstance(run_after, datetime) or run_after.tzinfo is None):
        problems.add(exceptions.InvalidSchedule)
    if "delay" in arguments and arguments["delay"] is not None:
        delay = _seconds(arguments["delay"])
        if delay is None or delay < 0:
            problems.add(exceptions.InvalidSchedule)
    max_attempts = arguments.get("max_attempts", 1)
    if not _whole(max_attempts) or not 1 <= max_attempts <= INT32_MAX:
        problems.add(exceptions.InvalidMaxAttempts)
    if "lease" in arguments:
        lease = _seconds(arguments["lease"])
        if lease is None or lease <= 0 or math.ceil(lease) > INT32_MAX:
            problems.add(exceptions.InvalidLease)
    if arguments.get("expires") is not None:
        expires = _seconds(arguments["expires"])
        if expires is None or expires <= 0:
            problems.add(exceptions.InvalidExpiry)
    if arguments.get("result_retention") is not None:
        retention = _seconds(arguments["result_retention"])
        if retention is None or retention < 0 or math.ceil(retention) > INT32_MAX:
            problems.add(exceptions.InvalidResultRetention)
    return problems


def check_row(job_id: int, arguments: dict[str, Any]) -> None:
    """The row an accepted enqueue wrote is the one the arguments describe."""
    stored = row(
        job_id,
        "queue",
        "key",
        "payload",
        "priority",
        "max_attempts",
        "lease_s",
        "state",
        "attempts",
        "result_ttl_s",
    )
    assert stored is not None
    queue, key, payload, priority, max_attempts, lease_s, state, attempts, ttl = stored
    assert (queue, key) == (arguments.get("queue", "default"), arguments.get("key"))
    assert same_json(payload, arguments.get("payload") or {})
    assert (state, attempts) == ("pending", 0)
    if "priority" in arguments:
        assert priority == arguments["priority"]
    if "max_attempts" in arguments:
        assert max_attempts == arguments["max_attempts"]
    if "lease" in arguments:
        assert lease_s == math.ceil(_seconds(arguments["lease"]) or 0)
    if arguments.get("result_retention") is not None:
        assert ttl == (math.ceil(_seconds(arguments["result_retention"]) or 0) or None)
    delay = arguments.get("delay")
    if delay is not None:
        offset = scalar(
            "SELECT extract(epoch FROM run_after - created_at) FROM pgjobs_job WHERE id = %s",
            [job_id],
        )
        assert abs(float(offset) - (_seconds(delay) or 0)) < 1
    elif arguments.get("run_after") is not None:
        assert row(job_id, "run_after") == (arguments["run_after"],)
    if arguments.get("expires") is not None:
        lifetime = scalar(
            "SELECT extract(epoch FROM expires_at - created_at) FROM pgjobs_job WHERE id = %s",
            [job_id],
        )
        assert abs(float(lifetime) - (_seconds(arguments["expires"]) or 0)) < 1


# -- the properties ---------------------------------------------------------------------

HYPOTHESIS = settings(
    max_examples=300,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)


@pytest.mark.django_db
@override_settings(PGJOBS={"MAX_PAYLOAD_BYTES": PAYLOAD_LIMIT})
@HYPOTHESIS
@given(payload=payloads, arguments=options)
def test_s4_property_any_enqueue_raises_the_documented_error_or_writes_the_documented_row(
    payload: Any, arguments: dict[str, Any]
) -> None:
    arguments = {**arguments, "payload": payload}
    expected = expected_errors(arguments)
    execute("DELETE FROM pgjobs_job")
    if expected:
        with pytest.raises(tuple(expected)):
            Job.objects.enqueue("demo.hostile", **arguments)
        assert count() == 0
        return
    job_id = Job.objects.enqueue("demo.hostile", **arguments).id
    check_row(job_id, arguments)


@pytest.mark.django_db
@override_settings(PGJOBS={"MAX_PAYLOAD_BYTES": PAYLOAD_LIMIT})
@HYPOTHESIS
@given(payload=payloads, arguments=options, position=st.integers(0, 2))
def test_s4_property_enqueue_many_writes_all_or_nothing(
    payload: Any, arguments: dict[str, Any], position: int
) -> None:
    arguments = {**arguments, "payload": payload}
    on_conflict = arguments.pop("on_conflict", "replace")
    job = {"kind": "demo.hostile", **arguments}
    batch = [{"kind": "demo.fine", "payload": {"n": n}} for n in range(2)]
    batch.insert(position, job)
    expected = expected_errors({**arguments, "on_conflict": on_conflict})
    execute("DELETE FROM pgjobs_job")
    if expected:
        with pytest.raises(tuple(expected)):
            Job.objects.enqueue_many(batch, on_conflict=on_conflict)
        assert count() == 0
        return
    results = Job.objects.enqueue_many(batch, on_conflict=on_conflict)
    assert count() == 3 and all(result.inserted for result in results)
    check_row(results[position].id, arguments)


@pytest.mark.django_db
@pytest.mark.parametrize("text", SQL_LOOKING)
def test_sql_looking_text_is_stored_verbatim_everywhere_a_user_can_put_text(text: str) -> None:
    job_id = Job.objects.enqueue("demo.sql_looking", {text: text}, key=text).id
    assert row(job_id, "payload", "key") == ({text: text}, text)
    (handle,) = Job.objects.claim_batch("default", 1, text)
    assert handle.retry(text, delay=0)
    assert row(job_id, "last_error", "worker_id") == (text, text)
    assert count() == 1 and scalar("SELECT count(*) FROM pg_tables WHERE tablename = 'pgjobs_job'")


# -- what a crafted row can never reach -------------------------------------------------


def _sources() -> list[tuple[Path, ast.Module]]:
    return [(path, ast.parse(path.read_text())) for path in sorted(PACKAGE.rglob("*.py"))]


def test_no_pickle_eval_or_exec_anywhere_in_the_package() -> None:
    banned_modules = {"pickle", "cPickle", "dill", "marshal", "shelve", "cloudpickle"}
    for path, tree in _sources():
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                names = {alias.name.split(".")[0] for alias in node.names}
            elif isinstance(node, ast.ImportFrom):
                names = {(node.module or "").split(".")[0]}
            else:
                names = set()
            assert not names & banned_modules, f"{path} imports {names}"
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Name):
                assert node.func.id not in {"eval", "exec", "__import__"}, (
                    f"{path}:{node.lineno} calls {node.func.id}"
                )


def test_handlers_resolve_only_from_the_registry() -> None:
    """Nothing imports a module by a name it computed, except runjobs --import and the
    app's ready() (PGJOBS["JOB_MODULES"]), which take their names from the operator's
    command line and the project's settings, never from a row."""
    allowed = {"management/commands/runjobs.py", "apps.py"}
    for path, tree in _sources():
        for node in ast.walk(tree):
            if not isinstance(node, ast.Call):
                continue
            name = ast.unparse(node.func)
            if name in {"importlib.import_module", "import_module", "import_string"}:
                relative = path.relative_to(PACKAGE).as_posix()
                assert relative in allowed, f"{relative}:{node.lineno} calls {name}"


#: Calls that send a statement to PostgreSQL, and which argument holds the statement.
_EXECUTING = {"fetchall": 0, "rowcount": 0, "executed": 0, "estimate": 0, "execute": 0}


def _is_constant_sql(node: ast.expr) -> bool:
    """`sql.NAME`, `sql.builder(...)`, or psycopg's `SQL(sql.NAME).format(Identifier(...))`."""
    if isinstance(node, ast.Attribute) and ast.unparse(node.value) == "sql":
        return node.attr.isupper()
    if isinstance(node, ast.Call):
        function = ast.unparse(node.func)
        if function.startswith("sql.") and function[4:].islower():
            return True
        if function.endswith(".format") and isinstance(node.func, ast.Attribute):
            inner = node.func.value
            return (
                isinstance(inner, ast.Call)
                and ast.unparse(inner.func) == "pgsql.SQL"
                and all(_is_constant_sql(arg) for arg in inner.args)
                and all(ast.unparse(k.value).startswith("pgsql.Identifier") for k in node.keywords)
            )
    if isinstance(node, ast.IfExp):
        return _is_constant_sql(node.body) and _is_constant_sql(node.orelse)
    return False


def _values_of_names(function: ast.FunctionDef) -> dict[str, list[ast.expr]]:
    """What each local name of `function` may hold: the values assigned to it, and the
    elements of what a loop over a tuple (or a zip of tuples) binds it to."""
    values: dict[str, list[ast.expr]] = {}
    for node in ast.walk(function):
        if isinstance(node, ast.Assign):
            for target in node.targets:
                if isinstance(target, ast.Name):
                    values.setdefault(target.id, []).append(node.value)
                elif (  # `query, names = positional(statement)`: the statement, renumbered
                    isinstance(target, ast.Tuple)
                    and isinstance(target.elts[0], ast.Name)
                    and isinstance(node.value, ast.Call)
                    and ast.unparse(node.value.func) == "positional"
                ):
                    values.setdefault(target.elts[0].id, []).append(node.value.args[0])
    for node in ast.walk(function):
        if not isinstance(node, ast.For | ast.comprehension):
            continue
        iterable = node.iter
        zipped = isinstance(iterable, ast.Call) and ast.unparse(iterable.func) == "zip"
        sequences = list(iterable.args) if isinstance(iterable, ast.Call) and zipped else [iterable]
        target = node.target
        targets = target.elts if zipped and isinstance(target, ast.Tuple) else [target]
        for name, sequence in zip(targets, sequences, strict=False):
            if not isinstance(name, ast.Name):
                continue
            held = values.get(sequence.id, []) if isinstance(sequence, ast.Name) else [sequence]
            for value in held:
                elements = value.elts if isinstance(value, ast.Tuple | ast.List) else [value]
                values.setdefault(name.id, []).extend(elements)
    return values


def test_every_statement_the_package_runs_is_a_constant_of_sql_py() -> None:
    """Values travel as parameters: no statement is built from a value at run time."""
    for path, tree in _sources():
        functions = [n for n in ast.walk(tree) if isinstance(n, ast.FunctionDef)]
        for function in functions:
            if (path.name, function.name) == ("connection.py", "explained_as_worker"):
                # EXPLAIN EXECUTE takes no bound parameters: the one statement whose values
                # psycopg quotes into its text (sql.Literal), an operator's diagnostic.
                continue
            assigned = _values_of_names(function)
            parameters = {arg.arg for arg in function.args.args}
            for node in ast.walk(function):
                if not isinstance(node, ast.Call) or not node.args:
                    continue
                name = node.func.attr if isinstance(node.func, ast.Attribute) else ""
                name = name or (node.func.id if isinstance(node.func, ast.Name) else "")
                if name not in _EXECUTING or path.name == "localdb.py":
                    continue
                statement = node.args[_EXECUTING[name]]
                where = f"{path.name}:{node.lineno}: {ast.unparse(statement)}"
                assert _resolves_to_constant(statement, assigned, parameters), where


def _resolves_to_constant(
    value: ast.expr, assigned: dict[str, list[ast.expr]], parameters: set[str], depth: int = 0
) -> bool:
    """Whether `value` is constant SQL, or a name that holds only constant SQL, or a
    helper's `statement` parameter (its callers are checked in turn)."""
    if _is_constant_sql(value):
        return True
    if not isinstance(value, ast.Name) or depth > 3:
        return False
    if value.id in assigned:
        held = assigned[value.id]
        return all(_resolves_to_constant(v, assigned, parameters, depth + 1) for v in held)
    return value.id == "statement" and "statement" in parameters


def test_helpers_taking_a_statement_are_only_given_constants() -> None:
    for path, tree in _sources():
        exempt = [  # the lines of explained_as_worker (see the test above)
            range(node.lineno, (node.end_lineno or node.lineno) + 1)
            for node in ast.walk(tree)
            if isinstance(node, ast.FunctionDef)
            and (path.name, node.name) == ("connection.py", "explained_as_worker")
        ]
        takers = {
            node.name
            for node in ast.walk(tree)
            if isinstance(node, ast.FunctionDef)
            and any(arg.arg == "statement" for arg in node.args.args)
        }
        for node in ast.walk(tree):
            if not isinstance(node, ast.Call):
                continue
            name = ast.unparse(node.func).removeprefix("self.")
            if name not in takers or any(node.lineno in lines for lines in exempt):
                continue
            argument = node.args[0]
            if isinstance(argument, ast.Name):
                continue  # a local or a parameter: checked by the test above
            assert _is_constant_sql(argument), f"{path.name}:{node.lineno}"


@settings(max_examples=200, deadline=None)
@given(
    report=values
    | st.fixed_dictionaries(
        {},
        optional={
            "fraction": values,
            "message": values,
            "data": values,
            "at": odd_text
            | st.datetimes().map(datetime.isoformat)
            | st.datetimes(timezones=st.just(UTC)).map(datetime.isoformat),
        },
    ),
    now=st.none() | st.datetimes(timezones=st.just(UTC)),
)
def test_a_progress_report_of_any_json_reads_as_a_line_never_an_error(
    report: Any, now: datetime | None
) -> None:
    """A row edited by hand may hold any JSON as progress: jobsctl shows what it can."""
    line = labels.progress(report, now)
    assert isinstance(line, str) and line and "\n" not in line
    assert len(line) <= 100
