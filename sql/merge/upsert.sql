-- upsert: by key, the newest record's row wins, whatever order checkpoints commit in. Newest
-- is highest in the sink's order (plugins/exactly_once/sinks/upsert.py, where Spark's fold
-- uses it too): (order_by, kafka_topic, kafka_partition, kafka_offset) with an order_by
-- column, else (kafka_offset, kafka_partition), which holds while each key lives in one
-- partition of one topic. {newest_first} is it descending; {held} and {new} are it of the
-- final row and of the row merged.

-- name: newest
-- Per key, the newest of {source}'s rows that {where} picks.
SELECT DISTINCT ON ({keys}) {columns}
FROM {source}
WHERE {where}
ORDER BY {keys}, {newest_first}

-- name: merge
INSERT INTO {final} AS f ({columns})
{newest}
ON CONFLICT ({keys}) DO UPDATE SET {take_new}
WHERE ({held}) < ({new})
