-- upsert: by key, the newest record's row wins, whatever order checkpoints commit in. Newest
-- is highest in the sink's order (plugins/exactly_once/sinks/upsert.py, where Spark's fold
-- uses it too): (order_by, kafka_topic, kafka_partition, kafka_offset) with an order_by
-- column, else (kafka_offset, kafka_partition), which holds while each key lives in one
-- partition of one topic. {newest_first} is it descending; {held}, {new}, {staged} and
-- {kept} are it of the final row, of the row merged, of a staged row and of a contribution.
--
-- A sink ordered by offset takes tombstones too (staged rows with kafka_tombstone true), and so
-- does one ordered by a change feed's position (its delete events, sinks/upsert.py): the
-- final table holds, per key, the newest record of all committed checkpoints, and no row
-- when that record is a tombstone. Checkpoints commit in any order, so a deleted key leaves
-- no row to compare with: its tombstone stays in the contributions table (`keep` in
-- keyed.sql keeps it with the checkpoint's other newest rows), which is what tells an older
-- record committed later that it comes too late.

-- name: newest
-- Per key, the newest of the source's rows that the condition picks (and whether it is a tombstone,
-- for a sink that takes them: its columns then end with kafka_tombstone).
SELECT DISTINCT ON ({keys}) {columns}
FROM {source}
WHERE {where}
ORDER BY {keys}, {newest_first}

-- name: merge
-- A pipeline whose records do not delete: no staged row is a tombstone (the fold may still
-- carry the kafka_tombstone mark, false).
INSERT INTO {final} AS f ({columns})
SELECT {columns} FROM ({newest}) AS n
ON CONFLICT ({keys}) DO UPDATE SET {take_new}
WHERE ({held}) < ({new})

-- name: merge_with_tombstones
-- A pipeline whose records delete (tombstones, or a change feed's delete events). The
-- checkpoint's newest row or tombstone per key is kept for the three statements that read it. They name it pg_temp.newest_staged, and the functions
-- they call pg_catalog.'s: trial_promote runs them with the ledger owner's rights (search
-- path pinned, sql/migrations/0018_definers_pinned_search_path.sql), the commit with the
-- commit role's search path, and neither may reach an object another role made.
DROP TABLE IF EXISTS pg_temp.newest_staged;
CREATE TEMP TABLE newest_staged ON COMMIT DROP AS {newest};
-- Commits of a pipeline run side by side, and a key a tombstone deletes leaves no row that
-- a concurrent commit's INSERT of an older record would conflict with, nor is the tombstone
-- visible to that commit before it commits. So a commit that carries tombstones for this
-- final table runs alone among those that merge into it; the others still run side by side,
-- and each statement after the lock sees what the commits before it committed.
SELECT pg_catalog.pg_advisory_xact_lock(pg_catalog.hashtextextended({lock}, 0))
WHERE EXISTS (SELECT FROM pg_temp.newest_staged WHERE kafka_tombstone);
SELECT pg_catalog.pg_advisory_xact_lock_shared(pg_catalog.hashtextextended({lock}, 0))
WHERE NOT EXISTS (SELECT FROM pg_temp.newest_staged WHERE kafka_tombstone);
-- A tombstone deletes an older row of its key; a newer row stays (that record came later).
DELETE FROM {final} f
USING pg_temp.newest_staged n
WHERE n.kafka_tombstone AND {same_keys} AND ({held}) < ({staged});
-- A change feed's truncate (source.on_truncate truncate) is a tombstone of no key: the newest
-- of those committed and this checkpoint's is the truncation. This checkpoint's deletes every
-- row older than it (those of a checkpoint committed before went when it committed).
DROP TABLE IF EXISTS pg_temp.truncation;
CREATE TEMP TABLE truncation ON COMMIT DROP AS
SELECT * FROM (SELECT {columns} FROM {contributions} WHERE {first_key} IS NULL AND kafka_tombstone
               UNION ALL
               SELECT {columns} FROM pg_temp.newest_staged WHERE {first_key} IS NULL AND kafka_tombstone) AS t
ORDER BY {newest_first} LIMIT 1;
DELETE FROM {final} f
USING pg_temp.truncation t
WHERE EXISTS (SELECT FROM pg_temp.newest_staged WHERE {first_key} IS NULL AND kafka_tombstone)
  AND ({held}) < ({truncated});
-- A row goes in as without tombstones, unless a checkpoint committed before holds a newer
-- tombstone of its key, or the truncation is newer: then the key stays deleted.
INSERT INTO {final} AS f ({columns})
SELECT {columns} FROM pg_temp.newest_staged n
WHERE NOT n.kafka_tombstone
  AND NOT EXISTS (SELECT FROM {contributions} c
                  WHERE {tombstone_of_key} AND c.kafka_tombstone AND ({kept}) > ({staged}))
  AND NOT EXISTS (SELECT FROM pg_temp.truncation t WHERE ({truncated}) > ({staged}))
ON CONFLICT ({keys}) DO UPDATE SET {take_new}
WHERE ({held}) < ({new})

-- name: live
-- A reprocessing's recompute (keyed.sql): the newest contributions that are rows; a key whose
-- newest is a tombstone gets none, and `tombstoned` deletes it, as it deletes one older than a
-- truncate.
SELECT {columns} FROM ({newest}) AS n WHERE NOT n.kafka_tombstone

-- name: tombstoned
-- Of a reprocessing's recompute (keyed.sql), before its last DELETE: the keys it touched
-- whose newest contribution is a tombstone, or older than a truncate, have no row.
DELETE FROM {final} f
WHERE ({keys}) IN (SELECT {keys} FROM pg_temp.affected_keys)
  AND (SELECT c.kafka_tombstone
              OR EXISTS (SELECT FROM {contributions} t
                         WHERE t.{first_key} IS NULL AND t.kafka_tombstone AND ({truncated}) > ({kept}))
       FROM {contributions} c WHERE {same_keys} ORDER BY {newest_first} LIMIT 1)

-- name: widened
-- Of a reprocessing's recompute (keyed.sql): when the contribution taken back or the new one
-- holds a truncate (a key of nulls), it touched every key, so every key is recomputed.
INSERT INTO pg_temp.affected_keys SELECT DISTINCT {keys} FROM {contributions}
WHERE EXISTS (SELECT FROM pg_temp.affected_keys WHERE {first_key} IS NULL)
