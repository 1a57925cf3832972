-- upsert: by key, the record with the highest offset wins, whatever order checkpoints
-- commit in (a key lives in one partition, so offsets compare; the partition only breaks
-- ties deterministically). plugins/exactly_once/sinks/upsert.py.

-- name: newest
-- Per key, the newest of {source}'s rows that {where} picks.
SELECT DISTINCT ON ({keys}) {columns}
FROM {source}
WHERE {where}
ORDER BY {keys}, kafka_offset DESC, kafka_partition DESC

-- name: merge
INSERT INTO {final} AS f ({columns})
{newest}
ON CONFLICT ({keys}) DO UPDATE SET {take_new}
WHERE (f.kafka_offset, f.kafka_partition) < (EXCLUDED.kafka_offset, EXCLUDED.kafka_partition)
