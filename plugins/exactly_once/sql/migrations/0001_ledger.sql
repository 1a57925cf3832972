-- The checkpoint ledger: every state of the exactly-once protocol lives here.
-- Applied once, in one transaction, by `python -m exactly_once.ledger.migrate`.

CREATE EXTENSION IF NOT EXISTS btree_gist;
CREATE SCHEMA IF NOT EXISTS exactly_once;

CREATE TABLE exactly_once.pipelines (
    name          text PRIMARY KEY,
    config        jsonb NOT NULL,            -- as last registered, for inspection
    registered_at timestamptz NOT NULL DEFAULT now()
);

-- Per (pipeline, topic, partition): where the pipeline started, and the end of
-- the last range planned from new data (the next plan starts there).
CREATE TABLE exactly_once.partitions (
    pipeline     text   NOT NULL REFERENCES exactly_once.pipelines,
    topic        text   NOT NULL,
    partition    int    NOT NULL,
    start_offset bigint NOT NULL,
    frontier     bigint NOT NULL,
    PRIMARY KEY (pipeline, topic, partition),
    CHECK (frontier >= start_offset)
);

-- A checkpoint's life (Flink's two-phase commit, one DAG run each):
--
--   planned ──start_attempt──▶ running ──pre_commit──▶ precommitted ──commit──▶ committed
--      ▲                          │
--      └──── abort_attempt ───────┘   (a failed attempt; the same ranges run again)
--
--   planned | running ──abort──▶ aborted   (its ranges are released and the next
--                                           checkpoint re-plans exactly them)
--
-- A precommitted checkpoint is never aborted: a retry or the next run's
-- recovery commits it. `attempt` is the fencing token of the current attempt:
-- only that attempt may pre-commit, and only the pre-committed one is promoted.
CREATE TYPE exactly_once.checkpoint_state AS ENUM ('planned', 'running', 'precommitted', 'committed', 'aborted');

CREATE TABLE exactly_once.checkpoints (
    id                   bigserial PRIMARY KEY,
    pipeline             text NOT NULL REFERENCES exactly_once.pipelines,
    dag_run_id           text NOT NULL,
    interval_start       timestamptz,
    interval_end         timestamptz,
    state                exactly_once.checkpoint_state NOT NULL DEFAULT 'planned',
    attempt              int NOT NULL DEFAULT 0,
    lease_until          timestamptz NOT NULL,
    precommitted_attempt int,
    staged               jsonb,          -- {"<sink>": {"rows": n, "checksum": "..."}} at pre-commit
    records              bigint,         -- Kafka records the pre-committed attempt read
    reason               text,           -- why it was last aborted or sent back to run again
    created_at           timestamptz NOT NULL DEFAULT now(),
    precommitted_at      timestamptz,
    committed_at         timestamptz,
    UNIQUE (pipeline, dag_run_id),
    CHECK (state <> 'precommitted' OR precommitted_attempt IS NOT NULL)
);
CREATE INDEX ON exactly_once.checkpoints (pipeline, state);

CREATE TYPE exactly_once.attempt_state AS ENUM ('running', 'precommitted', 'committed', 'aborted');

CREATE TABLE exactly_once.attempts (
    checkpoint_id bigint NOT NULL REFERENCES exactly_once.checkpoints,
    attempt       int    NOT NULL,
    state         exactly_once.attempt_state NOT NULL DEFAULT 'running',
    started_at    timestamptz NOT NULL DEFAULT now(),
    ended_at      timestamptz,
    reason        text,
    PRIMARY KEY (checkpoint_id, attempt)
);

-- The offset ranges frozen when a checkpoint begins: [from_offset, to_offset).
-- Live (unreleased) ranges of one pipeline never overlap, so no two checkpoints
-- can ever be planned to read the same record.
CREATE TABLE exactly_once.checkpoint_ranges (
    checkpoint_id bigint NOT NULL REFERENCES exactly_once.checkpoints,
    pipeline      text   NOT NULL,
    topic         text   NOT NULL,
    partition     int    NOT NULL,
    from_offset   bigint NOT NULL,
    to_offset     bigint NOT NULL,
    released      boolean NOT NULL DEFAULT false,   -- its checkpoint was aborted
    replanned_by  bigint REFERENCES exactly_once.checkpoints,
    PRIMARY KEY (checkpoint_id, topic, partition),
    CHECK (from_offset <= to_offset),
    CHECK (released OR replanned_by IS NULL),
    EXCLUDE USING gist (pipeline WITH =, topic WITH =, partition WITH =,
                        int8range(from_offset, to_offset) WITH &&) WHERE (NOT released)
);

-- What is committed. The database itself refuses any offset committed twice.
CREATE TABLE exactly_once.committed_ranges (
    pipeline      text   NOT NULL,
    topic         text   NOT NULL,
    partition     int    NOT NULL,
    from_offset   bigint NOT NULL,
    to_offset     bigint NOT NULL,
    checkpoint_id bigint NOT NULL REFERENCES exactly_once.checkpoints,
    committed_at  timestamptz NOT NULL DEFAULT now(),
    CHECK (from_offset < to_offset),
    EXCLUDE USING gist (pipeline WITH =, topic WITH =, partition WITH =,
                        int8range(from_offset, to_offset) WITH &&)
);

-- Offsets deleted by Kafka retention before they were read; recorded only for
-- pipelines that allow data loss. Committed ranges and gaps tile each partition.
CREATE TABLE exactly_once.gaps (
    pipeline      text   NOT NULL,
    topic         text   NOT NULL,
    partition     int    NOT NULL,
    from_offset   bigint NOT NULL,
    to_offset     bigint NOT NULL,
    checkpoint_id bigint NOT NULL REFERENCES exactly_once.checkpoints,
    recorded_at   timestamptz NOT NULL DEFAULT now(),
    CHECK (from_offset < to_offset),
    EXCLUDE USING gist (pipeline WITH =, topic WITH =, partition WITH =,
                        int8range(from_offset, to_offset) WITH &&)
);

-- Records that could not be parsed or did not fit the schema, committed with
-- the checkpoint that read them.
CREATE TABLE exactly_once.dead_letters (
    pipeline      text   NOT NULL,
    topic         text   NOT NULL,
    partition     int    NOT NULL,
    "offset"      bigint NOT NULL,
    key           bytea,
    value         bytea,
    reason        text   NOT NULL,
    checkpoint_id bigint NOT NULL REFERENCES exactly_once.checkpoints,
    committed_at  timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (pipeline, topic, partition, "offset")
);

-- Staging: rows written by an attempt, promoted by commit. Logged tables on
-- purpose: an unlogged table is emptied by a crash, and pre-committed rows must
-- survive one. Each sink gets a table like its final table plus these two
-- columns (created when the pipeline is registered).
CREATE TABLE exactly_once.staging_dead_letters (
    checkpoint_id bigint NOT NULL,
    attempt       int    NOT NULL,
    pipeline      text   NOT NULL,
    topic         text   NOT NULL,
    partition     int    NOT NULL,
    "offset"      bigint NOT NULL,
    key           bytea,
    value         bytea,
    reason        text   NOT NULL
);
CREATE INDEX ON exactly_once.staging_dead_letters (checkpoint_id, attempt);
