-- append: one final row per Kafka record. The final table is unique on
-- (kafka_topic, kafka_partition, kafka_offset): a record promoted twice fails
-- the commit rather than counting twice.
INSERT INTO {final} ({columns})
SELECT {columns}
FROM {staging}
WHERE checkpoint_id = %(checkpoint_id)s AND attempt = %(attempt)s
