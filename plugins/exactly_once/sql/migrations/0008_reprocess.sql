-- Reprocessing a committed checkpoint with today's configuration (promise 10), and the
-- configuration each attempt ran with.

-- Every configuration a pipeline was registered with, by version (exactly_once.ledger.versions:
-- a hash of the configuration, its transform module's source and the library's version).
-- An attempt runs the version the task that started it registered, whatever is registered later.
-- json, not jsonb: the configuration is read back with its fields in order (as in 0002).
CREATE TABLE exactly_once.config_versions (
    pipeline      text NOT NULL REFERENCES exactly_once.pipelines,
    version       text NOT NULL,
    config        json NOT NULL,
    registered_at timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (pipeline, version)
);
ALTER TABLE exactly_once.attempts ADD COLUMN config_version text;

-- A reprocessing is a checkpoint of its own that `replays` a committed one: it reads the
-- replayed checkpoint's frozen ranges (it has none of its own, so it holds no offsets) and
-- goes through the same states, attempts and fencing; its commit replaces the replayed
-- checkpoint's contribution to every sink and records in `replaced` the rows taken back and
-- put in per sink. A run has one checkpoint of its own; its reprocessings carry its run id too.
ALTER TABLE exactly_once.checkpoints ADD COLUMN replays bigint REFERENCES exactly_once.checkpoints;
ALTER TABLE exactly_once.checkpoints ADD COLUMN replaced jsonb;
ALTER TABLE exactly_once.checkpoints DROP CONSTRAINT checkpoints_pipeline_dag_run_id_key;
CREATE UNIQUE INDEX checkpoint_of_run ON exactly_once.checkpoints (pipeline, dag_run_id) WHERE replays IS NULL;
-- One reprocessing of a checkpoint at a time: the latest committed one is its contribution.
-- (Open states named by what they are not: 'stalled' is added in this same transaction on a
-- new database, and PostgreSQL refuses a new enum value before it is committed.)
CREATE UNIQUE INDEX one_open_reprocessing ON exactly_once.checkpoints (replays)
    WHERE replays IS NOT NULL AND state NOT IN ('committed', 'aborted');

-- Whether the checkpoint's commit kept its contribution to the upsert and aggregate sinks
-- (their `ctb_` tables), which a reprocessing recomputes the keys it touches from. Those
-- committed before this migration did not: the pipeline's upsert and aggregate sinks cannot
-- be reprocessed exactly while one of them holds records.
ALTER TABLE exactly_once.checkpoints ADD COLUMN contributions_kept boolean NOT NULL DEFAULT false;
