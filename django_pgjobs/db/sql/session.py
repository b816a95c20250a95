"""Statements on a session rather than a table: the worker's tuning, the sweeper's
advisory lock, the clock, lock waits, and the chaos run's connection faults."""

from __future__ import annotations

#: The plan settings of a worker's connection (TUNE_WORKER_SESSION), and of a statement
#: explained as a worker runs it (TUNE_WORKER_TRANSACTION).
_WORKER_PLANS = (
    ("plan_cache_mode", "force_generic_plan"),
    ("jit", "off"),
    ("enable_sort", "off"),
    ("enable_incremental_sort", "off"),
)


def _set_config(settings: tuple[tuple[str, str], ...], *, local: bool) -> str:
    return ",\n       ".join(
        f"set_config('{name}', '{value}', {'true' if local else 'false'})"
        for name, value in settings
    )


TUNE_WORKER_SESSION = f"""
-- Plan each prepared statement once on this connection, never JIT-compile, plan without
-- sorts where an index gives the order, and wait at most 500 ms for a row lock: the
-- worker's own connection runs nothing but the queue's short, index-bound statements,
-- and an application transaction that holds a job's row (a child written after it) must
-- not stall the loop that heartbeats every other job (S39): that job's outcome waits.
-- Without sorts the claim's probes walk the claim index in its order whatever the
-- statistics say: on a table a burst just filled, with none, the planner otherwise took
-- the schedule index, read the whole backlog and sorted it, for every claim (218 ms
-- against 5 ms for 50,000 jobs).
SELECT {_set_config((*_WORKER_PLANS, ("lock_timeout", "500ms")), local=False)}
"""

TUNE_WORKER_TRANSACTION = f"""
-- TUNE_WORKER_SESSION's plan settings for this transaction only: a statement explained
-- as a worker runs it (a generic plan, no JIT, no sorts where an index gives the order).
SELECT {_set_config(_WORKER_PLANS, local=True)}
"""

SWEEP_LOCK = """
-- Take the sweeper's turn for this transaction, if no other replica has it.
SELECT pg_try_advisory_xact_lock(%(lock_id)s)
"""

LIMIT_LOCK_WAIT = """
-- Give up on any lock this transaction waits for longer than %(timeout)s (a duration
-- such as '2s'), instead of waiting for as long as its holder lives.
SELECT set_config('lock_timeout', %(timeout)s, true)
"""

PLAN_KEYED_CLAIM = """
-- For the rest of this transaction, plan without sorts (the keyed claim, S34): each of
-- its index walks then reads the keyed index in its order, whatever the statistics say
-- of a backlog that changes by the second, never another index and a sort. And never
-- JIT-compile: the sorts it cannot avoid (a few rows) count as disabled, a cost that
-- would otherwise cross jit_above_cost.
SELECT set_config('enable_sort', 'off', true), set_config('jit', 'off', true)
"""

LIMIT_STATEMENT_TIME = """
-- Cancel any statement of this transaction that runs longer than %(timeout)s (a duration
-- such as '1500ms'): a transaction-mode job's timeout (S33).
SELECT set_config('statement_timeout', %(timeout)s, true)
"""

CANCEL_STATEMENT = """
-- Cancel the statement backend %(pid)s runs now, if it still runs transaction %(xact)s (a
-- transaction-mode job past its timeout, S39; the id alone may name another connection by
-- now): one of this role's own connections, so no privilege beyond its own is needed.
SELECT pg_cancel_backend(a.pid)
FROM pg_stat_get_activity(%(pid)s) AS a
WHERE a.backend_xid::text = %(xact)s
"""

END_BACKEND = """
-- End backend %(pid)s if it still runs transaction %(xact)s, rolling it back and releasing
-- its locks: the transaction of a transaction-mode job whose handler ran on past its
-- timeout (S39).
SELECT pg_terminate_backend(a.pid)
FROM pg_stat_get_activity(%(pid)s) AS a
WHERE a.backend_xid::text = %(xact)s
"""

DATABASE_CLOCK = """
-- The database's clock at this instant, not at the start of the transaction (S22).
SELECT clock_timestamp()
"""

TERMINATE_BACKENDS = """
-- Drop up to %(limit)s connections of one application at once (manage.py chaosjobs), in
-- this database only: a run never reaches the clients of another database of the server.
SELECT count(*) FILTER (WHERE pg_terminate_backend(pid))
FROM (
    SELECT pid FROM pg_stat_activity
    WHERE application_name = %(application_name)s AND datname = current_database()
      AND pid <> pg_backend_pid()
    ORDER BY random()
    LIMIT %(limit)s
) AS chosen
"""

HOLD_XID = """
-- Give this transaction an XID and hold it (manage.py chaosjobs's pin, an idle session in
-- a transaction): the database's xmin horizon stays at it until the transaction ends.
SELECT pg_current_xact_id()::text
"""

READ_JOBS_IN_SNAPSHOT = """
-- Make this transaction a REPEATABLE READ reader of the job table (manage.py chaosjobs's
-- pin, a long report): its snapshot, taken by the count, holds the xmin horizon until
-- the transaction ends. The first statement of its transaction.
SET TRANSACTION ISOLATION LEVEL REPEATABLE READ
"""

COUNT_JOBS = """
-- Every row of the job table, read through one snapshot (a reader's scan).
SELECT count(*) FROM pgjobs_job
"""

ROLE_PRIVILEGES = """
-- What the current role may do beyond reading and writing rows: superuser, create
-- roles, create databases (a deploy check wants none of them for the jobs' role).
SELECT rolname, rolsuper, rolcreaterole, rolcreatedb
FROM pg_roles
WHERE rolname = current_user
"""

APPLIED_MIGRATIONS = """
-- The migrations of app %(app)s applied on this database (a system check compares them
-- with the app's files; the table is missing before the first migrate).
SELECT name FROM django_migrations WHERE app = %(app)s
"""
