-- The publisher's statements (plugins/exactly_once/publishing/publisher.py), by name.

-- name: published
SELECT checkpoint_id, position, epoch::text
FROM exactly_once.outbox_published
WHERE pipeline = %(pipeline)s AND sink = %(sink)s

-- name: epoch_at
SELECT epoch::text
FROM exactly_once.outbox
WHERE pipeline = %(pipeline)s AND sink = %(sink)s AND checkpoint_id = %(checkpoint_id)s AND position = %(position)s

-- name: held_behind
-- The pipeline's first open checkpoint: rows of checkpoints planned after it wait, so that
-- records of one key reach Kafka in the order their checkpoints were planned.
SELECT min(id)
FROM exactly_once.checkpoints
WHERE pipeline = %(pipeline)s AND state NOT IN ('committed', 'aborted')

-- name: next_rows
-- The rows to publish, in order, each as its Kafka record's parts: one key column's value
-- as text, several as a JSON array; the value as the row's JSON object.
SELECT checkpoint_id, position, epoch::text, replaces,
       CASE jsonb_array_length(key) WHEN 1 THEN key ->> 0 ELSE key::text END, record::text
FROM exactly_once.outbox
WHERE pipeline = %(pipeline)s AND sink = %(sink)s
  AND (checkpoint_id, position) > (%(checkpoint_id)s, %(position)s)
  AND checkpoint_id < %(held_behind)s
ORDER BY checkpoint_id, position

-- name: record_published
-- After Kafka's commit, and never backwards: a publisher fenced after its commit may
-- record it after its successor recorded more.
INSERT INTO exactly_once.outbox_published AS p (pipeline, sink, checkpoint_id, position, epoch, published_at)
VALUES (%(pipeline)s, %(sink)s, %(checkpoint_id)s, %(position)s, %(epoch)s, %(now)s)
ON CONFLICT (pipeline, sink) DO UPDATE
SET checkpoint_id = EXCLUDED.checkpoint_id, position = EXCLUDED.position, epoch = EXCLUDED.epoch,
    published_at = EXCLUDED.published_at
WHERE (p.checkpoint_id, p.position) < (EXCLUDED.checkpoint_id, EXCLUDED.position)

-- name: prune
DELETE FROM exactly_once.outbox
WHERE pipeline = %(pipeline)s AND sink = %(sink)s
  AND (checkpoint_id, position) <= (%(checkpoint_id)s, %(position)s)
