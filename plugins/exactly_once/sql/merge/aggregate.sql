-- aggregate: per group, measures merge with +=, least, greatest. Addition commutes, so
-- checkpoints may commit in any order; a checkpoint committed twice would be wrong
-- forever, which the ledger prevents. plugins/exactly_once/sinks/aggregate.py.

-- name: folded
-- Per group, the measures of the source's rows that the condition picks, folded.
SELECT {keys}, {folded_measures}
FROM {source}
WHERE {where}
GROUP BY {keys}

-- name: merge
INSERT INTO {final} AS f ({keys}, {measures})
{folded}
ON CONFLICT ({keys}) DO UPDATE SET {merged_measures}
