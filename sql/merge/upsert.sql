-- upsert: by key, the record with the highest offset wins, whatever order
-- checkpoints commit in (a key lives in one partition, so offsets compare;
-- the partition only breaks ties deterministically).
INSERT INTO {final} AS f ({columns})
SELECT DISTINCT ON ({keys}) {columns}
FROM {staging}
WHERE checkpoint_id = %(checkpoint_id)s AND attempt = %(attempt)s
ORDER BY {keys}, kafka_offset DESC, kafka_partition DESC
ON CONFLICT ({keys}) DO UPDATE SET {take_new}
WHERE (f.kafka_offset, f.kafka_partition) < (EXCLUDED.kafka_offset, EXCLUDED.kafka_partition)
