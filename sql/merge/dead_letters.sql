-- Bad records of the checkpoint, committed with its sinks.
INSERT INTO exactly_once.dead_letters (pipeline, topic, partition, "offset", key, value, reason, checkpoint_id)
SELECT pipeline, topic, partition, "offset", key, value, reason, checkpoint_id
FROM exactly_once.staging_dead_letters
WHERE checkpoint_id = %(checkpoint_id)s AND attempt = %(attempt)s
