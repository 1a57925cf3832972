-- Which Airflow task announced a committed checkpoint (an asset event per sink,
-- plugins/exactly_once/orchestration/assets.py): '{dag_run_id}#{clear_number}#{task_id}'. NULL:
-- not yet; the next task that announces claims it. A task claims as its last step, so a try
-- that fails after claiming leaves the claim to its retry (same run, clear number and task),
-- which announces again what that try's events never carried; a cleared task or another run
-- finds it claimed. The checkpoints committed before this version are not announced.
ALTER TABLE exactly_once.checkpoints ADD COLUMN IF NOT EXISTS announced_by text;
UPDATE exactly_once.checkpoints SET announced_by = 'committed before migration 0023'
WHERE state = 'committed' AND announced_by IS NULL;
CREATE INDEX IF NOT EXISTS checkpoints_announced_by ON exactly_once.checkpoints (pipeline, announced_by)
    WHERE state = 'committed';
