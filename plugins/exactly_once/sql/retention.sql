-- Retention's steps (plugins/exactly_once/ledger/retention.py), by name. Each step is a short
-- transaction over at most %(batch)s checkpoints of one pipeline.

-- name: may_fold
-- A fold changes contributions a reprocessing's commit recomputes from: it runs alone among
-- the pipeline's commits, like that commit (sql/ledger.sql, lock_commits_alone), but never
-- waits for one: false while a commit runs, and the fold waits for the next step.
SELECT pg_catalog.pg_try_advisory_xact_lock(pg_catalog.hashtextextended('exactly_once:commit:' || %(pipeline)s, 0));

-- name: base
-- The pipeline's base checkpoint: what the checkpoints folded so far contributed, committed.
INSERT INTO exactly_once.checkpoints
    (pipeline, dag_run_id, state, lease_until, created_at, committed_at, contributions_kept, folded_at)
VALUES (%(pipeline)s, 'exactly_once:retention-base', 'committed', %(now)s, %(now)s, NULL, true, %(now)s)
ON CONFLICT (pipeline, dag_run_id) WHERE replays IS NULL DO NOTHING;
SELECT id FROM exactly_once.checkpoints
WHERE pipeline = %(pipeline)s AND dag_run_id = 'exactly_once:retention-base' AND replays IS NULL;

-- name: foldable
-- The oldest committed checkpoints of new records beyond the horizon, but those a
-- reprocessing is open for: that one commits first, and they fold at a later step.
SELECT k.id FROM exactly_once.checkpoints k
WHERE k.pipeline = %(pipeline)s AND k.state = 'committed' AND k.folded_at IS NULL AND k.replays IS NULL
  AND k.committed_at < %(horizon)s
  AND NOT EXISTS (SELECT FROM exactly_once.checkpoints r
                  WHERE r.replays = k.id AND r.state NOT IN ('committed', 'aborted'))
ORDER BY k.committed_at, k.id
LIMIT %(batch)s
FOR UPDATE OF k;

-- name: fold_ranges
-- The folded checkpoints' committed ranges and the base's become the base's, those that touch
-- merged: one range per partition where no other checkpoint's range or a gap lies between.
CREATE TEMP TABLE folded_ranges ON COMMIT DROP AS
WITH taken AS (
    DELETE FROM exactly_once.committed_ranges
    WHERE pipeline = %(pipeline)s AND (checkpoint_id = ANY(%(folded)s) OR checkpoint_id = %(base)s)
    RETURNING topic, partition, from_offset, to_offset, committed_at),
islands AS (
    SELECT *, count(*) FILTER (WHERE starts) OVER (PARTITION BY topic, partition ORDER BY from_offset) AS island
    FROM (SELECT *, from_offset IS DISTINCT FROM lag(to_offset) OVER (PARTITION BY topic, partition
                                                                        ORDER BY from_offset) AS starts
          FROM taken) t)
SELECT topic, partition, min(from_offset) AS from_offset, max(to_offset) AS to_offset,
       max(committed_at) AS committed_at
FROM islands GROUP BY topic, partition, island;
INSERT INTO exactly_once.committed_ranges (pipeline, topic, partition, from_offset, to_offset, checkpoint_id, committed_at)
SELECT %(pipeline)s, topic, partition, from_offset, to_offset, %(base)s, committed_at FROM pg_temp.folded_ranges;
-- Their gaps and dead letters, and those their reprocessings committed, are the base's.
CREATE TEMP TABLE folded_family ON COMMIT DROP AS
SELECT unnest(%(folded)s::bigint[]) AS id
UNION ALL
SELECT id FROM exactly_once.checkpoints WHERE replays = ANY(%(folded)s);
UPDATE exactly_once.gaps SET checkpoint_id = %(base)s WHERE checkpoint_id IN (SELECT id FROM pg_temp.folded_family);
UPDATE exactly_once.dead_letters SET checkpoint_id = %(base)s
WHERE checkpoint_id IN (SELECT id FROM pg_temp.folded_family);

-- name: mark_folded
-- The base is committed as late as the newest checkpoint it holds, and keeps contributions
-- only if every checkpoint folded into it did (a reprocessing is refused otherwise: see
-- contributions_not_kept in sql/ledger.sql).
UPDATE exactly_once.checkpoints SET folded_at = %(now)s WHERE id = ANY(%(folded)s);
UPDATE exactly_once.checkpoints b
SET committed_at = greatest(b.committed_at, f.committed_at),
    contributions_kept = b.contributions_kept AND f.kept
