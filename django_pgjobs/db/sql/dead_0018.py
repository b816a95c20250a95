"""Migration 0018's statements: the dead-letter table becomes partitioned (S44) without
a long lock. Not among the queue's statements (`db.sql.STATEMENTS`): they run once, from
the migration, which says in what order."""

from __future__ import annotations

# The migration installs the partition functions as the queue runs them.
from django_pgjobs.db.sql.history import PARTITION_FUNCTIONS  # noqa: F401

DEAD_IS_PARTITIONED = """
-- Whether pgjobs_dead is partitioned already (migration 0018 ran, or ran in part).
SELECT relkind = 'p' FROM pg_class WHERE oid = 'pgjobs_dead'::regclass
"""

BOUND_OLD_LETTERS = """
-- Promise, from now on, that every letter of the old table died before a cutover a day
-- ahead (no letter written while the migration runs passes it): no scan (NOT VALID), a
-- moment's lock; VALIDATE_OLD_LETTERS then checks the letters kept. A bound a stopped run
-- left, whose cutover is less than an hour ahead, is replaced: past it, every letter
-- written would break it.
DO $$
DECLARE
    cutover timestamptz;
BEGIN
    SELECT substring(pg_get_constraintdef(oid) FROM '< ''([^'']*)''')::timestamptz
    INTO cutover
    FROM pg_constraint
    WHERE conrelid = 'pgjobs_dead'::regclass AND conname = 'pgjobs_dead_before_bound';
    IF cutover IS NOT NULL AND cutover > now() + interval '1 hour' THEN
        RETURN;
    END IF;
    ALTER TABLE pgjobs_dead DROP CONSTRAINT IF EXISTS pgjobs_dead_before_bound;
    EXECUTE format('ALTER TABLE pgjobs_dead ADD CONSTRAINT pgjobs_dead_before_bound'
                   ' CHECK (died_at < %L) NOT VALID',
                   date_trunc('hour', now()) + interval '1 day');
END
$$
"""

UNBOUND_OLD_LETTERS = """
-- Take the bound back (a switch that could not have its lock): the table stays as 0017
-- left it, and takes letters of any time.
ALTER TABLE pgjobs_dead DROP CONSTRAINT IF EXISTS pgjobs_dead_before_bound
"""

COPY_GRANTS = """
-- Give the partitioned table, and its default partition (pruned by name), the grants the
-- old table had, and EXECUTE on the partition functions to every role that could delete
-- its letters (the sweeper of a worker under a least-privilege role keeps the
-- partitions, S44).
DO $$
DECLARE
    granted record;
BEGIN
    FOR granted IN
        SELECT a.privilege_type,
               CASE WHEN a.grantee = 0 THEN 'PUBLIC' ELSE quote_ident(r.rolname) END AS who
        FROM pg_class AS c
        CROSS JOIN LATERAL aclexplode(c.relacl) AS a
        LEFT JOIN pg_roles AS r ON r.oid = a.grantee
        WHERE c.oid = 'pgjobs_dead_before'::regclass AND a.grantee <> c.relowner
    LOOP
        EXECUTE format('GRANT %s ON pgjobs_dead, pgjobs_dead_default TO %s',
                       granted.privilege_type, granted.who);
        IF granted.privilege_type = 'DELETE' THEN
            EXECUTE format('GRANT EXECUTE ON FUNCTION'
                           ' pgjobs_make_dead_partitions(interval, integer),'
                           ' pgjobs_drop_dead_partitions(interval) TO %s', granted.who);
        END IF;
    END LOOP;
END
$$
"""

VALIDATE_OLD_LETTERS = """
-- Check the old letters against their bound while writers go on (SHARE UPDATE
-- EXCLUSIVE): attaching the table then trusts it instead of reading every row.
ALTER TABLE pgjobs_dead VALIDATE CONSTRAINT pgjobs_dead_before_bound
"""

