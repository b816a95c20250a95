"""The only code that sends statements to PostgreSQL.

Statements run on Django's connection of an alias, so that they join the caller's
transaction (S1); their errors come out as Django's database exceptions, and they are
logged where Django logs queries. The cursor binds parameters on the server, so that
large arrays travel as data, and a worker's tuned connection prepares each statement
once (`tune_worker_connection`).
"""

from __future__ import annotations

import functools
import json
import re
import time
from collections.abc import Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager, suppress
from contextvars import ContextVar
from datetime import datetime
from typing import Any

import psycopg
from django.db import DatabaseError, ProgrammingError, connections, transaction
from psycopg import pq
from psycopg import sql as pgsql

from django_pgjobs import tracing
from django_pgjobs.conf import pgjobs_settings
from django_pgjobs.db import sql
from django_pgjobs.exceptions import JobTablesMissing

#: The database a request of the console reads and acts on where a call names none (its
#: database selector, with PGJOBS["QUEUE_DATABASES"]); unset: PGJOBS["DATABASE"].
_console_database: ContextVar[str | None] = ContextVar("pgjobs_console_database", default=None)


@contextmanager
def console_database(database: str | None) -> Iterator[None]:
    """Within it, calls that name no database act on `database` (None: the jobs
    database): the console's views run in it, for the database their URL chose."""
    token = _console_database.set(database)
    try:
        yield
    finally:
        _console_database.reset(token)


def default_alias() -> str:
    """The database of a call that names none: the console's, else PGJOBS["DATABASE"]."""
    return _console_database.get() or pgjobs_settings.DATABASE


def alias(using: str | None) -> str:
    """The database alias of a call: `using`, else the console's (in one of its views),
    else PGJOBS["DATABASE"]."""
    return using or default_alias()


def fetchall(statement: str, params: Mapping[str, Any], using: str | None) -> list[Any]:
    """Run `statement` and return its rows ([] when it returns none)."""
    with executed(statement, params, using) as cursor:
        return cursor.fetchall() if _has_rows(cursor) else []


def fetch_named(
    statement: str, params: Mapping[str, Any], using: str | None
) -> list[dict[str, Any]]:
    """Run `statement` and return its rows as mappings of column name to value."""
    with executed(statement, params, using) as cursor:
        if not cursor.description:
            return []
        names = [column.name for column in cursor.description]
        return [dict(zip(names, row, strict=True)) for row in cursor.fetchall()]


def _has_rows(cursor: psycopg.RawCursor[Any]) -> bool:
    """Whether the statement returned rows (none, for a DELETE without RETURNING): read
    from its result's status, where `description` would describe every column first."""
    result = cursor.pgresult
    return result is not None and result.status == pq.ExecStatus.TUPLES_OK


def rowcount(statement: str, params: Mapping[str, Any], using: str | None) -> int:
    """Run `statement` and return how many rows it changed."""
    with executed(statement, params, using) as cursor:
        return int(cursor.rowcount)


def utility(statement: str, using: str | None) -> None:
    """Run a utility statement (VACUUM), which cannot be prepared nor run inside a
    transaction: on a connection in autocommit, never prepared."""
    connection = usable_connection(using)
    if not connection.get_autocommit() or connection.in_atomic_block:
        raise RuntimeError("VACUUM runs outside any transaction: call it outside atomic().")
    with executed(statement, {}, using, prepare=False):
        pass


def estimate(statement: str, params: Mapping[str, Any], using: str | None) -> int:
    """The planner's estimate of the rows of an `EXPLAIN (FORMAT JSON)` statement."""
    ((plan,),) = fetchall(statement, params, using)
    document = json.loads(plan) if isinstance(plan, str) else plan
    return int(document[0]["Plan"]["Plan Rows"])


def planned_rows(queryset: Any) -> int:
    """The planner's estimate of a queryset's rows (its EXPLAIN), for counts too big to
    count."""
    plan = json.loads(queryset.explain(format="json"))
    return int(plan[0]["Plan"]["Plan Rows"])


