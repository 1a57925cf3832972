"""The Airflow adapter: `checkpoint_tasks` and the increment operator (checkpoint_tasks.py),
the one run path of a pipeline run's tasks (tasks.py), what follows each task (outcomes.py),
lineage and the reprocess command. The top layer: everything else is below it."""