FROM (SELECT max(committed_at) AS committed_at, bool_and(contributions_kept) AS kept
      FROM exactly_once.checkpoints WHERE id = ANY(%(folded)s)) f
WHERE b.id = %(base)s;

-- name: expired
-- Checkpoints beyond the history: folded ones, and aborted ones whose released ranges were
-- planned again and that hold nothing the ledger still needs; each with its reprocessings,
-- unless one of them still has rows in the outbox (the publisher has not published them).
WITH doomed AS (
    (SELECT k.id FROM exactly_once.checkpoints k
     WHERE k.pipeline = %(pipeline)s AND k.folded_at IS NOT NULL AND k.committed_at < %(cutoff)s
       AND k.dag_run_id <> 'exactly_once:retention-base'
     ORDER BY k.committed_at LIMIT %(batch)s)
    UNION
    (SELECT k.id FROM exactly_once.checkpoints k
     WHERE k.pipeline = %(pipeline)s AND k.state = 'aborted' AND k.created_at < %(cutoff)s
       AND NOT EXISTS (SELECT FROM exactly_once.checkpoint_ranges r
                       WHERE r.checkpoint_id = k.id AND r.released AND r.replanned_by IS NULL
                         AND r.from_offset < r.to_offset)
       AND NOT EXISTS (SELECT FROM exactly_once.gaps g WHERE g.checkpoint_id = k.id)
       AND NOT EXISTS (SELECT FROM exactly_once.dead_letters d WHERE d.checkpoint_id = k.id)
     ORDER BY k.created_at LIMIT %(batch)s)),
family AS (
    SELECT d.id AS root, d.id FROM doomed d
    UNION
    SELECT d.id, r.id FROM exactly_once.checkpoints r JOIN doomed d ON r.replays = d.id)
SELECT DISTINCT f.id FROM family f
WHERE f.root NOT IN (SELECT g.root FROM family g
                     JOIN exactly_once.outbox o ON o.pipeline = %(pipeline)s AND o.checkpoint_id = g.id);

-- name: delete_checkpoints
-- What refers to them goes with them: attempts, frozen ranges (and the released ranges they
-- planned again, whose own checkpoints are older still), operator actions on them.
DELETE FROM exactly_once.checkpoint_ranges WHERE checkpoint_id = ANY(%(ids)s) OR replanned_by = ANY(%(ids)s);
DELETE FROM exactly_once.attempts WHERE checkpoint_id = ANY(%(ids)s);
DELETE FROM exactly_once.operator_actions WHERE checkpoint_id = ANY(%(ids)s);
DELETE FROM exactly_once.checkpoints WHERE id = ANY(%(ids)s);

-- name: delete_history
-- Beyond the history: operator actions on no checkpoint (an operator's dead-lettered range
-- once every offset of it is planned), cleared alerts, preflights passed.
DELETE FROM exactly_once.operator_actions a
WHERE a.pipeline = %(pipeline)s AND a.acted_at < %(cutoff)s AND a.checkpoint_id IS NULL
  AND (a.action <> 'dead_letter' OR EXISTS (
        SELECT FROM exactly_once.partitions p
        WHERE p.pipeline = a.pipeline AND p.topic = a.topic AND p.partition = a.partition
          AND p.frontier >= a.to_offset));
DELETE FROM exactly_once.alerts
WHERE pipeline = %(pipeline)s AND cleared_at < %(cutoff)s;
DELETE FROM exactly_once.preflights p
WHERE p.pipeline = %(pipeline)s AND p.passed_at < %(cutoff)s
  AND p.config_version IS DISTINCT FROM (SELECT v.version FROM exactly_once.config_versions v
                                         WHERE v.pipeline = p.pipeline ORDER BY v.registered_at DESC LIMIT 1);

-- name: delete_dead_letters
-- The oldest committed dead letters beyond their retention, %(rows)s at most.
DELETE FROM exactly_once.dead_letters
WHERE (pipeline, topic, partition, "offset") IN (
    SELECT pipeline, topic, partition, "offset" FROM exactly_once.dead_letters
    WHERE pipeline = %(pipeline)s AND committed_at < %(cutoff)s
    ORDER BY committed_at LIMIT %(rows)s);

-- name: age
-- When a checkpoint was committed, and whether it is folded (the base is, from the start).
SELECT committed_at, folded_at IS NOT NULL FROM exactly_once.checkpoints WHERE id = %(checkpoint_id)s;