def clock(using: str | None) -> datetime:
    """The database's time at this instant (S22): not at the start of the transaction."""
    [(now,)] = fetchall(sql.DATABASE_CLOCK, {}, using)
    return now  # type: ignore[no-any-return]


def role_privileges(using: str | None) -> tuple[str, bool, bool, bool]:
    """(role name, superuser, may create roles, may create databases) of the current
    role on the alias."""
    [(name, superuser, create_role, create_db)] = fetchall(sql.ROLE_PRIVILEGES, {}, using)
    return str(name), bool(superuser), bool(create_role), bool(create_db)


def applied_migrations(using: str | None, app: str, timeout: int) -> set[str] | None:
    """The migrations of `app` applied on the alias's database, read on a connection of
    its own that waits at most `timeout` whole seconds to connect (a system check must
    not hang a command where the database is out of reach); None when it cannot be
    reached, an empty set before the first migrate."""
    try:
        given = connections[alias(using)].get_connection_params()
        params = {key: value for key, value in given.items() if isinstance(value, str | int)}
        params.pop("prepare_threshold", None)
        params["connect_timeout"] = timeout  # the project's own (OPTIONS) is for its work
        with psycopg.connect(psycopg.conninfo.make_conninfo("", **params)) as raw:
            raw.execute(sql.LIMIT_STATEMENT_TIME, {"timeout": f"{timeout}s"})
            rows = raw.execute(sql.APPLIED_MIGRATIONS, {"app": app}).fetchall()
    except psycopg.errors.UndefinedTable:
        return set()
    except Exception:  # out of reach, or settings it cannot read: a check never raises
        return None
    return {str(name) for (name,) in rows}


def in_transaction(using: str | None) -> bool:
    """Whether the caller is inside `transaction.atomic()` on the alias."""
    return bool(connections[alias(using)].in_atomic_block)


def in_transaction_elsewhere(using: str | None) -> bool:
    """Whether the caller is inside `transaction.atomic()` on a database other than the
    alias (of the connections this thread opened)."""
    name = alias(using)
    return any(
        connection.in_atomic_block
        for connection in connections.all(initialized_only=True)
        if connection.alias != name
    )


def commit_mode(using: str | None) -> dict[str, Any]:
    """The commit mode of a claim or completion statement (its `synchronous_commit`).

    Outside a transaction, a claim, heartbeat or completion is a transaction of its own,
    and with ASYNC_BOOKKEEPING it commits without waiting for the WAL flush: a database
    crash can lose the last moments of them, and those jobs then run again, exactly as
    after a worker crash. Inside the caller's transaction (a fence, transaction mode) the
    caller's commit decides, and nothing is changed.
    """
    asynchronous = pgjobs_settings.ASYNC_BOOKKEEPING and not in_transaction(using)
    return {"synchronous_commit": "off" if asynchronous else None}


def wake_params() -> dict[str, Any]:
    """The parameters of a statement that may wake workers (S23)."""
    return {"channel": pgjobs_settings.CHANNEL, "notify": pgjobs_settings.NOTIFY}


def enqueue_params() -> dict[str, Any]:
    """The parameters of a statement that writes jobs: it may wake workers (S23), and
    its jobs keep the trace context of the enqueue (%(trace)s, None outside a trace)."""
    return {**wake_params(), "trace": tracing.stored_context()}


class _RollBack(Exception):
    """Leave an `atomic` block by rolling it back."""


def rolled_back(statement: str, params: Mapping[str, Any], using: str | None) -> None:
    """Run `statement` in a savepoint (a transaction outside one) rolled back at once:
    for a statement that waits for a lock, which it then lets go of."""
    try:
        with atomic(using):
            fetchall(statement, params, using)
            raise _RollBack
    except _RollBack:
        pass