DROP_INVALID_LETTER_INDEX = """
-- An index a stopped CREATE INDEX CONCURRENTLY left invalid, dropped to be made again.
DO $$
BEGIN
    IF EXISTS (SELECT 1 FROM pg_index
               WHERE indexrelid = to_regclass('pgjobs_dead_before_letter') AND NOT indisvalid)
    THEN
        DROP INDEX pgjobs_dead_before_letter;
    END IF;
END
$$
"""

INDEX_OLD_LETTERS = """
-- The old table's index of (id, died_at), which the partitioned table's unique index
-- (a partition's key must be in it) adopts when the table is attached; made while
-- writers go on.
CREATE UNIQUE INDEX CONCURRENTLY IF NOT EXISTS pgjobs_dead_before_letter
    ON pgjobs_dead (id, died_at)
"""

SET_MIGRATION_LOCK_TIMEOUT = """
-- Give up on the switch's lock after %(timeout)s rather than queue writers behind it.
SELECT set_config('lock_timeout', %(timeout)s, true)
"""

SET_OLD_LETTERS_ASIDE = """
-- Take the old table, rename it and its indexes and statistics (pgjobs_dead_before...),
-- and make the partitioned table in its place, with its columns, defaults and checks.
LOCK TABLE pgjobs_dead IN ACCESS EXCLUSIVE MODE;
DO $$
DECLARE
    old record;
BEGIN
    ALTER TABLE pgjobs_dead RENAME TO pgjobs_dead_before;
    FOR old IN SELECT indexrelid::regclass::text AS name FROM pg_index
               WHERE indrelid = 'pgjobs_dead_before'::regclass
                 AND indexrelid::regclass::text <> 'pgjobs_dead_before_letter'
    LOOP
        EXECUTE format('ALTER INDEX %I RENAME TO %I', old.name,
                       'pgjobs_dead_before_' || substr(old.name, length('pgjobs_dead_') + 1));
    END LOOP;
    IF EXISTS (SELECT 1 FROM pg_statistic_ext
               WHERE stxname = 'pgjobs_dead_queue_category_stats') THEN
        ALTER STATISTICS pgjobs_dead_queue_category_stats
            RENAME TO pgjobs_dead_before_queue_category;
    END IF;
END
$$;
CREATE TABLE pgjobs_dead (LIKE pgjobs_dead_before INCLUDING DEFAULTS INCLUDING CONSTRAINTS)
    PARTITION BY RANGE (died_at);
ALTER TABLE pgjobs_dead DROP CONSTRAINT pgjobs_dead_before_bound;
CREATE UNIQUE INDEX pgjobs_dead_letter ON pgjobs_dead (id, died_at);
CREATE STATISTICS pgjobs_dead_queue_category_stats (mcv) ON queue, category FROM pgjobs_dead
"""

OLD_LETTERS_KEPT = """
-- Whether the old table holds any letter.
SELECT EXISTS (SELECT 1 FROM pgjobs_dead_before)
"""

ATTACH_OLD_LETTERS = """
-- Keep the old letters as the range before their cutover, read from their bound, which
-- is validated (so no row is read); their indexes are adopted as the partitioned table's.
DO $$
BEGIN
    EXECUTE format('ALTER TABLE pgjobs_dead ATTACH PARTITION pgjobs_dead_before'
                   ' FOR VALUES FROM (MINVALUE) TO (%L)',
                   (SELECT substring(pg_get_constraintdef(oid) FROM '< ''([^'']*)''')
                    FROM pg_constraint
                    WHERE conrelid = 'pgjobs_dead_before'::regclass
                      AND conname = 'pgjobs_dead_before_bound'));
END
$$
"""

DROP_OLD_LETTERS = """
-- No letter to keep: the old table goes.
DROP TABLE pgjobs_dead_before
"""

MAKE_DEFAULT_PARTITION = """
-- The partition of the letters no range takes (S44), pruned row by row.
CREATE TABLE pgjobs_dead_default PARTITION OF pgjobs_dead DEFAULT;
CREATE STATISTICS pgjobs_dead_default_queue_category (mcv) ON queue, category
    FROM pgjobs_dead_default
"""
