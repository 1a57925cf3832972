-- What upsert and aggregate sinks share (plugins/exactly_once/sinks/_keyed.py): each
-- checkpoint's contribution is kept — per key its newest row (or tombstone, for an upsert
-- sink), per group its folded measures — in the sink's contributions
-- table, so a reprocessing can take one back and recompute the keys it touches from every
-- checkpoint's latest contribution. {folded} is the mode's fold of the rows its WHERE picks,
-- with the columns {kept} names (the final table's {columns}, and the mode's marks).

-- name: keep
-- The staged rows, folded, as the contribution of checkpoint %(slot)s.
INSERT INTO {contributions} ({kept}, checkpoint_id)
SELECT folded.*, %(slot)s FROM ({folded}) AS folded

-- name: forget
-- The slot's contribution taken back; the keys it touched are remembered for `recompute`.
DROP TABLE IF EXISTS pg_temp.affected_keys;
CREATE TEMP TABLE affected_keys ON COMMIT DROP AS
SELECT {keys} FROM {contributions} WHERE checkpoint_id = %(slot)s;
DELETE FROM {contributions} WHERE checkpoint_id = %(slot)s

-- name: recompute
-- After `keep`: every key the old or the new contribution touches becomes the fold of all
-- contributions (of an upsert sink that takes tombstones: the newest that are rows, and the
-- keys whose newest is a tombstone are deleted, sql/merge/upsert.sql); a key none holds any
-- more goes.
INSERT INTO pg_temp.affected_keys SELECT {keys} FROM {contributions} WHERE checkpoint_id = %(slot)s;
{widened}INSERT INTO {final} AS f ({columns})
{live}
ON CONFLICT ({keys}) DO UPDATE SET {take_new};
{tombstoned}DELETE FROM {final} f
WHERE ({keys}) IN (SELECT {keys} FROM pg_temp.affected_keys)
  AND NOT EXISTS (SELECT FROM {contributions} c WHERE {same_keys})

-- name: fold
-- Retention (plugins/exactly_once/ledger/retention.py): the contributions of the checkpoints
-- %(folded)s, with the base checkpoint's (%(base)s) of the keys they touch, become one base
-- contribution per key: their fold (of what `picked` reads), which is what a recompute would
-- make of them. The base's rows are found by key (the contributions' index of the keys), not
-- read whole: the base holds a row of every key the sink ever had.
DROP TABLE IF EXISTS pg_temp.folded_keys;
CREATE TEMP TABLE folded_keys ON COMMIT DROP AS
SELECT DISTINCT {keys} FROM {contributions} WHERE checkpoint_id = ANY(%(folded)s);
DROP TABLE IF EXISTS pg_temp.base_contributions;
CREATE TEMP TABLE base_contributions ON COMMIT DROP AS {folded};
DELETE FROM {contributions} WHERE checkpoint_id = ANY(%(folded)s);
DELETE FROM {contributions} c USING pg_temp.folded_keys f WHERE c.checkpoint_id = %(base)s AND {same_keys};
INSERT INTO {contributions} ({kept}, checkpoint_id) SELECT b.*, %(base)s FROM pg_temp.base_contributions b

-- name: picked
(SELECT * FROM {contributions} WHERE checkpoint_id = ANY(%(folded)s)
 UNION ALL
 SELECT c.* FROM {contributions} c JOIN pg_temp.folded_keys f ON {same_keys} WHERE c.checkpoint_id = %(base)s) AS picked
