"""Statements of the job table's upkeep: when its dead rows are worth a VACUUM, the VACUUM
(a utility statement: sent unprepared, outside any transaction), and, while the xmin
horizon holds them, where claims start reading each queue (CLAIM_FLOORS)."""

from __future__ import annotations

JOB_TABLE_UPKEEP = """
-- The job table's dead and live rows (the statistics collector's counts) and the
-- database's xmin horizon: the oldest transaction that a snapshot, a running transaction,
-- a replication slot or a prepared transaction still needs (NULL: none). VACUUM removes
-- the rows that died before it, none after: while it stays, another VACUUM is in vain.
SELECT s.n_dead_tup, s.n_live_tup,
       (SELECT h.xid::text
        FROM (SELECT a.backend_xmin AS xid FROM pg_stat_activity AS a
              WHERE a.datname = current_database() AND a.pid <> pg_backend_pid()
                AND a.backend_xmin IS NOT NULL
                -- A VACUUM's snapshot holds back no other VACUUM: not a holder.
                AND a.pid NOT IN (SELECT v.pid FROM pg_stat_progress_vacuum AS v)
              UNION ALL
              SELECT a.backend_xid FROM pg_stat_activity AS a
              WHERE a.datname = current_database() AND a.backend_xid IS NOT NULL
              UNION ALL
              SELECT r.xmin FROM pg_replication_slots AS r WHERE r.xmin IS NOT NULL
              UNION ALL
              SELECT p.transaction FROM pg_prepared_xacts AS p
              WHERE p.database = current_database()) AS h
        ORDER BY age(h.xid) DESC
        LIMIT 1) AS horizon
FROM pg_stat_user_tables AS s
WHERE s.relid = 'pgjobs_job'::regclass
"""

JOB_TABLE_PAGES = """
-- The job table's size in pages now, and as its statistics have it (pg_class.relpages, set
-- by the last VACUUM or ANALYZE of it, which also make every backend plan its statements
-- on it anew): about the size every cached plan of them was made for.
SELECT pg_relation_size(c.oid) / current_setting('block_size')::int, c.relpages
FROM pg_class AS c
WHERE c.oid = 'pgjobs_job'::regclass
"""

ANALYZE_JOB_TABLE = """
-- New statistics of the job table, and with them new plans of every statement on it in
-- every backend; skipped when another ANALYZE or VACUUM of it runs now.
ANALYZE (SKIP_LOCKED) pgjobs_job
"""

VACUUM_JOB_TABLE = """
-- Remove the job table's dead rows and their index entries (every index, however few),
-- unless another VACUUM of it runs now (autovacuum's, or another worker's).
VACUUM (SKIP_LOCKED, INDEX_CLEANUP ON) pgjobs_job
"""

CLAIM_FLOORS = """
-- Per queue of %(queues)s, its floor: a time no pending unkeyed job of the queue that is
-- or will become visible runs before, save one made pending with an earlier run_after than its
-- writer's start (a backdated job, a lapsed claim put back): the earliest run_after of
-- its pending jobs from its last floor %(floors)s on (NULL: from the start), the start of
-- the oldest transaction that may still write jobs (one holding the job table's
-- RowExclusiveLock, as every INSERT, UPDATE and DELETE does), and this statement's start
-- less 100 ms (a writer that committed between this statement's snapshot and its read
-- of the locks is in neither), whichever is earliest. Also its top: the highest
-- priority of its pending unkeyed jobs from the new floor (NULL: none). And, the same in every
-- row, the lease floor: no running job's lease ends before it (save one shortened by
-- hand), read from %(lease_floor)s on the same way, a lease being at least a second long.
WITH writers AS (
    SELECT min(a.xact_start) AS since
    FROM pg_locks AS l
    JOIN pg_stat_activity AS a ON a.pid = l.pid
    -- A relation's oid is unique in its database only: another database's table may
    -- share this one's.
    WHERE l.locktype = 'relation' AND l.relation = 'pgjobs_job'::regclass
      AND l.database = (SELECT d.oid FROM pg_database AS d
                        WHERE d.datname = current_database())
      AND l.mode = 'RowExclusiveLock' AND l.pid <> pg_backend_pid()
),
floors AS (
    SELECT q.name,
           -- Unkeyed jobs only: the floors are the unkeyed claim's (CLAIM_JOBS); a keyed
           -- trigger waiting for its key held them back to its enqueue.
           least((SELECT j.run_after FROM pgjobs_job AS j
                  WHERE j.state = 'pending' AND j.limit_key IS NULL AND j.queue = q.name
                    AND j.run_after >= coalesce(q.floor, '-infinity')
                  ORDER BY j.run_after LIMIT 1),
                 w.since,
                 statement_timestamp() - interval '100 milliseconds') AS floor
    FROM unnest(%(queues)s::text[], %(floors)s::timestamptz[]) AS q(name, floor), writers AS w
)
SELECT f.name, f.floor,
       -- From the new floor: the dead entries below it are skipped in the index.
       (SELECT j.priority FROM pgjobs_job AS j
        WHERE j.state = 'pending' AND j.limit_key IS NULL AND j.queue = f.name
          AND j.run_after >= f.floor
        ORDER BY j.priority DESC LIMIT 1) AS top,
       least((SELECT j.claimed_until FROM pgjobs_job AS j
              WHERE j.state = 'running'
                AND j.claimed_until >= coalesce(%(lease_floor)s::timestamptz, '-infinity')
              ORDER BY j.claimed_until LIMIT 1),
             w.since + interval '1 second',
             statement_timestamp() + interval '900 milliseconds') AS lease_floor
FROM floors AS f, writers AS w
"""
