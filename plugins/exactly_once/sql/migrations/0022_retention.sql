-- Retention (plugins/exactly_once/ledger/retention.py, `retention:` in a pipeline's
-- configuration). A committed checkpoint beyond the reprocess horizon is folded: its
-- contributions to the keyed sinks into one base contribution per key or group, its committed
-- ranges merged into ranges per partition, both kept under the pipeline's base checkpoint
-- (dag_run_id 'exactly_once:retention-base', created by the first fold); its gaps and dead
-- letters are the base's from then on. `folded_at` says when. A folded checkpoint is never
-- reprocessed, and is deleted once beyond the pipeline's history.
ALTER TABLE exactly_once.checkpoints ADD COLUMN IF NOT EXISTS folded_at timestamptz;

-- What each step looks for (the oldest committed checkpoints not folded yet, the folded ones
-- beyond the history), and what it re-points or deletes by checkpoint, and the foreign keys
-- a deleted checkpoint is checked against: without these a step reads every row of them.
CREATE INDEX IF NOT EXISTS checkpoints_to_fold ON exactly_once.checkpoints (pipeline, committed_at)
    WHERE state = 'committed' AND folded_at IS NULL;
CREATE INDEX IF NOT EXISTS checkpoints_folded ON exactly_once.checkpoints (pipeline, committed_at)
    WHERE folded_at IS NOT NULL;
CREATE INDEX IF NOT EXISTS checkpoints_replaying ON exactly_once.checkpoints (replays) WHERE replays IS NOT NULL;
CREATE INDEX IF NOT EXISTS committed_ranges_of_checkpoint ON exactly_once.committed_ranges (checkpoint_id);
CREATE INDEX IF NOT EXISTS gaps_of_checkpoint ON exactly_once.gaps (checkpoint_id);
CREATE INDEX IF NOT EXISTS dead_letters_of_checkpoint ON exactly_once.dead_letters (checkpoint_id);
CREATE INDEX IF NOT EXISTS ranges_replanned_by ON exactly_once.checkpoint_ranges (replanned_by)
    WHERE replanned_by IS NOT NULL;
CREATE INDEX IF NOT EXISTS operator_actions_of_checkpoint ON exactly_once.operator_actions (checkpoint_id)
    WHERE checkpoint_id IS NOT NULL;
