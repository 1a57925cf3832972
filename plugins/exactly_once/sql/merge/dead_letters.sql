-- Bad records of a checkpoint, committed with its sinks.

-- name: promote
INSERT INTO exactly_once.dead_letters (pipeline, topic, partition, "offset", key, value, reason, checkpoint_id)
SELECT pipeline, topic, partition, "offset", key, value, reason, checkpoint_id
FROM exactly_once.staging_dead_letters
WHERE checkpoint_id = %(checkpoint_id)s AND attempt = %(attempt)s

-- name: forget
-- A reprocessing takes back the dead letters of the replayed checkpoint's ranges.
DELETE FROM exactly_once.dead_letters d
USING exactly_once.checkpoint_ranges r
WHERE r.checkpoint_id = %(slot)s AND d.pipeline = r.pipeline AND d.topic = r.topic
  AND d.partition = r.partition AND d."offset" >= r.from_offset AND d."offset" < r.to_offset
