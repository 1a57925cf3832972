-- The ledger's invariants (plugins/exactly_once/ledger/invariants.py), by name. Each
-- statement returns one line per violation; none means the invariant holds.
-- They hold whenever no run is between its steps: after a run, or after recovery.

-- name: committed_ranges_overlap
-- No offset committed twice (the exclusion constraint refuses it; this says so if it ever went).
SELECT format('%%s[%%s]: committed %%s..%%s (checkpoint %%s) overlaps %%s..%%s (checkpoint %%s)',
              a.topic, a.partition, a.from_offset, a.to_offset, a.checkpoint_id,
              b.from_offset, b.to_offset, b.checkpoint_id)
FROM exactly_once.committed_ranges a
JOIN exactly_once.committed_ranges b
  ON b.pipeline = a.pipeline AND b.topic = a.topic AND b.partition = a.partition
 AND (b.from_offset, b.checkpoint_id) > (a.from_offset, a.checkpoint_id)
 AND int8range(a.from_offset, a.to_offset) && int8range(b.from_offset, b.to_offset)
WHERE a.pipeline = %(pipeline)s;

-- name: committed_ranges_not_contiguous
-- Committed ranges and recorded gaps tile each partition from the pipeline's start offset
-- up to its frontier. Beyond it lie ranges of backfill runs, each its interval's (and
-- released ranges planned again); the next run that is not a backfill takes what lies between.
-- Below it, a hole is allowed only while live ranges hold every offset of it: parallel runs
-- commit in any order, so a later checkpoint commits while an earlier one is still open.
WITH pieces AS (
    SELECT topic, partition, from_offset, to_offset, 'checkpoint ' || checkpoint_id AS what
    FROM exactly_once.committed_ranges WHERE pipeline = %(pipeline)s
    UNION ALL
    SELECT topic, partition, from_offset, to_offset, 'gap of checkpoint ' || checkpoint_id
    FROM exactly_once.gaps WHERE pipeline = %(pipeline)s
), ordered AS (
    SELECT p.*, lag(to_offset) OVER (PARTITION BY topic, partition ORDER BY from_offset) AS previous_end
    FROM pieces p
)
SELECT format('%%s[%%s]: %%s starts at %%s, but the committed offsets before it end at %%s',
              o.topic, o.partition, o.what, o.from_offset, coalesce(o.previous_end, s.start_offset))
FROM ordered o
JOIN exactly_once.partitions s ON s.pipeline = %(pipeline)s AND s.topic = o.topic AND s.partition = o.partition
WHERE o.from_offset < s.frontier AND o.from_offset <> coalesce(o.previous_end, s.start_offset)
  AND NOT coalesce((
      SELECT range_agg(int8range(r.from_offset, r.to_offset))
      FROM exactly_once.checkpoint_ranges r
      JOIN exactly_once.checkpoints k ON k.id = r.checkpoint_id
      WHERE r.pipeline = %(pipeline)s AND r.topic = o.topic AND r.partition = o.partition
        AND (k.state IN ('planned', 'running', 'stalled', 'precommitted') OR (r.released AND r.replanned_by IS NULL))
  ) @> int8range(coalesce(o.previous_end, s.start_offset), o.from_offset), false);

-- name: planned_offsets_stranded
-- Every planned offset is committed, a recorded gap, or still owned by an open
-- checkpoint (or a released range waiting to be planned again).
WITH committed_end AS (
    SELECT s.topic, s.partition, s.frontier,
           greatest(s.start_offset, max(c.to_offset), max(g.to_offset)) AS covered
    FROM exactly_once.partitions s
    LEFT JOIN exactly_once.committed_ranges c
           ON c.pipeline = s.pipeline AND c.topic = s.topic AND c.partition = s.partition
          AND c.from_offset < s.frontier
    LEFT JOIN exactly_once.gaps g
           ON g.pipeline = s.pipeline AND g.topic = s.topic AND g.partition = s.partition
          AND g.from_offset < s.frontier
    WHERE s.pipeline = %(pipeline)s
    GROUP BY s.topic, s.partition, s.frontier, s.start_offset
)
SELECT format('%%s[%%s]: offsets %%s..%%s were planned but are neither committed nor held by an open checkpoint',
              e.topic, e.partition, e.covered, e.frontier)
FROM committed_end e
WHERE e.covered < e.frontier
  AND NOT EXISTS (
      SELECT 1
      FROM exactly_once.checkpoint_ranges r
      JOIN exactly_once.checkpoints k ON k.id = r.checkpoint_id
      WHERE r.pipeline = %(pipeline)s AND r.topic = e.topic AND r.partition = e.partition
        AND r.to_offset > r.from_offset
        AND (k.state IN ('planned', 'running', 'stalled', 'precommitted') OR (r.released AND r.replanned_by IS NULL)));

-- name: precommitted_left_behind
-- Every run's recovery commits what is pre-committed, so a checkpoint begun after
-- another's pre-commit leaves none behind. (The retention base is no run's: a fold creates
-- it, with no recovery before.)
SELECT format('checkpoint %%s is still pre-committed (since %%s), but checkpoint %%s began after it',
              p.id, p.precommitted_at, max(later.id))
FROM exactly_once.checkpoints p
JOIN exactly_once.checkpoints later
  ON later.pipeline = p.pipeline AND later.created_at > p.precommitted_at
     AND later.dag_run_id <> 'exactly_once:retention-base'
WHERE p.pipeline = %(pipeline)s AND p.state = 'precommitted'
GROUP BY p.id, p.precommitted_at;

-- name: staging_left_behind
-- {staging}: one sink's staging table. Rows belong only to a running checkpoint's
-- current attempt (or its probes, tagged with its negative) or to a pre-committed one;
-- anything else was not cleaned up.
SELECT format('%%s: %%s rows of checkpoint %%s attempt %%s left behind (checkpoint %%s, current attempt %%s)',
              %(sink)s, count(*), s.checkpoint_id, s.attempt, k.state, k.attempt)
FROM {staging} s
JOIN exactly_once.checkpoints k ON k.id = s.checkpoint_id
WHERE k.pipeline = %(pipeline)s
  AND NOT (k.state = 'running' AND abs(s.attempt) = k.attempt)
  AND NOT (k.state IN ('precommitted', 'stalled') AND s.attempt = coalesce(k.precommitted_attempt, 0))
GROUP BY s.checkpoint_id, s.attempt, k.state, k.attempt;
