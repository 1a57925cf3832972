-- The Airflow DAG that last began a checkpoint of the pipeline: the pipelines view in
-- Airflow's UI links each checkpoint to its DAG run (a run id alone is unique per DAG only).
ALTER TABLE exactly_once.pipelines ADD COLUMN dag_id text;

-- The view shows the newest dead letters of a pipeline without sorting all of them.
CREATE INDEX dead_letters_newest ON exactly_once.dead_letters (pipeline, committed_at DESC);
