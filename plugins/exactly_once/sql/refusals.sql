-- Refusals that leave no checkpoint behind (plugins/exactly_once/ledger/run_refusals.py), and
-- the operator's way out of an output record Kafka refuses (plugins/exactly_once/operate/stalls.py), by name.

-- name: record
INSERT INTO exactly_once.refusals AS r (pipeline, kind, retryable, error, topic, checkpoint_id, position)
VALUES (%(pipeline)s, %(kind)s, %(retryable)s, %(error)s, %(topic)s, %(checkpoint_id)s, %(position)s)
ON CONFLICT (pipeline, kind) DO UPDATE
SET last_at = now(), count = r.count + 1, retryable = EXCLUDED.retryable, error = EXCLUDED.error,
    topic = EXCLUDED.topic, checkpoint_id = EXCLUDED.checkpoint_id, position = EXCLUDED.position

-- name: clear
DELETE FROM exactly_once.refusals WHERE pipeline = %(pipeline)s AND kind = %(kind)s

-- name: refusals
SELECT kind, first_at, last_at, count, retryable, error, topic, checkpoint_id, position
FROM exactly_once.refusals
WHERE pipeline = %(pipeline)s
ORDER BY kind <> 'begin', kind

-- name: refused_row
-- The row a sink's publishing is refused on, locked with its refusal (dead-letter-output).
SELECT r.error, r.topic, o.checkpoint_id, o.position
FROM exactly_once.refusals r
JOIN exactly_once.outbox o
  ON o.pipeline = r.pipeline AND o.sink = %(sink)s AND o.checkpoint_id = r.checkpoint_id AND o.position = r.position
WHERE r.pipeline = %(pipeline)s AND r.kind = %(kind)s
FOR UPDATE

-- name: dead_letter_output
-- The refused row moved out of the outbox into its dead letters, with Kafka's error and the operator's reason.
WITH moved AS (
    DELETE FROM exactly_once.outbox
    WHERE pipeline = %(pipeline)s AND sink = %(sink)s AND checkpoint_id = %(checkpoint_id)s AND position = %(position)s
    RETURNING *
)
INSERT INTO exactly_once.outbox_dead_letters (pipeline, sink, checkpoint_id, position, epoch, replaces, key, record,
                                              topic, error, reason)
SELECT pipeline, sink, checkpoint_id, position, epoch, replaces, key, record, %(topic)s, %(error)s, %(reason)s
FROM moved

-- name: record_output_action
INSERT INTO exactly_once.operator_actions (pipeline, action, checkpoint_id, reason)
VALUES (%(pipeline)s, 'dead_letter_output', %(checkpoint_id)s, %(what)s)

-- name: outbox_over
-- The kafka sinks of a pipeline whose outbox holds more than the bound of unpublished records.
SELECT sink, records FROM exactly_once.outbox_backlog
WHERE pipeline = %(pipeline)s AND records > %(bound)s
ORDER BY sink
