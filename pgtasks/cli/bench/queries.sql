-- The queries of `pgtasks bench`, loaded and composed as pgtasks' own (see pgtasks.sql): each
-- under "-- name: <name>" with a one-line description, {schema} the bench's schema. They read
-- what the bench measures (the server's statistics, WAL, table sizes) and make and drop its
-- schema; the queue's own statements are the library's.

-- name: server_version
-- The server's version string (SHOW server_version), for reports.
SELECT current_setting('server_version') AS version

-- name: schema_state
-- Whether the schema exists, and whether `pgtasks bench` created it (its comment is the mark).
SELECT n.oid IS NOT NULL AS present,
       coalesce(obj_description(n.oid, 'pg_namespace') = 'pgtasks bench', false) AS ours
  FROM (SELECT 1) AS one
  LEFT JOIN pg_namespace n ON n.nspname = %(schema)s

-- name: create_schema
-- A new, empty schema for `pgtasks bench` (fails when it exists).
CREATE SCHEMA {schema}

-- name: mark_schema
-- Mark the schema as created by `pgtasks bench`, so that a later run may drop it.
COMMENT ON SCHEMA {schema} IS 'pgtasks bench'

-- name: drop_schema
-- Drop the schema and everything in it.
DROP SCHEMA IF EXISTS {schema} CASCADE

-- name: cost_sample
-- What the bench needs to compute cost per task: the WAL position, and the server processes
-- serving this database (their CPU time is read from /proc when the server is local).
SELECT pg_current_wal_lsn()::text AS lsn,
       array(SELECT pid FROM pg_stat_activity WHERE datname = current_database()) AS pids,
       now() AS now

-- name: wal_bytes
-- Bytes of WAL written since a position returned by cost_sample.
SELECT pg_wal_lsn_diff(pg_current_wal_lsn(), %(since)s::pg_lsn)::bigint AS bytes

-- name: maintenance
-- How many vacuums (autovacuum's and manual ones) have finished on the hot table and the result
-- and history tables, and how many checkpoints the server has made: the bench reads them at
-- every window, so that a slow window can be set beside the maintenance that ran in it. Both
-- are cumulative counters that any role may read. The checkpoints as PostgreSQL 15 and 16
-- count them (maintenance_17 for later versions).
SELECT
-- insert: vacuums
       (SELECT checkpoints_timed + checkpoints_req FROM pg_stat_bgwriter)::int8 AS checkpoints

-- name: maintenance_17
-- maintenance for PostgreSQL 17 on, whose checkpointer counts its checkpoints in a view of its
-- own.
SELECT
-- insert: vacuums
       (SELECT num_timed + num_requested FROM pg_stat_checkpointer)::int8 AS checkpoints

-- name: steady_window
-- Send-to-start latency of the bench's stamp tasks that finished after %(since)s (each result is
-- its own latency in seconds: the steady phase stores no other results), and the sizes of the
-- hot table and the result and history tables with their indexes. Only the new results are
-- read, so the measurement stays light next to the load it measures (a count of the waiting
-- rows would read every entry of the claim index, which a held snapshot keeps growing).
SELECT count(*) AS done,
       max(r.date_done) AS last_done,
       percentile_cont(ARRAY[0.5, 0.99]) WITHIN GROUP (ORDER BY
           convert_from(r.result, 'UTF8')::float8 * 1000
       ) AS ms,
       pg_total_relation_size('{schema}.tasks'::regclass) AS tasks_bytes,
       pg_total_relation_size('{schema}.results'::regclass) AS results_bytes,
       pg_total_relation_size('{schema}.attempts'::regclass) AS attempts_bytes
  FROM {schema}.results AS r
 WHERE r.date_done > %(since)s

-- name: synchronous_commit_on
-- This session's commits wait for their WAL to reach the disk (the server's default).
SET synchronous_commit = on

-- name: synchronous_commit_off
-- This session's commits return before their WAL reaches the disk: set against the default
-- above, it measures what an enqueue spends waiting for the flush.
SET synchronous_commit = off

-- name: repeatable_read
-- The first statement of a transaction whose snapshot is taken once, at its first query, and
-- kept to its end.
SET TRANSACTION ISOLATION LEVEL REPEATABLE READ

-- name: take_xid
-- An xid and a snapshot for the open transaction: while it stays open, the xmin horizon stands
-- still and vacuum removes no row that dies meanwhile.
SELECT txid_current()

-- Fragments: parts that several queries share word for word, written where a query has the
-- line "-- insert: <fragment>".

-- fragment: vacuums
-- The first column of maintenance and maintenance_17: vacuums finished on the queue's three
-- tables.
       (SELECT COALESCE(sum(s.autovacuum_count + s.vacuum_count), 0)
          FROM pg_stat_all_tables AS s
         WHERE s.relid IN ('{schema}.tasks'::regclass, '{schema}.results'::regclass,
                           '{schema}.attempts'::regclass))::int8 AS vacuums,