#: The name of the statement `explained_as_worker` prepares, and a parameter's mark.
_EXPLAINED = "pgjobs_explained"
_PLACEHOLDER = re.compile(r"%\((\w+)\)s|%%")


@functools.lru_cache(maxsize=1024)
def positional(statement: str) -> tuple[str, tuple[str, ...]]:
    """`statement` with PostgreSQL's own placeholders ($1, $2, ...) for its `%(name)s`
    ones (one number per name, however often it comes) and `%` for its `%%`, and the
    names in their numbers' order. Made once per statement, for psycopg's RawCursor: its
    own parse of a named statement is cached only under 4 KB, and a claim's is 9 KB
    (0.2 ms of every claim, in a chain's every link)."""
    names: dict[str, int] = {}

    def number(match: re.Match[str]) -> str:
        name = match.group(1)
        if name is None:
            return "%"
        return f"${names.setdefault(name, len(names) + 1)}"

    return _PLACEHOLDER.sub(number, statement), tuple(names)


def explained_as_worker(statement: str, params: Mapping[str, Any], using: str | None) -> str:
    """The text of EXPLAIN (ANALYZE, BUFFERS, TIMING OFF) of `statement` run as a
    worker's tuned connection runs it: prepared under the worker's plan settings, so with
    a generic plan (made now, before its parameters are known, as a worker's is made when
    it first sends the statement), in a transaction rolled back at once (what it wrote,
    and the row locks it took, are let go). For what a claim costs now
    (JobManager.claim_cost).

    The one statement of the package with values written into its text: EXECUTE takes
    no bound parameters, so each is quoted by psycopg (`sql.Literal`)."""
    statement, names = positional(statement)
    raw = usable_connection(using).connection
    values = pgsql.SQL(", ").join(pgsql.Literal(params[name]) for name in names)
    execute = pgsql.SQL("EXPLAIN (ANALYZE, BUFFERS, TIMING OFF) EXECUTE {}({})").format(
        pgsql.Identifier(_EXPLAINED), values
    )
    plan: list[str] = []
    prepared = False
    try:
        with atomic(using):
            fetchall(sql.TUNE_WORKER_TRANSACTION, {}, using)
            prepare = f"PREPARE {_EXPLAINED} AS {statement}".replace("%", "%%")
            with executed(prepare, {}, using, prepare=False):
                prepared = True
            run = execute.as_string(raw).replace("%", "%%")
            with executed(run, {}, using, prepare=False) as cursor:
                plan = [row[0] for row in cursor.fetchall()]
            raise _RollBack
    except _RollBack:
        pass
    finally:
        # A prepared statement outlives the transaction that made it, rolled back or not
        # (and a broken connection takes it with it).
        if prepared:
            with (
                suppress(DatabaseError),
                executed(f"DEALLOCATE {_EXPLAINED}", {}, using, prepare=False),
            ):
                pass
    return "\n".join(plan)


def plan_cost(plan: str) -> tuple[float, int]:
    """The execution time (ms) and the shared buffers read (hit or read) of an EXPLAIN
    (ANALYZE, BUFFERS) text, by its top node, whose buffers are the whole statement's (0
    for what it lacks)."""
    executed = re.search(r"Execution Time: ([\d.]+) ms", plan)
    top = re.search(r"^\s*Buffers: shared ([^\n]*)", plan, re.MULTILINE)
    shared = top.group(1).split(",")[0] if top else ""  # before any ", temp ..."
    buffers = sum(int(n) for n in re.findall(r"\b(?:hit|read)=(\d+)", shared))
    return (float(executed.group(1)) if executed else 0.0), buffers


@contextmanager
def atomic(using: str | None) -> Iterator[None]:
    """A transaction (a savepoint inside the caller's) on the alias."""
    with transaction.atomic(using=alias(using)):
        yield


