-- The pipelines view in Airflow's UI (plugins/exactly_once/operate/overview.py), by name;
-- read-only but for record_dag, which the first task of a run calls.

-- name: record_dag
UPDATE exactly_once.pipelines SET dag_id = %(dag_id)s
WHERE name = %(pipeline)s AND dag_id IS DISTINCT FROM %(dag_id)s;

-- name: pipeline_dags
SELECT name, dag_id FROM exactly_once.pipelines ORDER BY name;

-- name: reason_kind
-- A dead letter's kind of reason: its numbers of two digits or more (values of the record: a
-- price, a length, a timestamp) are one kind, but for a type's (as in numeric(12,2) or
-- varchar(255)), and its text is cut.
left(regexp_replace(reason, '\m([0-9]{2,}|[0-9]+\.[0-9]+)(\.[0-9]+)*\M(?![,)])', '#', 'g'), %(characters)s)

-- name: dead_letter_reasons
-- Dead letters per kind of reason, the most frequent kinds.
SELECT {reason_kind} AS kind, count(*)
FROM exactly_once.dead_letters
WHERE pipeline = %(pipeline)s
GROUP BY kind
ORDER BY count(*) DESC, kind
LIMIT %(limit)s;

-- name: newest_dead_letters
-- The newest dead letters, the first bytes of each value only (a value may be megabytes).
-- Unless the reader may see record values (payloads), no byte of the value and not the
-- reason itself but its kind.
SELECT topic, partition, "offset",
       CASE WHEN %(payloads)s THEN reason ELSE {reason_kind} END,
       checkpoint_id, committed_at,
       CASE WHEN %(payloads)s THEN substring(value FROM 1 FOR %(bytes)s) END,
       octet_length(value)
FROM exactly_once.dead_letters
WHERE pipeline = %(pipeline)s
ORDER BY committed_at DESC, topic, partition, "offset" DESC
LIMIT %(limit)s;
