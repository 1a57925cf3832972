-- What the metrics endpoint exports (plugins/exactly_once/operate/metrics.py), by name;
-- read-only, every statement for the pipelines asked for at once (all of them for null).

-- name: last_checkpoints
-- Each pipeline's last committed checkpoint of new records: what it read, and the rows it
-- staged per sink (the dead letters under their staging key).
SELECT DISTINCT ON (pipeline) pipeline, coalesce(records, 0), coalesce(staged, '{}'::jsonb)
FROM exactly_once.checkpoints
WHERE state = 'committed' AND replays IS NULL AND precommitted_attempt IS NOT NULL
  AND (%(pipelines)s::text[] IS NULL OR pipeline = ANY(%(pipelines)s))
ORDER BY pipeline, committed_at DESC, id DESC;

-- name: phases
-- Per pipeline and phase, over its committed checkpoints: how many took at most each bound
-- (a histogram's cumulative buckets, in the bounds' order), how many in all, and their sum.
WITH seconds AS (
    SELECT c.pipeline, p.key AS phase, p.value::float8 AS seconds
    FROM exactly_once.checkpoints c, jsonb_each_text(c.phase_seconds) p
    WHERE c.state = 'committed' AND (%(pipelines)s::text[] IS NULL OR c.pipeline = ANY(%(pipelines)s))),
buckets AS (
    SELECT s.pipeline, s.phase, b.bound, count(*) FILTER (WHERE s.seconds <= b.bound) AS n
    FROM seconds s, unnest(%(bounds)s::float8[]) b(bound)
    GROUP BY 1, 2, 3),
totals AS (
    SELECT pipeline, phase, count(*) AS n, sum(seconds) AS seconds FROM seconds GROUP BY 1, 2)
SELECT b.pipeline, b.phase, array_agg(b.n ORDER BY b.bound), t.n, t.seconds
FROM buckets b JOIN totals t USING (pipeline, phase)
GROUP BY b.pipeline, b.phase, t.n, t.seconds
ORDER BY 1, 2;

-- name: attempts
-- Attempts per pipeline and state.
SELECT c.pipeline, a.state::text, count(*)
FROM exactly_once.attempts a
JOIN exactly_once.checkpoints c ON c.id = a.checkpoint_id
WHERE %(pipelines)s::text[] IS NULL OR c.pipeline = ANY(%(pipelines)s)
GROUP BY 1, 2
ORDER BY 1, 2;

-- name: open_checkpoints
-- Open checkpoints per pipeline and state.
SELECT pipeline, state::text, count(*)
FROM exactly_once.checkpoints
WHERE state IN ('planned', 'running', 'precommitted', 'stalled')
  AND (%(pipelines)s::text[] IS NULL OR pipeline = ANY(%(pipelines)s))
GROUP BY 1, 2
ORDER BY 1, 2;

-- name: dead_letters
-- Committed dead letters per pipeline and class of reason: the first words of the reasons the
-- pipeline writes (exactly_once.spark, exactly_once.operate.stalls), a bounded set of labels.
SELECT pipeline,
       CASE WHEN reason LIKE 'sink %%' THEN 'sink_refused'
            WHEN reason LIKE 'transform %%' THEN 'transform'
            WHEN reason LIKE 'dead-lettered by an operator%%' THEN 'operator'
            WHEN reason LIKE 'record of %% bytes%%' THEN 'too_large'
            WHEN reason LIKE 'value is null%%' THEN 'tombstone'
            WHEN reason LIKE '%%does not fit the schema%%' THEN 'schema'
            WHEN reason LIKE 'value%%' OR reason LIKE 'key%%' THEN 'format'
            ELSE 'other' END AS class,
       count(*)
FROM exactly_once.dead_letters
WHERE %(pipelines)s::text[] IS NULL OR pipeline = ANY(%(pipelines)s)
GROUP BY 1, 2
ORDER BY 1, 2;
