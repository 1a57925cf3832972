-- Read-only questions about pipelines (plugins/exactly_once/operate/status.py), by name.

-- name: pipelines
SELECT name FROM exactly_once.pipelines ORDER BY name;

-- name: pipelines_and_refused
-- With the pipelines whose runs were refused before they were ever registered (migration 0021).
SELECT name FROM exactly_once.pipelines
UNION
SELECT pipeline FROM exactly_once.refusals
ORDER BY 1;

-- name: checkpoints
-- The latest checkpoints (or only the open ones) with their ranges (a reprocessing's are
-- those of the checkpoint it replays), records, how long each phase took, and the
-- configuration version of the latest attempt.
SELECT c.id, c.dag_run_id, c.interval_start, c.interval_end, c.state::text, c.records,
       coalesce(jsonb_agg(jsonb_build_array(r.topic, r.partition, r.from_offset, r.to_offset)
                          ORDER BY r.topic, r.partition, r.from_offset) FILTER (WHERE r.topic IS NOT NULL), '[]'::jsonb),
       c.precommitted_at - c.created_at AS until_precommit,
       c.committed_at - coalesce(c.precommitted_at, c.created_at) AS until_commit,
       c.attempt, c.replays,
       (SELECT a.config_version FROM exactly_once.attempts a
        WHERE a.checkpoint_id = c.id ORDER BY a.attempt DESC LIMIT 1) AS config_version
FROM exactly_once.checkpoints c
LEFT JOIN exactly_once.checkpoint_ranges r
       ON r.checkpoint_id = coalesce(c.replays, c.id) AND r.to_offset > r.from_offset
WHERE c.pipeline = %(pipeline)s
  AND (NOT %(open_only)s OR c.state IN ('planned', 'running', 'stalled', 'precommitted'))
  AND c.dag_run_id <> 'exactly_once:retention-base'  -- no run's: what retention folded (sql/retention.sql)
GROUP BY c.id
ORDER BY c.id DESC
LIMIT %(limit)s;

-- name: last_committed
-- Of new records: a reprocessing replays an older checkpoint's.
SELECT id, dag_run_id, interval_end, committed_at, coalesce(records, 0)
FROM exactly_once.checkpoints
WHERE pipeline = %(pipeline)s AND state = 'committed' AND replays IS NULL
ORDER BY committed_at DESC, id DESC
LIMIT 1;

-- name: committed_ends
-- Per partition: where committed reading ends (the start offset before any commit),
-- counting only ranges below the frontier: records past it that backfill runs committed
-- still lie beyond unread ones, so the lag counts them too (an upper bound).
-- With the id of the topic the ledger's offsets are of (NULL: not recorded yet).
SELECT p.topic, p.partition, coalesce(max(c.to_offset), p.start_offset), p.topic_id
FROM exactly_once.partitions p
LEFT JOIN exactly_once.committed_ranges c
       ON c.pipeline = p.pipeline AND c.topic = p.topic AND c.partition = p.partition AND c.from_offset < p.frontier
WHERE p.pipeline = %(pipeline)s
GROUP BY p.topic, p.partition, p.start_offset, p.topic_id
ORDER BY p.topic, p.partition;

-- name: gaps
SELECT topic, partition, from_offset, to_offset, checkpoint_id, recorded_at
FROM exactly_once.gaps
WHERE pipeline = %(pipeline)s
ORDER BY topic, partition, from_offset;

-- name: stalled
-- Stalled checkpoints: their ranges, failed attempts, last error, since when, and whether at
-- commit (its pre-commit kept).
SELECT c.id, c.dag_run_id,
       coalesce((SELECT jsonb_agg(jsonb_build_array(r.topic, r.partition, r.from_offset, r.to_offset)
                                  ORDER BY r.topic, r.partition, r.from_offset)
                 FROM exactly_once.checkpoint_ranges r
                 WHERE r.checkpoint_id = coalesce(c.replays, c.id) AND r.to_offset > r.from_offset), '[]'::jsonb),
       (SELECT count(*) FROM exactly_once.attempts a WHERE a.checkpoint_id = c.id AND a.retryable IS NOT NULL),
       (SELECT max(a.ended_at) FROM exactly_once.attempts a WHERE a.checkpoint_id = c.id),
       c.reason, c.precommitted_attempt IS NOT NULL
FROM exactly_once.checkpoints c
WHERE c.pipeline = %(pipeline)s AND c.state = 'stalled'
ORDER BY c.id;

-- name: outbox_backlog
-- Per kafka sink of the pipeline with rows not published (plugins/exactly_once/publishing):
-- how many, the first checkpoint they are of, the last checkpoint published, and the last
-- checkpoint they are of (what they wait for: sql/outbox.sql, held_behind, beside it).
SELECT b.sink, b.records, b.first_checkpoint, p.checkpoint_id, p.published_at, b.last_checkpoint
FROM exactly_once.outbox_backlog b
LEFT JOIN exactly_once.outbox_published p ON p.pipeline = b.pipeline AND p.sink = b.sink
WHERE b.pipeline = %(pipeline)s
ORDER BY b.sink
