-- Retention's steps (plugins/exactly_once/ledger/retention.py), by name. Each step is a short
-- transaction over at most %(batch)s checkpoints of one pipeline. Functions are called by
-- their pg_catalog names, as in sql/ledger.sql: the steps run as the ledger's owner.

-- name: may_prune
-- One step of a pipeline at a time (commit tasks of parallel runs each run one); a step that
-- finds another running does nothing and leaves the work to the next.
SELECT pg_catalog.pg_try_advisory_xact_lock(pg_catalog.hashtextextended('exactly_once:retention:' || %(pipeline)s, 0));

-- name: may_fold
-- A fold changes contributions a reprocessing's commit recomputes from, and ranges a plan
-- reads: it holds the pipeline's lock (what registration, planning, recovery and a
-- reprocessing's begin hold) and runs alone among the pipeline's commits, like a
-- reprocessing's commit (sql/ledger.sql), but waits for neither: false while either is held.
SELECT pg_catalog.pg_try_advisory_xact_lock(pg_catalog.hashtextextended('exactly_once:' || %(pipeline)s, 0))
   AND pg_catalog.pg_try_advisory_xact_lock(pg_catalog.hashtextextended('exactly_once:commit:' || %(pipeline)s, 0));

-- name: base
-- The pipeline's base checkpoint: what the checkpoints folded so far contributed, committed.
INSERT INTO exactly_once.checkpoints
    (pipeline, dag_run_id, state, lease_until, created_at, committed_at, contributions_kept, folded_at)
SELECT %(pipeline)s, 'exactly_once:retention-base', 'committed', %(now)s, %(now)s, NULL, true, %(now)s
WHERE NOT EXISTS (SELECT FROM exactly_once.checkpoints
                  WHERE pipeline = %(pipeline)s AND dag_run_id = 'exactly_once:retention-base' AND replays IS NULL);
SELECT id FROM exactly_once.checkpoints
WHERE pipeline = %(pipeline)s AND dag_run_id = 'exactly_once:retention-base' AND replays IS NULL;

-- name: foldable
-- The oldest committed checkpoints of new records beyond the horizon, but those a
-- reprocessing is open for: that one ends first, and they fold at a later step. With each,
-- whether a recompute could take its contribution back: it kept one (sql/ledger.sql,
-- contributions_not_kept), or it committed no offsets (an empty run, which keeps none).
SELECT k.id, k.contributions_kept OR NOT EXISTS (SELECT FROM exactly_once.committed_ranges c
                                                 WHERE c.checkpoint_id = k.id)
FROM exactly_once.checkpoints k
WHERE k.pipeline = %(pipeline)s AND k.state = 'committed' AND k.folded_at IS NULL AND k.replays IS NULL
  AND k.committed_at < %(horizon)s
  AND NOT EXISTS (SELECT FROM exactly_once.checkpoints r
                  WHERE r.replays = k.id AND r.state NOT IN ('committed', 'aborted'))
ORDER BY k.committed_at, k.id
LIMIT %(batch)s
FOR UPDATE OF k;

-- name: fold_ranges
-- The folded checkpoints' committed ranges, and the base's in the partitions they touch,
-- become the base's, those that touch merged: one range per partition where no other
-- checkpoint's range or a gap lies between.
CREATE TEMP TABLE folded_ranges ON COMMIT DROP AS
WITH touched AS (
    SELECT DISTINCT topic, partition FROM exactly_once.committed_ranges
    WHERE pipeline = %(pipeline)s AND checkpoint_id = ANY(%(folded)s)),
taken AS (
    DELETE FROM exactly_once.committed_ranges c
    USING touched t
    WHERE c.pipeline = %(pipeline)s AND c.topic = t.topic AND c.partition = t.partition
      AND (c.checkpoint_id = ANY(%(folded)s) OR c.checkpoint_id = %(base)s)
    RETURNING c.topic, c.partition, c.from_offset, c.to_offset, c.committed_at),
starts AS (
    SELECT *, from_offset IS DISTINCT FROM pg_catalog.lag(to_offset) OVER w AS starts
    FROM taken WINDOW w AS (PARTITION BY topic, partition ORDER BY from_offset)),
islands AS (
    SELECT *, pg_catalog.count(*) FILTER (WHERE starts) OVER (PARTITION BY topic, partition ORDER BY from_offset)
              AS island
    FROM starts)
SELECT topic, partition, pg_catalog.min(from_offset) AS from_offset, pg_catalog.max(to_offset) AS to_offset,
       pg_catalog.max(committed_at) AS committed_at
