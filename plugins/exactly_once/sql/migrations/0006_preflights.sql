-- The configuration versions whose preflight passed (exactly_once.operate.preflight): the first task
-- of a run checks a pipeline once per version, not on every run. A version is a hash of the
-- configuration and of its transform module's source (exactly_once.ledger.versions).
CREATE TABLE exactly_once.preflights (
    pipeline       text NOT NULL,
    config_version text NOT NULL,
    passed_at      timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (pipeline, config_version)
);
