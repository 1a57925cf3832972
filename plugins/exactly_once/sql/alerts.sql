-- The alerts sent (plugins/exactly_once/orchestration/alerting.py), by name.

-- name: raise_alert
-- The alert of an event its notifier sent, unless one is open for it already: its id, or no row.
INSERT INTO exactly_once.alerts (pipeline, kind, subject, message)
VALUES (%(pipeline)s, %(kind)s, %(subject)s, %(message)s)
ON CONFLICT (pipeline, kind, subject) WHERE cleared_at IS NULL DO NOTHING
RETURNING id;

-- name: clear_ended
-- The open alerts of events that ended: the same event later is a new one.
UPDATE exactly_once.alerts SET cleared_at = now()
WHERE pipeline = %(pipeline)s AND cleared_at IS NULL AND NOT (kind || ':' || subject = ANY(%(current)s::text[]));

-- name: claim_alert
-- This session's hold on sending the event's alert, unless another task holds it (false):
-- a session lock, so a task that dies while its notifier runs releases it with its connection.
SELECT pg_catalog.pg_try_advisory_lock(
    pg_catalog.hashtextextended('exactly_once:alert:' || %(pipeline)s || ':' || %(kind)s || ':' || %(subject)s, 0));

-- name: release_alert
SELECT pg_catalog.pg_advisory_unlock(
    pg_catalog.hashtextextended('exactly_once:alert:' || %(pipeline)s || ':' || %(kind)s || ':' || %(subject)s, 0));

-- name: alerted
-- Whether the event has an open alert (one was sent).
SELECT EXISTS (SELECT FROM exactly_once.alerts WHERE pipeline = %(pipeline)s AND kind = %(kind)s
               AND subject = %(subject)s AND cleared_at IS NULL);
