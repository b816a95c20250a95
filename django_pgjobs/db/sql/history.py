"""The dead-letter table in time partitions (S44): migration 0018's conversion, and the
sweeper's functions that make partitions ahead and drop them whole.

`pgjobs_dead` is partitioned by range of `died_at`. Its partitions:

- `pgjobs_dead_p<UTC start>`, one per span (PGJOBS["DEAD_PARTITION_SPAN"], a day by
  default), made ahead by the sweeper and dropped whole once every letter it can hold
  is older than the longest dead retention in effect: no DELETE, no dead rows, no VACUUM;
- `pgjobs_dead_before` (installs that had letters before 0018): the old table itself,
  attached as the range before the migration's cutover, dropped whole as the others;
- `pgjobs_dead_default`: any letter no range partition takes (one written before the
  sweeper made its partition, one edited by hand far into the past or the future). The
  sweeper moves its letters into a partition it makes for their range, and prunes the
  rest row by row, by their retention, as the whole table was before.

Making a partition takes no lock that stops writers or readers of the table: it is made
as a table of its own and attached (SHARE UPDATE EXCLUSIVE on the parent). Dropping one
takes the parent's ACCESS EXCLUSIVE lock for an instant; the sweeper asks for it under a
lock_timeout, so that a long reader delays the drop, never the queue.

Migration 0018's own statements, which run once, are in `dead_0018`; it installs
PARTITION_FUNCTIONS as they are here: a change to them needs a migration that installs
them again (and 0018 then a frozen copy of today's text, as workflows_0006 keeps).
"""

from __future__ import annotations

#: The range partition bounds of the dead-letter table, read from the catalog.
_RANGES = r"""
    SELECT c.oid::regclass AS part,
           (regexp_match(pg_get_expr(c.relpartbound, c.oid),
                         'FROM \((?:MINVALUE|''([^'']*)'')\)'))[1]::timestamptz AS lower,
           (regexp_match(pg_get_expr(c.relpartbound, c.oid),
                         'TO \(''([^'']*)''\)'))[1]::timestamptz AS upper
    FROM pg_inherits AS i
    JOIN pg_class AS c ON c.oid = i.inhrelid
    WHERE i.inhparent = 'pgjobs_dead'::regclass
      AND pg_get_expr(c.relpartbound, c.oid) <> 'DEFAULT'
"""

