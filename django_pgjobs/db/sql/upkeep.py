"""Statements of the job table's upkeep: when its dead rows are worth a VACUUM, and the
VACUUM. A utility statement: sent unprepared, outside any transaction."""

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

VACUUM_JOB_TABLE = """
-- Remove the job table's dead rows and their index entries (every index, however few),
-- unless another VACUUM of it runs now (autovacuum's, or another worker's).
VACUUM (SKIP_LOCKED, INDEX_CLEANUP ON) pgjobs_job
"""
