-- Bad records of a checkpoint, committed with its sinks.

-- name: promote
-- Committed when the checkpoint is, by the ledger's clock: what their retention counts from.
INSERT INTO exactly_once.dead_letters (pipeline, topic, partition, "offset", key, value, reason, checkpoint_id,
                                       committed_at)
SELECT pipeline, topic, partition, "offset", key, value, reason, checkpoint_id, %(now)s
FROM exactly_once.staging_dead_letters
WHERE checkpoint_id = %(checkpoint_id)s AND attempt = %(attempt)s

-- name: forget
-- A reprocessing takes back the dead letters of the replayed checkpoint's ranges.
DELETE FROM exactly_once.dead_letters d
USING exactly_once.checkpoint_ranges r
WHERE r.checkpoint_id = %(slot)s AND d.pipeline = r.pipeline AND d.topic = r.topic
  AND d.partition = r.partition AND d."offset" >= r.from_offset AND d."offset" < r.to_offset
