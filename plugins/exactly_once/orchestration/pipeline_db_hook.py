"""The connection type of the pipeline database (`exactly_once_pipeline_db`), one connection
per role: `pipeline_db` (the commit role: the tasks), `pipeline_db_job` (the job role: the
Spark job's staging inserts), `pipeline_db_read` (the read role: status and the pipelines
view). Its fields are PostgreSQL's (a connection of type `postgres` works the same); the
extra holds libpq parameters such as `sslmode` and `sslrootcert`, which the Spark job
carries over to pgjdbc (`exactly_once.connections`). The form's labels are declared in the
provider's information (`exactly_once.orchestration.provider`), as Airflow 3.2 and later want."""

from __future__ import annotations

from airflow.providers.postgres.hooks.postgres import PostgresHook


class PipelineDatabaseHook(PostgresHook):
    conn_type = "exactly_once_pipeline_db"
    hook_name = "Exactly-once pipeline database"
    default_conn_name = "pipeline_db"