FROM islands GROUP BY topic, partition, island;
INSERT INTO exactly_once.committed_ranges (pipeline, topic, partition, from_offset, to_offset, checkpoint_id, committed_at)
SELECT %(pipeline)s, topic, partition, from_offset, to_offset, %(base)s, committed_at FROM pg_temp.folded_ranges;
-- Their gaps and dead letters, and those their reprocessings committed, are the base's.
CREATE TEMP TABLE folded_family ON COMMIT DROP AS
SELECT pg_catalog.unnest(%(folded)s::bigint[]) AS id
UNION ALL
SELECT id FROM exactly_once.checkpoints WHERE replays = ANY(%(folded)s);
UPDATE exactly_once.gaps SET checkpoint_id = %(base)s WHERE checkpoint_id IN (SELECT id FROM pg_temp.folded_family);
UPDATE exactly_once.dead_letters SET checkpoint_id = %(base)s
WHERE checkpoint_id IN (SELECT id FROM pg_temp.folded_family);

-- name: mark_folded
-- The base is committed as late as the newest checkpoint it holds, and keeps contributions
-- only while every checkpoint folded into it that committed offsets kept one (%(kept)s).
UPDATE exactly_once.checkpoints SET folded_at = %(now)s WHERE id = ANY(%(folded)s);
UPDATE exactly_once.checkpoints b
SET committed_at = GREATEST(b.committed_at, (SELECT pg_catalog.max(committed_at) FROM exactly_once.checkpoints
                                             WHERE id = ANY(%(folded)s))),
    contributions_kept = b.contributions_kept AND %(kept)s
WHERE b.id = %(base)s;

-- name: expired
-- Checkpoints beyond the history: folded ones whose frozen ranges the frontier has passed
-- (a backfill's beyond it keeps the next plan from taking its offsets), and aborted ones
-- whose released ranges were each planned again by a checkpoint folded since, holding no
-- gap or dead letter; each with its reprocessings, unless one of them (or, for an aborted
-- one, a checkpoint that planned its ranges again, which the outbox ranks by them) still has
-- rows in the outbox (the publisher has not published them).
WITH doomed AS (
    (SELECT k.id FROM exactly_once.checkpoints k
     WHERE k.pipeline = %(pipeline)s AND k.folded_at IS NOT NULL AND k.committed_at < %(cutoff)s
       AND k.dag_run_id <> 'exactly_once:retention-base'
       AND NOT EXISTS (SELECT FROM exactly_once.checkpoint_ranges r
                       JOIN exactly_once.partitions p USING (pipeline, topic, partition)
                       WHERE r.checkpoint_id = k.id AND r.to_offset > p.frontier)
     ORDER BY k.committed_at LIMIT %(batch)s)
    UNION
    (SELECT k.id FROM exactly_once.checkpoints k
     WHERE k.pipeline = %(pipeline)s AND k.state = 'aborted' AND k.created_at < %(cutoff)s
       AND NOT EXISTS (SELECT FROM exactly_once.checkpoint_ranges r
                       LEFT JOIN exactly_once.checkpoints n ON n.id = r.replanned_by
                       WHERE r.checkpoint_id = k.id AND r.released AND r.from_offset < r.to_offset
                         AND (n.folded_at IS NULL
                              OR EXISTS (SELECT FROM exactly_once.outbox o
                                         WHERE o.pipeline = %(pipeline)s AND o.checkpoint_id = n.id)))
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
-- Beyond the history: operator actions on no checkpoint, but a partition reset (its count
-- names the next reset's label, sql/ledger.sql reset_count) and an operator's dead-lettered
-- range that a checkpoint still in the ledger and not folded may read (its job, or its
-- reprocessing, sets those records aside by it); cleared alerts; preflights of versions but
-- the latest.
DELETE FROM exactly_once.operator_actions a
WHERE a.pipeline = %(pipeline)s AND a.acted_at < %(cutoff)s AND a.checkpoint_id IS NULL
  AND a.action <> 'reset_partition'
  AND (a.action <> 'dead_letter' OR (
        EXISTS (SELECT FROM exactly_once.partitions p
                WHERE p.pipeline = a.pipeline AND p.topic = a.topic AND p.partition = a.partition
                  AND p.frontier >= a.to_offset)
        AND NOT EXISTS (SELECT FROM exactly_once.checkpoint_ranges r
                        JOIN exactly_once.checkpoints k ON k.id = r.checkpoint_id
                        WHERE r.pipeline = a.pipeline AND r.topic = a.topic AND r.partition = a.partition
                          AND k.folded_at IS NULL
                          AND pg_catalog.int8range(r.from_offset, r.to_offset)
                              OPERATOR(pg_catalog.&&) pg_catalog.int8range(a.from_offset, a.to_offset))));
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
