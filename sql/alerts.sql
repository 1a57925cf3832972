-- The alerts sent (plugins/exactly_once/orchestration/alerting.py), by name.

-- name: raise_alert
-- An alert for the event, unless one is open for it already: its id, or no row.
INSERT INTO exactly_once.alerts (pipeline, kind, subject, message)
VALUES (%(pipeline)s, %(kind)s, %(subject)s, %(message)s)
ON CONFLICT (pipeline, kind, subject) WHERE cleared_at IS NULL DO NOTHING
RETURNING id;

-- name: clear_ended
-- The open alerts of events that ended: the same event later is a new one.
UPDATE exactly_once.alerts SET cleared_at = now()
WHERE pipeline = %(pipeline)s AND cleared_at IS NULL AND NOT (kind || ':' || subject = ANY(%(current)s::text[]));