def write_documents(documents: Iterable[Mapping[str, Any]], using: str | None) -> list[list[Any]]:
    """Run ENQUEUE_JOBS for each document of enqueue_many (ENQUEUE_KEYLESS_JOBS for one
    whose jobs have no key, its "keyed" false) and return each run's rows.

    psycopg's pipeline mode sends each run as soon as its document is made, without
    waiting for the one before: the server writes while the caller validates the next.
    The runs join the caller's transaction; an exception from `documents` ends the
    pipeline and comes out (the caller rolls back what was sent).
    """
    connection = usable_connection(using)
    raw = connection.connection
    prepare = prepares(connection)
    started = time.monotonic()
    cursors: list[psycopg.RawCursor[Any]] = []
    sent: list[str] = []
    try:
        with schema_explained(), connection.wrap_database_errors, raw.pipeline():
            for params in documents:
                statement = sql.ENQUEUE_JOBS if params["keyed"] else sql.ENQUEUE_KEYLESS_JOBS
                query, names = positional(statement)
                cursor = psycopg.RawCursor(raw)
                cursors.append(cursor)
                sent.append(statement)
                cursor.execute(query, [params[name] for name in names], prepare=prepare)
        with schema_explained(), connection.wrap_database_errors:
            return [cursor.fetchall() for cursor in cursors]
    finally:
        for cursor in cursors:
            cursor.close()
        if connection.queries_logged:
            log_queries(connection, sent, started)


@contextmanager
def executed(
    statement: str, params: Mapping[str, Any], using: str | None, *, prepare: bool | None = None
) -> Iterator[psycopg.RawCursor[Any]]:
    """Run one statement on Django's connection (so it joins the caller's transaction)
    and yield its cursor; prepared as `prepares` says, unless `prepare` says otherwise.
    Its `%(name)s` placeholders are given as PostgreSQL's own (`positional`)."""
    connection = usable_connection(using)
    logged = connection.queries_logged
    started = time.monotonic() if logged else 0.0
    query, names = positional(statement)
    with (
        schema_explained(),
        connection.wrap_database_errors,
        psycopg.RawCursor(connection.connection) as cursor,
    ):
        cursor.execute(
            query,
            [params[name] for name in names],
            prepare=prepares(connection) if prepare is None else prepare,
        )
        yield cursor
    if logged:
        log_queries(connection, [statement], started)


#: What the server says of a table, column or function of the app that it lacks.
_UNDEFINED = (
    psycopg.errors.UndefinedTable,
    psycopg.errors.UndefinedColumn,
    psycopg.errors.UndefinedFunction,
)


@contextmanager
def schema_explained() -> Iterator[None]:
    """Turn the server's "relation pgjobs_job does not exist" (a table, column or
    function of the app that it lacks) into JobTablesMissing, which says what to run."""
    try:
        yield
    except ProgrammingError as error:
        cause = error.__cause__
        if not isinstance(cause, _UNDEFINED) or "pgjobs_" not in str(cause):
            raise
        said = str(cause).strip().splitlines()[0]
        raise JobTablesMissing(
            f"The job tables of this database do not match this version of django_pgjobs "
            f"({said}): the app's migrations are not applied. Run: python manage.py "
            "migrate django_pgjobs"
        ) from error


def backend_pid(using: str | None) -> int | None:
    """The server process of this thread's connection of `using` (None: not connected).
    No round trip: libpq keeps it from the connection's start."""
    raw = connections[alias(using)].connection
    return None if raw is None or raw.closed else int(raw.info.backend_pid)


def usable_connection(using: str | None) -> Any:
    """Django's connection of `using`, connected, and not in a transaction an error broke."""
    connection = connections[alias(using)]
    connection.ensure_connection()
    connection.validate_no_broken_transaction()
    return connection


def log_queries(connection: Any, statements: Sequence[str], started: float) -> None:
    """Log statements where Django logs queries, each with its share of the time since
    `started` (time.monotonic())."""
    elapsed = f"{(time.monotonic() - started) / max(len(statements), 1):.3f}"
    connection.queries_log.extend({"sql": text.strip(), "time": elapsed} for text in statements)