PARTITION_FUNCTIONS = f"""
-- Install pgjobs_make_dead_partitions(span, ahead) and pgjobs_drop_dead_partitions(
-- horizon) (S44): the sweeper's two passes over the dead-letter table's partitions.
CREATE OR REPLACE FUNCTION pgjobs_make_dead_partitions(span interval, ahead integer)
RETURNS integer
LANGUAGE plpgsql VOLATILE
-- As the table's owner (who ran the migration): a worker's role that may only read and
-- write rows still makes and drops them. Its names are the migration's schema's.
SECURITY DEFINER SET search_path FROM CURRENT
AS $body$
-- Make the partitions that take the letters of the next `ahead` spans, each `span` long
-- and aligned on the epoch, from the end of the last one made (or this span's start,
-- when that ended earlier). The default partition's letters in a new range move into
-- it. Returns how many were made.
DECLARE
    step float8 := extract(epoch FROM span);
    upto timestamptz := clock_timestamp() + span * ahead;
    lower timestamptz;
    upper timestamptz;
    part text;
    made integer := 0;
    held boolean := false;
BEGIN
    IF step < 1 THEN
        RAISE EXCEPTION 'a dead-letter partition spans at least a second, not %', span;
    END IF;
    PERFORM pg_advisory_xact_lock(hashtext('pgjobs_dead_partitions'));  -- one maker
    SELECT max(r.upper) INTO lower FROM ({_RANGES}) AS r;
    lower := greatest(lower, to_timestamp(floor(extract(epoch FROM clock_timestamp()) / step)
                                          * step));
    WHILE lower < upto LOOP
        upper := to_timestamp((floor(extract(epoch FROM lower) / step) + 1) * step);
        IF lower <= clock_timestamp() AND NOT held THEN
            -- A statement that began before this range was attached routes a letter of
            -- it to the default partition, and fails once it is: while a range letters
            -- are being written to is attached, writers of letters wait (a moment).
            LOCK TABLE pgjobs_dead IN SHARE ROW EXCLUSIVE MODE;
            held := true;
        END IF;
        part := 'pgjobs_dead_p' || to_char(lower AT TIME ZONE 'UTC', 'YYYYMMDD"t"HH24MISS');
        EXECUTE format('CREATE TABLE %I (LIKE pgjobs_dead INCLUDING DEFAULTS'
                       ' INCLUDING CONSTRAINTS)', part);
        EXECUTE format('WITH moved AS (DELETE FROM pgjobs_dead_default'
                       ' WHERE died_at >= %L AND died_at < %L RETURNING *)'
                       ' INSERT INTO %I SELECT * FROM moved', lower, upper, part);
        EXECUTE format('ALTER TABLE pgjobs_dead ATTACH PARTITION %I'
                       ' FOR VALUES FROM (%L) TO (%L)', part, lower, upper);
        EXECUTE format('CREATE STATISTICS IF NOT EXISTS %I (mcv) ON queue, category FROM %I',
                       part || '_queue_category', part);
        made := made + 1;
        lower := upper;
    END LOOP;
    RETURN made;
END
$body$;

CREATE OR REPLACE FUNCTION pgjobs_drop_dead_partitions(horizon interval)
RETURNS integer
LANGUAGE plpgsql VOLATILE
-- As the table's owner (who ran the migration): a worker's role that may only read and
-- write rows still makes and drops them. Its names are the migration's schema's.
SECURITY DEFINER SET search_path FROM CURRENT
AS $body$
-- Drop every range partition whose letters all died more than `horizon` ago, and the
-- edges of its letters (S29), as pruning deletes them. Returns how many were dropped.
DECLARE
    old record;
    dropped integer := 0;
BEGIN
    PERFORM pg_advisory_xact_lock(hashtext('pgjobs_dead_partitions'));
    FOR old IN
        SELECT r.part FROM ({_RANGES}) AS r
        WHERE r.upper <= clock_timestamp() - horizon
        ORDER BY r.upper
    LOOP
        EXECUTE format('DELETE FROM pgjobs_dependency AS d WHERE d.child_id IN'
                       ' (SELECT x.id FROM %s AS x WHERE x.has_parents)', old.part);
        EXECUTE format('DROP TABLE %s', old.part);
        dropped := dropped + 1;
    END LOOP;
    RETURN dropped;
END
$body$
"""

MAKE_DEAD_PARTITIONS = """
-- Make the dead-letter table's partitions for the next %(ahead)s spans of %(span_s)s
-- seconds (S44), without waiting over %(lock_timeout)s for a lock. Returns how many.
SELECT set_config('lock_timeout', %(lock_timeout)s, true),
       pgjobs_make_dead_partitions(make_interval(secs => %(span_s)s::float8), %(ahead)s)
"""

DROP_DEAD_PARTITIONS = """
-- Drop the dead-letter partitions whose letters all died over %(horizon_s)s seconds ago
-- (S44), without waiting over %(lock_timeout)s for a lock. Returns how many.
SELECT set_config('lock_timeout', %(lock_timeout)s, true),
       pgjobs_drop_dead_partitions(make_interval(secs => %(horizon_s)s::float8))
"""

DEAD_PARTITIONS = f"""
-- The dead-letter table's partitions: name, range (NULL bounds: open), letters (the
-- planner's estimate) and size, oldest first; the default partition last.
SELECT c.relname, r.lower, r.upper, greatest(c.reltuples, 0)::bigint,
       pg_total_relation_size(c.oid)
FROM pg_inherits AS i
JOIN pg_class AS c ON c.oid = i.inhrelid
LEFT JOIN ({_RANGES}) AS r ON r.part = c.oid
WHERE i.inhparent = 'pgjobs_dead'::regclass
ORDER BY r.upper NULLS LAST, c.relname
"""
