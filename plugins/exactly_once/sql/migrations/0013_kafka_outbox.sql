-- The outbox of kafka sinks (plugins/exactly_once/sinks/kafka.py) and what the publisher
-- (plugins/exactly_once/publishing) has published of it.

-- A kafka sink's rows of committed checkpoints, promoted in the commit's transaction: the
-- PostgreSQL commit alone decides that they are published. A checkpoint's rows are
-- published in the order of position, checkpoints in the order of their ids. `epoch` is
-- the promotion's own random id: Kafka's progress names it with the last row published, so
-- a database restored from a backup, whose checkpoint ids come again with other rows, is
-- found out instead of skipped. Rows go once Kafka's progress is past them.
CREATE TABLE exactly_once.outbox (
    pipeline      text   NOT NULL REFERENCES exactly_once.pipelines (name),
    sink          text   NOT NULL,
    checkpoint_id bigint NOT NULL,
    position      bigint NOT NULL,
    epoch         uuid   NOT NULL,
    replaces      bigint,           -- the checkpoint a reprocessing publishes again
    key           jsonb  NOT NULL,  -- the key columns' values, in the sink's key order
    record        jsonb  NOT NULL,  -- the row: column -> value
    PRIMARY KEY (pipeline, sink, checkpoint_id, position)
);

-- Per kafka sink, the last outbox row Kafka's progress says is published, as this database
-- last learned it. The progress itself is in Kafka, written in the transaction of the
-- records; this row follows it after Kafka's commit.
CREATE TABLE exactly_once.outbox_published (
    pipeline      text   NOT NULL REFERENCES exactly_once.pipelines (name),
    sink          text   NOT NULL,
    checkpoint_id bigint NOT NULL,
    position      bigint NOT NULL,
    epoch         uuid   NOT NULL,
    published_at  timestamptz NOT NULL,
    PRIMARY KEY (pipeline, sink)
);

-- What status and the view read of the outbox: counts, no values. A view runs with its
-- owner's rights, so the read role sees no record.
CREATE VIEW exactly_once.outbox_backlog AS
SELECT pipeline, sink, count(*) AS records, min(checkpoint_id) AS first_checkpoint,
       max(checkpoint_id) AS last_checkpoint
FROM exactly_once.outbox
GROUP BY pipeline, sink;
GRANT SELECT ON exactly_once.outbox_published, exactly_once.outbox_backlog TO exactly_once_read;
