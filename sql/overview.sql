-- The pipelines view in Airflow's UI (plugins/exactly_once/operate/overview.py), by name;
-- read-only but for record_dag, which the first task of a run calls.

-- name: record_dag
UPDATE exactly_once.pipelines SET dag_id = %(dag_id)s
WHERE name = %(pipeline)s AND dag_id IS DISTINCT FROM %(dag_id)s;

-- name: pipeline_dags
SELECT name, dag_id FROM exactly_once.pipelines ORDER BY name;

-- name: dead_letter_reasons
-- Dead letters per kind of reason, the most frequent %(limit)s kinds: a reason's numbers
-- of two digits or more (values of the record: a price, a length, a timestamp) are one
-- kind (`#`), but for a type's (`numeric(12,2)`, `varchar(255)`), and its text is cut.
SELECT left(regexp_replace(reason, '\m([0-9]{2,}|[0-9]+\.[0-9]+)(\.[0-9]+)*\M(?![,)])', '#', 'g'), %(characters)s) AS kind, count(*)
FROM exactly_once.dead_letters
WHERE pipeline = %(pipeline)s
GROUP BY kind
ORDER BY count(*) DESC, kind
LIMIT %(limit)s;

-- name: newest_dead_letters
-- The newest dead letters, the first bytes of each value only (a value may be megabytes).
SELECT topic, partition, "offset", reason, checkpoint_id, committed_at, substring(value FROM 1 FOR %(bytes)s),
       octet_length(value)
FROM exactly_once.dead_letters
WHERE pipeline = %(pipeline)s
ORDER BY committed_at DESC, topic, partition, "offset" DESC
LIMIT %(limit)s;
