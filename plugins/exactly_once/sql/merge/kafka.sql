-- kafka: a sink's rows published to a Kafka topic (plugins/exactly_once/sinks/kafka.py).

-- name: promote
-- Into the outbox, in the commit's transaction: the publisher moves them to Kafka in the
-- order of position. One random epoch per promotion, which Kafka's progress names with
-- the last row published (sql/migrations/0013_kafka_outbox.sql). Timestamps are written in
-- UTC, whatever the session's time zone: a key's bytes decide its partition.
SET LOCAL TimeZone = 'UTC';
WITH e AS MATERIALIZED (SELECT pg_catalog.gen_random_uuid() AS epoch)
INSERT INTO exactly_once.outbox (pipeline, sink, checkpoint_id, position, epoch, replaces, key, record)
SELECT {pipeline}, {sink}, %(checkpoint_id)s, pg_catalog.row_number() OVER (ORDER BY {order}), e.epoch,
       NULLIF(%(slot)s, %(checkpoint_id)s), pg_catalog.jsonb_build_array({keys}),
       pg_catalog.to_jsonb(s) - 'checkpoint_id' - 'attempt' - 'writer_task'
FROM {staging} s CROSS JOIN e
WHERE s.checkpoint_id = %(checkpoint_id)s AND s.attempt = %(attempt)s

-- name: forget
-- Kafka cannot take records back: a reprocessing takes back no row, and its records are
-- published again, each naming the checkpoint it replaces.
SELECT WHERE false
