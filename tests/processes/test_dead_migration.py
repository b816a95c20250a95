"""S44 on an existing install: migration 0018 partitions a dead-letter table that holds
letters while a writer goes on adding more, in a database of its own."""

from __future__ import annotations

import secrets
import threading
from collections.abc import Iterator

import psycopg
import pytest

from tests.helpers import other_connection
from tests.spawn import database_url_for_workers, manage_py, suite_env

pytestmark = pytest.mark.slow

LETTERS = 20_000

FILL = """
INSERT INTO pgjobs_dead (id, queue, kind, max_attempts, lease_s, reason, category, died_at,
                         has_parents)
SELECT g, 'q' || g %% 3, 'app.kind', 3, 60, 'failed', 'failed',
       now() - g * interval '1 minute', false
FROM generate_series(1, %s) AS g
"""

WRITE = """
INSERT INTO pgjobs_dead (id, queue, kind, max_attempts, lease_s, reason, category)
VALUES (%s, 'writer', 'app.kind', 3, 60, 'failed', 'failed')
"""


@pytest.fixture
def role() -> Iterator[str]:
    """A role of the application's, as docs/explanation/security.md makes one."""
    name = f"pgjobs_app_{secrets.token_hex(4)}"
    with other_connection() as owner:
        owner.execute(f'CREATE ROLE "{name}"')
    try:
        yield name
    finally:
        with other_connection() as owner:
            owner.execute(f'DROP ROLE IF EXISTS "{name}"')


@pytest.fixture
def database_at_0017(role: str) -> Iterator[str]:
    """A database migrated up to 0017 (the table as it was), removed afterwards."""
    name = f"pgjobs_0018_{secrets.token_hex(4)}"
    base = database_url_for_workers()
    url = base.rsplit("/", 1)[0] + "/" + name
    with other_connection() as owner:
        owner.execute(f'CREATE DATABASE "{name}"')
    try:
        manage_py({**suite_env(), "DATABASE_URL": url}, "migrate", "django_pgjobs", "0017", "-v0")
        yield url
    finally:
        with other_connection() as owner:
            owner.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def test_s44_migration_0018_partitions_a_table_of_letters_while_writers_go_on(
    database_at_0017: str, role: str
) -> None:
    url = database_at_0017
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(FILL, [LETTERS])
        conn.execute(f'GRANT SELECT, INSERT, UPDATE, DELETE ON pgjobs_dead TO "{role}"')
        (old_indexes,) = conn.execute(
            "SELECT count(*) FROM pg_index WHERE indrelid = 'pgjobs_dead'::regclass"
        ).fetchone() or (0,)

    stop = threading.Event()
    written: list[int] = []
    errors: list[BaseException] = []

    def write() -> None:
        with psycopg.connect(url, autocommit=True) as conn:
            letter = 10**9
            while not stop.is_set():
                letter += 1
                try:
                    conn.execute(WRITE, [letter])
                except psycopg.Error as error:  # the test fails on any
                    errors.append(error)
                    return
                written.append(letter)

    writer = threading.Thread(target=write)
    writer.start()
    try:
        manage_py({**suite_env(), "DATABASE_URL": url}, "migrate", "-v0")
        before_stop = len(written)
    finally:
        stop.set()
        writer.join(30)
    assert not errors, errors
    assert before_stop > 0  # the writer wrote through the migration

    with psycopg.connect(url, autocommit=True) as conn:

        def one(statement: str) -> object:
            row = conn.execute(statement).fetchone()
            assert row is not None
            return row[0]

        assert one("SELECT relkind FROM pg_class WHERE oid = 'pgjobs_dead'::regclass") == "p"
        # Every letter kept, the old ones and the writer's, each once.
        assert one("SELECT count(*) FROM pgjobs_dead") == LETTERS + len(written)
        assert one("SELECT count(DISTINCT id) FROM pgjobs_dead") == LETTERS + len(written)
        partitions: dict[str, str] = dict(
            conn.execute(
                "SELECT c.relname, pg_get_expr(c.relpartbound, c.oid) FROM pg_inherits i "
                "JOIN pg_class c ON c.oid = i.inhrelid "
                "WHERE i.inhparent = 'pgjobs_dead'::regclass"
            ).fetchall()
        )
        assert set(partitions) == {"pgjobs_dead_before", "pgjobs_dead_default"}
        assert partitions["pgjobs_dead_before"].startswith("FOR VALUES FROM (MINVALUE) TO (")
        # The old table kept the indexes it had (adopted, none built again), and the
        # (id, died_at) one the partitioned table asks of each partition.
        assert (
            one("SELECT count(*) FROM pg_index WHERE indrelid = 'pgjobs_dead_before'::regclass")
            == old_indexes + 1
        )
        # The application's role keeps what it could do, on the default partition too
        # (pruned by name), and may call the partition functions, as it could delete.
        for table in ("pgjobs_dead", "pgjobs_dead_default"):
            for privilege in ("SELECT", "INSERT", "UPDATE", "DELETE"):
                granted = f"SELECT has_table_privilege('{role}', '{table}', '{privilege}')"
                assert one(granted) is True, (table, privilege)
        for function in (
            "pgjobs_make_dead_partitions(interval, integer)",
            "pgjobs_drop_dead_partitions(interval)",
        ):
            assert one(f"SELECT has_function_privilege('{role}', '{function}', 'EXECUTE')")
            assert one(f"SELECT NOT has_function_privilege('public', '{function}', 'EXECUTE')")
        # Letters written from now on land in the old table until its cutover, and the
        # queue's statements run on the new one.
        conn.execute(WRITE, [2 * 10**9])
        assert one(f"SELECT tableoid::regclass::text FROM pgjobs_dead WHERE id = {2 * 10**9}") == (
            "pgjobs_dead_before"
        )
