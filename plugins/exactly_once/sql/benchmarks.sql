-- Statements of the benchmarks (tests/benchmarks), by name. {identifiers} are filled
-- in with psycopg2.sql. Benchmark pipelines are copies of the demo pipeline with
-- names of their own; these statements create their extra tables and remove them.

-- name: forget_pipeline
-- Every ledger row of one pipeline (its staging and contributions tables are dropped apart).
DELETE FROM exactly_once.dead_letters WHERE pipeline = %(pipeline)s;
DELETE FROM exactly_once.committed_ranges WHERE pipeline = %(pipeline)s;
DELETE FROM exactly_once.gaps WHERE pipeline = %(pipeline)s;
DELETE FROM exactly_once.checkpoint_ranges WHERE pipeline = %(pipeline)s;
DELETE FROM exactly_once.staging_dead_letters
WHERE checkpoint_id IN (SELECT id FROM exactly_once.checkpoints WHERE pipeline = %(pipeline)s);
DELETE FROM exactly_once.operator_actions WHERE pipeline = %(pipeline)s;
DELETE FROM exactly_once.attempts
WHERE checkpoint_id IN (SELECT id FROM exactly_once.checkpoints WHERE pipeline = %(pipeline)s);
DELETE FROM exactly_once.checkpoints WHERE pipeline = %(pipeline)s;
DELETE FROM exactly_once.partitions WHERE pipeline = %(pipeline)s;
DELETE FROM exactly_once.preflights WHERE pipeline = %(pipeline)s;
DELETE FROM exactly_once.alerts WHERE pipeline = %(pipeline)s;
DELETE FROM exactly_once.outbox WHERE pipeline = %(pipeline)s;
DELETE FROM exactly_once.outbox_published WHERE pipeline = %(pipeline)s;
DELETE FROM exactly_once.config_versions WHERE pipeline = %(pipeline)s;
DELETE FROM exactly_once.pipelines WHERE name = %(pipeline)s;

-- name: drop_table
DROP TABLE IF EXISTS {table};

-- name: create_schema
CREATE SCHEMA {schema};

-- name: drop_schema
DROP SCHEMA IF EXISTS {schema} CASCADE;

-- name: create_peer_dead_letters
-- Where the peers with the increment job's frames (at-least-once, Structured Streaming with
-- the COPY writer) write bad records: the dead letters' columns, without the ledger's checkpoint.
CREATE TABLE {schema}.dead_letters (
    pipeline text NOT NULL, topic text NOT NULL, partition int NOT NULL, "offset" bigint NOT NULL,
    key bytea, value bytea, reason text NOT NULL,
    PRIMARY KEY (pipeline, topic, partition, "offset"));

-- name: copy_out
-- One checkpoint's staging rows of one table, as the file the COPY limit loads (binary: no
-- parsing on the way in, the fastest COPY there is).
COPY (SELECT * FROM {staging} WHERE checkpoint_id = {checkpoint_id}) TO STDOUT (FORMAT binary);

-- name: create_bare_like
-- A table with a staging table's columns and no index: what the bare COPY loads.
CREATE TABLE {table} (LIKE {staging});

-- name: create_like_staging
-- A table like a staging table, its index included: what COPY loads as staging would.
CREATE TABLE {table} (LIKE {staging} INCLUDING INDEXES);

-- name: copy_in
COPY {table} FROM STDIN (FORMAT binary);

-- name: create_like_final
-- A table like a final table, its unique indexes included: what INSERT … SELECT fills.
CREATE TABLE {table} (LIKE {final} INCLUDING INDEXES);

-- name: insert_select
INSERT INTO {table} ({columns}) SELECT {columns} FROM {source};

-- name: insert_folded
-- A keyed sink's: its staged rows folded per key first, as its commit folds them (each Spark
-- task of the one-pass write stages its own folds).
INSERT INTO {table} ({columns}) SELECT {columns} FROM ({folded}) AS f;

-- name: digest
-- Row count and an order-independent checksum of some columns of a table's rows.
SELECT count(*), coalesce(sum(hashtextextended(t::text, 0)), 0)::text
FROM (SELECT {columns} FROM {table} WHERE {where}) t;

-- name: checkpoint_records
-- Records each checkpoint of a pipeline read (NULL: it had nothing to read).
SELECT records FROM exactly_once.checkpoints WHERE pipeline = %(pipeline)s;

