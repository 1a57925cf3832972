-- When a checkpoint last stalled: only an operator's act after it resumes the checkpoint (a
-- cleared task whose try began after the stall, or `stalls resume`), never a try of its own
-- run that began before the stall and merely ran late (issue 60: a commit task held past
-- another run's recovery, which stalled its checkpoint on the dead-letter budget, committed
-- it and recorded a resume nobody made). NULL for a stall recorded before this version: any
-- try from now on began after it.
ALTER TABLE exactly_once.checkpoints ADD COLUMN IF NOT EXISTS stalled_at timestamptz;
