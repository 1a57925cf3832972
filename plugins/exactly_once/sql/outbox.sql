-- The publisher's statements (plugins/exactly_once/publishing/publisher.py), by name.

-- name: published
SELECT checkpoint_id, position, epoch::text
FROM exactly_once.outbox_published
WHERE pipeline = %(pipeline)s AND sink = %(sink)s

-- name: epoch_at
SELECT epoch::text
FROM exactly_once.outbox
WHERE pipeline = %(pipeline)s AND sink = %(sink)s AND checkpoint_id = %(checkpoint_id)s AND position = %(position)s

-- name: ranks
-- Frontier order (promise 11). An outbox row's rank is the first checkpoint that planned the
-- offsets it comes from: its own, unless it plans again a range an aborted checkpoint
-- released (then that one's, however often the range was planned again since). Rows go out
-- in the order (rank, checkpoint, position): a released range planned again takes the place
-- of the checkpoint that first planned it, before the offsets planned after it. A row of a
-- record-per-row sink has its record's coordinates, and the rank of its own offset; a row of
-- per-key folds (measures), the least of its checkpoint's ranges. A reprocessing plans no
-- range: the rank of its own id. Released ranges are few (aborts), and their live
-- successors are found through the ranges' exclusion index.
released AS MATERIALIZED (
    SELECT checkpoint_id, topic, partition, from_offset, to_offset, replanned_by
    FROM exactly_once.checkpoint_ranges
    WHERE pipeline = %(pipeline)s AND released AND from_offset < to_offset
), pieces AS MATERIALIZED (  -- live ranges' offsets an aborted checkpoint planned first
    SELECT own.checkpoint_id, r.topic, r.partition, greatest(own.from_offset, r.from_offset) AS from_offset,
           least(own.to_offset, r.to_offset) AS to_offset, r.checkpoint_id AS planned_by
    FROM released r
    JOIN exactly_once.checkpoint_ranges own
      ON own.pipeline = %(pipeline)s AND own.topic = r.topic AND own.partition = r.partition AND NOT own.released
     AND int8range(own.from_offset, own.to_offset) && int8range(r.from_offset, r.to_offset)
), ranked AS (
    SELECT o.*, least(o.checkpoint_id, (
               SELECT min(p.planned_by) FROM pieces p
               WHERE p.checkpoint_id = o.checkpoint_id
                 AND (o.record ->> 'kafka_offset' IS NULL
                      OR (p.topic = o.record ->> 'kafka_topic' AND p.partition = (o.record ->> 'kafka_partition')::int
                          AND (o.record ->> 'kafka_offset')::bigint >= p.from_offset
                          AND (o.record ->> 'kafka_offset')::bigint < p.to_offset)))) AS rank
    FROM exactly_once.outbox o
    WHERE o.pipeline = %(pipeline)s AND o.sink = %(sink)s
)

-- name: held_behind
-- What publishing waits for: the first, in frontier order, of the pipeline's work not
-- committed yet. An open checkpoint, ranked as its rows would be (the least of its ranges),
-- or a released range no checkpoint plans again (the rank of its first planner; NULL: any
-- checkpoint that will plan it). Rows ordered at or after it wait, so that a key's records
-- reach Kafka in the order of the offsets they come from, whatever order the checkpoints
-- that hold them commit or abort in.
WITH /* ranks */
SELECT rank, checkpoint_id FROM (
    SELECT least(c.id, min(p.planned_by)) AS rank, c.id AS checkpoint_id
    FROM exactly_once.checkpoints c
    LEFT JOIN pieces p ON p.checkpoint_id = c.id
    WHERE c.pipeline = %(pipeline)s AND c.state NOT IN ('committed', 'aborted')
    GROUP BY c.id
    UNION ALL
    SELECT (SELECT min(a.checkpoint_id) FROM released a
            WHERE a.topic = u.topic AND a.partition = u.partition
              AND a.from_offset < u.to_offset AND u.from_offset < a.to_offset), NULL
    FROM released u
    WHERE u.replanned_by IS NULL
) h
ORDER BY rank, checkpoint_id NULLS LAST
LIMIT 1

-- name: rank_of
-- An outbox row's rank: of the row while the outbox holds it, else of its checkpoint (the
-- least its rows can have: the row was pruned, and every row ordered before it).
WITH /* ranks */
SELECT coalesce((SELECT rank FROM ranked WHERE checkpoint_id = %(checkpoint_id)s AND position = %(position)s),
                least(%(checkpoint_id)s, (SELECT min(planned_by) FROM pieces WHERE checkpoint_id = %(checkpoint_id)s)))

-- name: next_rows
-- The rows to publish, in frontier order, each as its Kafka record's parts: one key column's
-- value as text, several as a JSON array; the value as the row's JSON object. The outbox
-- holds only rows not published (pruned up to Kafka's progress before this is read).
WITH /* ranks */
SELECT checkpoint_id, position, epoch::text, replaces,
       CASE jsonb_array_length(key) WHEN 1 THEN key ->> 0 ELSE key::text END, record::text, rank
FROM ranked
WHERE (rank, checkpoint_id) < (%(held_rank)s, %(held_checkpoint)s)
ORDER BY rank, checkpoint_id, position

-- name: record_published
-- After Kafka's commit, and never backwards: a publisher fenced after its commit may
-- record it after its successor recorded more (and pruned the row: it is not recorded).
WITH /* ranks */, at AS (
    SELECT rank, checkpoint_id, position FROM ranked
    WHERE checkpoint_id = %(checkpoint_id)s AND position = %(position)s AND epoch = %(epoch)s
)
INSERT INTO exactly_once.outbox_published AS p (pipeline, sink, checkpoint_id, position, epoch, published_at)
SELECT %(pipeline)s, %(sink)s, %(checkpoint_id)s, %(position)s, %(epoch)s::uuid, %(now)s
FROM at
ON CONFLICT (pipeline, sink) DO UPDATE
SET checkpoint_id = EXCLUDED.checkpoint_id, position = EXCLUDED.position, epoch = EXCLUDED.epoch,
    published_at = EXCLUDED.published_at
WHERE (p.checkpoint_id, p.position) <> (EXCLUDED.checkpoint_id, EXCLUDED.position)
  AND coalesce((SELECT (r.rank, r.checkpoint_id, r.position) < (a.rank, a.checkpoint_id, a.position)
                FROM ranked r, at a WHERE r.checkpoint_id = p.checkpoint_id AND r.position = p.position), true)

-- name: prune
-- The rows up to the one published last, in frontier order (none if it is pruned already).
WITH /* ranks */, at AS (
    SELECT rank, checkpoint_id, position FROM ranked
    WHERE checkpoint_id = %(checkpoint_id)s AND position = %(position)s
)
DELETE FROM exactly_once.outbox o
USING ranked r, at
WHERE o.pipeline = %(pipeline)s AND o.sink = %(sink)s
  AND (r.checkpoint_id, r.position) = (o.checkpoint_id, o.position)
  AND (r.rank, r.checkpoint_id, r.position) <= (at.rank, at.checkpoint_id, at.position)
