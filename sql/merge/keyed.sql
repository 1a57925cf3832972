-- What upsert and aggregate sinks share (plugins/exactly_once/sinks/_keyed.py): each
-- checkpoint's contribution is kept — per key its newest row, per group its folded
-- measures — in the sink's contributions table, so a reprocessing can take one back and
-- recompute the keys it touches from every checkpoint's latest contribution. {folded} is
-- the mode's fold of the rows its WHERE picks.

-- name: keep
-- The staged rows, folded, as the contribution of checkpoint %(slot)s.
INSERT INTO {contributions} ({columns}, checkpoint_id)
SELECT folded.*, %(slot)s FROM ({folded}) AS folded

-- name: forget
-- The slot's contribution taken back; the keys it touched are remembered for `recompute`.
DROP TABLE IF EXISTS pg_temp.affected_keys;
CREATE TEMP TABLE affected_keys ON COMMIT DROP AS
SELECT {keys} FROM {contributions} WHERE checkpoint_id = %(slot)s;
DELETE FROM {contributions} WHERE checkpoint_id = %(slot)s

-- name: recompute
-- After `keep`: every key the old or the new contribution touches becomes the fold of all
-- contributions; a key none holds any more goes.
INSERT INTO affected_keys SELECT {keys} FROM {contributions} WHERE checkpoint_id = %(slot)s;
INSERT INTO {final} AS f ({columns})
{folded}
ON CONFLICT ({keys}) DO UPDATE SET {take_new};
DELETE FROM {final} f
WHERE ({keys}) IN (SELECT {keys} FROM affected_keys)
  AND NOT EXISTS (SELECT FROM {contributions} c WHERE {same_keys})
