"""The dead-letter table in time partitions (S44), on a live install.

The table becomes partitioned by range of `died_at` without a long lock: its letters
are first promised to have died before a cutover a day ahead (a constraint added
NOT VALID, then validated while writers go on), and given the (id, died_at) index the
partitioned table needs (built concurrently). The switch itself is a moment under the
table's lock, retried when the lock is not had within seconds: the table is renamed
`pgjobs_dead_before`, a partitioned `pgjobs_dead` takes its place with the same
columns, checks and indexes, and the old table is attached as the range before the
cutover (its bound is trusted, so no row is read, and its indexes are adopted) or,
empty, dropped. A default partition takes what no range does; the sweeper makes the
ranges ahead (db/sql/history.py). The new tables get the old one's grants. While the
switch waits for its lock, letters wait behind it: at most LOCK_TIMEOUT a try.

Not reversible: going back means copying every letter into a plain table.
"""

import time

from django.db import DatabaseError, migrations, transaction
from psycopg import errors

from django_pgjobs.db.sql import dead_0018 as sql

#: Tries of the switch, each waiting at most LOCK_TIMEOUT for the table's lock.
SWITCH_TRIES = 30
LOCK_TIMEOUT = "2s"


def partition(apps, schema_editor):
    connection = schema_editor.connection
    with connection.cursor() as cursor:
        cursor.execute(sql.DEAD_IS_PARTITIONED)
        if cursor.fetchone()[0]:
            return
        _with_lock_retries(connection, lambda: cursor.execute(sql.BOUND_OLD_LETTERS))
        cursor.execute(sql.VALIDATE_OLD_LETTERS)
        cursor.execute(sql.DROP_INVALID_LETTER_INDEX)
        cursor.execute(sql.INDEX_OLD_LETTERS)

    DeadJob = apps.get_model("django_pgjobs", "DeadJob")

    def switch():
        with connection.cursor() as cursor:
            cursor.execute(sql.SET_OLD_LETTERS_ASIDE)
            for index in DeadJob._meta.indexes:
                schema_editor.add_index(DeadJob, index)
            cursor.execute(sql.MAKE_DEFAULT_PARTITION)
            cursor.execute(sql.PARTITION_FUNCTIONS)
            cursor.execute(sql.COPY_GRANTS)
            cursor.execute(sql.OLD_LETTERS_KEPT)
            if cursor.fetchone()[0]:
                cursor.execute(sql.ATTACH_OLD_LETTERS)
            else:
                cursor.execute(sql.DROP_OLD_LETTERS)

    try:
        _with_lock_retries(connection, switch)
    except RuntimeError:  # the lock was never had: no bound left to break later letters
        with connection.cursor() as cursor:
            cursor.execute(sql.UNBOUND_OLD_LETTERS)
        raise


def _with_lock_retries(connection, step):
    """Run `step` in a transaction of its own, again while it gives up on a lock (its
    lock_timeout): a long reader of the table delays the migration, never the queue."""
    for attempt in range(SWITCH_TRIES):
        try:
            with transaction.atomic(using=connection.alias), connection.cursor() as cursor:
                cursor.execute(sql.SET_MIGRATION_LOCK_TIMEOUT, {"timeout": LOCK_TIMEOUT})
                return step()
        except DatabaseError as error:
            if not isinstance(error.__cause__, errors.LockNotAvailable):
                raise
            if attempt + 1 == SWITCH_TRIES:
                raise RuntimeError(
                    "migration 0018 could not take pgjobs_dead's lock for a moment in "
                    f"{SWITCH_TRIES} tries of {LOCK_TIMEOUT}: a transaction holds the "
                    "table (see pg_locks); end it and run migrate again"
                ) from error
            time.sleep(1)
    return None


class Migration(migrations.Migration):
    atomic = False

    dependencies = [
        ("django_pgjobs", "0017_console_indexes"),
    ]

    operations = [
        migrations.RunPython(partition, reverse_code=None, elidable=False),
    ]
