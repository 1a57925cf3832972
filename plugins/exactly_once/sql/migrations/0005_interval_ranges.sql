-- A run owns its data interval (README, "Which records a run takes"). A checkpoint may
-- read several ranges of one partition — its interval's unclaimed offsets, the released
-- ranges it plans again, and, for a run that is not a backfill, the unclaimed offsets
-- before its interval — so a range is keyed by where it starts. `partitions.frontier`
-- is the offset below which every offset is planned; ranges of backfill runs may lie
-- beyond it, and the next run that is not a backfill takes what lies between.
ALTER TABLE exactly_once.checkpoint_ranges DROP CONSTRAINT checkpoint_ranges_pkey;
ALTER TABLE exactly_once.checkpoint_ranges ADD PRIMARY KEY (checkpoint_id, topic, partition, from_offset);

-- How far back the checkpoint's plan reached: `interval` (a backfill run) or `backlog`.
ALTER TABLE exactly_once.checkpoints ADD COLUMN reach text CHECK (reach IN ('interval', 'backlog'));