-- The ledger benchmarks (./dev bench-ledger: tests/benchmarks/ledger_growth.py, staging_bloat.py).
-- A synthetic row's columns are expressions of g (the checkpoint's number) and j (the row's,
-- j = 0 being the checkpoint's dead letter): tests/benchmarks/ledger_bench.py, VALUES.

-- name: table_columns
SELECT a.attname::text FROM pg_attribute a
WHERE a.attrelid = pg_catalog.to_regclass(%(table)s) AND a.attnum > 0 AND NOT a.attisdropped
  AND a.attname NOT IN ('checkpoint_id', 'attempt', 'writer_task')
ORDER BY a.attnum;

-- name: stage_rows
-- An attempt's staged rows of one sink, as its job would write them.
INSERT INTO {staging} ({columns}, checkpoint_id, attempt)
SELECT {values}, %(checkpoint_id)s, %(attempt)s
FROM (SELECT %(g)s::bigint AS g) s, generate_series(1, %(records)s - 1) j;

-- name: stage_dead_letter
INSERT INTO exactly_once.staging_dead_letters
    (checkpoint_id, attempt, pipeline, topic, partition, "offset", key, value, reason)
VALUES (%(checkpoint_id)s, %(attempt)s, %(pipeline)s, %(topic)s, 0, %(g)s * %(per_partition)s, NULL,
        '{not json', 'value is not JSON: Expecting property name');

-- name: fill_keys
-- Every key of a keyed sink's final table, once.
INSERT INTO {final} ({columns})
SELECT {values} FROM generate_series(0, %(keys)s / 10 - 1) g, generate_series(0, 9) j
ON CONFLICT DO NOTHING;

-- name: history
-- Committed checkpoints g = first … last, as the protocol leaves them: the checkpoint
-- (committed 45 s after its interval ended, its phases' seconds recorded), its committed
-- attempt, its frozen and committed ranges (per_partition offsets in each partition), one dead
-- letter; and the pipeline's frontier after them. Their contributions: history_contributions.
INSERT INTO exactly_once.checkpoints
    (pipeline, dag_run_id, interval_start, interval_end, reach, state, attempt, lease_until, precommitted_attempt,
     staged, records, created_at, precommitted_at, committed_at, contributions_kept, phase_seconds)
SELECT %(pipeline)s, 'history:' || g, t, t + %(every)s, 'backlog', 'committed', 1, t + %(every)s + interval '1 hour',
       1, %(staged)s::jsonb, 3 * %(per_partition)s, t + %(every)s, t + %(every)s + interval '40 seconds',
       t + %(every)s + interval '45 seconds', true,
       jsonb_build_object('plan', 0.05, 'spark', 30 + mod(g, 7), 'pre_commit', 0.02, 'commit', 0.3)
FROM generate_series(%(first)s::bigint, %(last)s) g, LATERAL (SELECT %(origin)s::timestamptz + g * %(every)s) s(t);
DROP TABLE IF EXISTS pg_temp.history;
CREATE TEMP TABLE history ON COMMIT DROP AS
SELECT id, split_part(dag_run_id, ':', 2)::bigint AS g, committed_at AS at
FROM exactly_once.checkpoints
WHERE pipeline = %(pipeline)s AND dag_run_id LIKE 'history:%%' AND id > %(after)s;
INSERT INTO exactly_once.attempts (checkpoint_id, attempt, state, started_at, ended_at, config_version)
SELECT id, 1, 'committed', at - interval '45 seconds', at, %(version)s FROM history;
INSERT INTO exactly_once.checkpoint_ranges (checkpoint_id, pipeline, topic, partition, from_offset, to_offset)
SELECT id, %(pipeline)s, %(topic)s, p, g * %(per_partition)s, (g + 1) * %(per_partition)s
FROM history, generate_series(0, 2) p;
INSERT INTO exactly_once.committed_ranges (pipeline, topic, partition, from_offset, to_offset, checkpoint_id,
                                           committed_at)
SELECT %(pipeline)s, %(topic)s, p, g * %(per_partition)s, (g + 1) * %(per_partition)s, id, at
FROM history, generate_series(0, 2) p;
INSERT INTO exactly_once.dead_letters (pipeline, topic, partition, "offset", key, value, reason, checkpoint_id,
                                       committed_at)
SELECT %(pipeline)s, %(topic)s, 0, g * %(per_partition)s, NULL, '{not json',
       'value is not JSON: Expecting property name', id, at
FROM history;
INSERT INTO exactly_once.partitions (pipeline, topic, partition, start_offset, frontier)
SELECT %(pipeline)s, %(topic)s, p, 0, (%(last)s + 1) * %(per_partition)s FROM generate_series(0, 2) p
ON CONFLICT (pipeline, topic, partition) DO UPDATE SET frontier = EXCLUDED.frontier;

-- name: history_contributions
-- In history's transaction: each checkpoint's contribution to a keyed sink, one row per key it touched.
INSERT INTO {contributions} ({columns}, checkpoint_id)
SELECT {values}, id FROM pg_temp.history, generate_series(0, %(keys_per_checkpoint)s - 1) j;

-- name: last_id
SELECT coalesce(max(id), 0) FROM exactly_once.checkpoints;

-- name: ledger_tables
-- The ledger's tables with their size on disk, indexes and TOAST included.
SELECT c.relname::text, pg_catalog.pg_total_relation_size(c.oid)
FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
WHERE n.nspname = 'exactly_once' AND c.relkind = 'r'
ORDER BY 1;

-- name: count_rows
SELECT count(*) FROM {table};

-- name: table_stats
-- A table's dead tuples, its size on disk, and when autovacuum last ran on it.
SELECT coalesce(s.n_dead_tup, 0), coalesce(s.n_live_tup, 0), pg_catalog.pg_total_relation_size(c.oid),
       s.last_autovacuum, coalesce(s.autovacuum_count, 0)
FROM pg_class c LEFT JOIN pg_stat_user_tables s ON s.relid = c.oid
WHERE c.oid = pg_catalog.to_regclass(%(table)s);
