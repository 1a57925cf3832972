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
-- Where the peers (at-least-once, Structured Streaming) write bad records: the dead
-- letters' columns, without the ledger's checkpoint.
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

-- name: digest
-- Row count and an order-independent checksum of some columns of a table's rows.
SELECT count(*), coalesce(sum(hashtextextended(t::text, 0)), 0)::text
FROM (SELECT {columns} FROM {table} WHERE {where}) t;

-- name: checkpoint_records
-- Records each checkpoint of a pipeline read (NULL: it had nothing to read).
SELECT records FROM exactly_once.checkpoints WHERE pipeline = %(pipeline)s;