def prepares(connection: Any) -> bool:
    """Whether to prepare the queue's statements on this connection.

    Preparing saves the parse of every later execution, which on a small statement costs
    more than running it. It pays only on a connection that lives on: a worker's, or one
    of Django's persistent or pooled connections (CONN_MAX_AGE, OPTIONS["pool"]); a
    connection opened for one request would pay a round trip more instead. Only our
    statements are prepared: a connection Django left without prepared statements gets a
    threshold no other statement reaches.
    """
    if not pgjobs_settings.PREPARE:
        return False
    raw = connection.connection
    if getattr(raw, "_pgjobs_tuned", False):
        return True
    settings_dict = connection.settings_dict
    if not settings_dict.get("CONN_MAX_AGE") and not settings_dict["OPTIONS"].get("pool"):
        return False
    if raw.prepare_threshold is None:
        raw.prepare_threshold = 2**31 - 1
    return True


def tune_worker_connection(using: str | None) -> None:
    """Make the current thread's connection a worker's bookkeeping connection.

    With PGJOBS["PREPARE"], its statements are prepared on first use and planned once
    (TUNE_WORKER_SESSION), which removes most of the cost of a small claim or ack.
    Session settings and prepared statements need a connection of one's own: switch
    PREPARE off behind a transaction-mode pooler. Cheap to call on every loop: a
    connection is tuned once, and again after a reconnect.
    """
    if not pgjobs_settings.PREPARE:
        return
    connection = connections[alias(using)]
    connection.ensure_connection()
    raw = connection.connection
    if getattr(raw, "_pgjobs_tuned", False):
        return
    fetchall(sql.TUNE_WORKER_SESSION, {}, using)
    raw.prepare_threshold = 0
    raw.prepared_max = max(raw.prepared_max or 0, 512)
    raw._pgjobs_tuned = True


def close(using: str | None) -> None:
    """Close the alias' connection of this thread (the next call reconnects)."""
    connections[alias(using)].close()


def close_all() -> None:
    """Close every connection of this thread (a thread that ends)."""
    connections.close_all()


def array_of_ids(job_ids: Iterable[int]) -> str:
    """Job ids as an array literal (`{1,2}`); each must be a whole number.

    Numbers and UUIDs need no quoting, and a literal is parsed by the server in C, where
    psycopg would adapt a list element by element in Python: on the worker's hot path that
    adaptation cost more than the statements' own work.
    """
    return "{" + ",".join([str(int(job_id)) for job_id in job_ids]) + "}"


def array_of_claims(handles: Sequence[Any]) -> dict[str, str]:
    """The ids and tokens of claims as array literals: `{1,2}` and `{uuid,uuid}`."""
    return {
        "ids": "{" + ",".join([str(handle.id) for handle in handles]) + "}",
        "tokens": "{" + ",".join([str(handle.token) for handle in handles]) + "}",
    }


def array_of_nulls(count: int) -> str:
    """An array literal of `count` NULLs, for results that are all None."""
    return "{" + ",".join(["NULL"] * count) + "}"


def reset_after_job() -> None:
    """Ready this thread's connections for the next job, as Django does between requests,
    but keep a healthy connection open whatever CONN_MAX_AGE says: reconnecting for
    every job would cost more than most jobs. A connection left in a transaction, with
    autocommit off, or broken is closed."""
    for connection in connections.all(initialized_only=True):
        if connection.connection is None:
            continue
        if connection.in_atomic_block or connection.get_autocommit() is not True:
            connection.close()
        elif connection.errors_occurred:
            if connection.is_usable():
                connection.errors_occurred = False
            else:
                connection.close()


def json_value(value: Any) -> Any:
    """Decode a jsonb value once; Django's psycopg setup hands jsonb over as text."""
    return json.loads(value) if isinstance(value, str) else value
