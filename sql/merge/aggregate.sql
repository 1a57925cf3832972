-- aggregate: per group, measures merge with +=, least, greatest. Addition
-- commutes, so checkpoints may commit in any order; a checkpoint committed
-- twice would be wrong forever, which the ledger prevents.
INSERT INTO {final} AS f ({keys}, {measures})
SELECT {keys}, {staged_measures}
FROM {staging}
WHERE checkpoint_id = %(checkpoint_id)s AND attempt = %(attempt)s
GROUP BY {keys}
ON CONFLICT ({keys}) DO UPDATE SET {merged_measures}
