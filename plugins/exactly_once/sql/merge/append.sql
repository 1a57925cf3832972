-- append: one final row per Kafka record (plugins/exactly_once/sinks/append.py).

-- name: promote
-- The final table is unique on (kafka_topic, kafka_partition, kafka_offset): a record
-- promoted twice fails the commit rather than counting twice.
INSERT INTO {final} ({columns})
SELECT {columns}
FROM {staging}
WHERE checkpoint_id = %(checkpoint_id)s AND attempt = %(attempt)s

-- name: forget
-- A reprocessing takes back the final rows of every record in the replayed checkpoint's
-- ranges (found by the unique index on the coordinates), then promotes its own.
DELETE FROM {final} f
USING exactly_once.checkpoint_ranges r
WHERE r.checkpoint_id = %(slot)s AND f.kafka_topic = r.topic AND f.kafka_partition = r.partition
  AND f.kafka_offset >= r.from_offset AND f.kafka_offset < r.to_offset
