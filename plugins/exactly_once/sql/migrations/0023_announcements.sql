-- Which Airflow task announced a committed checkpoint (an asset event per sink,
-- plugins/exactly_once/orchestration/assets.py): '{dag_run_id}#{clear_number}#{task_id}'. NULL:
-- not yet; the next task that announces claims it. A task claims as its last step, so a try
-- that fails after claiming leaves the claim to its retry (same run, clear number and task),
-- which announces again what that try's events never carried; a cleared task or another run
-- finds it claimed. The checkpoints committed before this version are not announced.
-- The default marks every row there is without rewriting the table (a catalog change: the
-- migration's lock is short on a ledger of any size); only the open checkpoints are unmarked.
ALTER TABLE exactly_once.checkpoints ADD COLUMN IF NOT EXISTS announced_by text
    DEFAULT 'committed before migration 0023';
ALTER TABLE exactly_once.checkpoints ALTER COLUMN announced_by DROP DEFAULT;
UPDATE exactly_once.checkpoints SET announced_by = NULL WHERE state NOT IN ('committed', 'aborted');
CREATE INDEX IF NOT EXISTS checkpoints_announced_by ON exactly_once.checkpoints (pipeline, announced_by)
    WHERE state = 'committed';
