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

Making partitions holds writers of letters for a moment (SHARE ROW EXCLUSIVE on the
parent, and the default partition's ACCESS EXCLUSIVE while each is attached); readers of
the parent go on. Dropping one takes the parent's ACCESS EXCLUSIVE lock for an instant.
The sweeper asks for both under a lock_timeout shorter than deadlock_timeout, so that a
transaction that holds the table delays the partitions, and never waits long on them.

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
-- horizon) (S44): the sweeper's two passes over the dead-letter table's partitions. They
-- run as the table's owner (SECURITY DEFINER), so that a worker's role that may only read
-- and write rows keeps them; on the schema they were installed in and pg_temp last (a
-- caller's temporary table never stands in for one of theirs), in UTC and ISO dates (the
-- partitions' bounds are read back as text), and only for the roles granted EXECUTE.
SELECT set_config('search_path', quote_ident(current_schema()) || ', pg_temp', true);

CREATE OR REPLACE FUNCTION pgjobs_make_dead_partitions(span interval, ahead integer)
RETURNS integer
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path FROM CURRENT SET timezone = 'UTC' SET datestyle = 'ISO, YMD'
AS $body$
-- Make the partitions of this span and the next `ahead` spans, each `span` long and
-- aligned on the epoch, from the end of the last one made (or this span's start, when
-- that ended earlier). The default partition's letters in a new range move into it.
-- Returns how many were made.
DECLARE
    step float8 := extract(epoch FROM span);
    upto timestamptz := clock_timestamp() + span * ahead;
    lower timestamptz;
    upper timestamptz;
    part text;
    made integer := 0;
BEGIN
    IF step < 1 OR step <> floor(step) OR ahead NOT BETWEEN 0 AND 1000 THEN
        RAISE EXCEPTION 'dead-letter partitions span whole seconds, at least one, and are '
                        'made up to 1000 ahead: not % and %', span, ahead;
    END IF;
    PERFORM pg_advisory_xact_lock(hashtext('pgjobs_dead_partitions'));  -- one maker
    SELECT max(r.upper) INTO lower FROM ({_RANGES}) AS r;
    lower := greatest(lower, to_timestamp(floor(extract(epoch FROM clock_timestamp()) / step)
                                          * step));
    IF lower < upto THEN
        -- A statement that began before a range was attached routes a letter of it to
        -- the default partition, and fails once it is: writers of letters wait while
        -- ranges are attached (a moment, about once a span).
        LOCK TABLE pgjobs_dead IN SHARE ROW EXCLUSIVE MODE;
    END IF;
    WHILE lower < upto LOOP
        upper := to_timestamp((floor(extract(epoch FROM lower) / step) + 1) * step);
        part := 'pgjobs_dead_p' || to_char(lower, 'YYYYMMDD"t"HH24MISS');
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
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path FROM CURRENT SET timezone = 'UTC' SET datestyle = 'ISO, YMD'
AS $body$
-- Drop every range partition whose letters all died more than `horizon` ago, and the
-- edges of its letters (S29), as pruning deletes them. Returns how many were dropped.
DECLARE
    old record;
    dropped integer := 0;
BEGIN
    IF horizon < interval '0' THEN
        RAISE EXCEPTION 'the horizon of dead-letter partitions is never negative: %', horizon;
    END IF;
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
$body$;

REVOKE EXECUTE ON FUNCTION pgjobs_make_dead_partitions(interval, integer),
                           pgjobs_drop_dead_partitions(interval) FROM PUBLIC
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
