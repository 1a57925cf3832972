"""The connection type of the pipeline database (`exactly_once_pipeline_db`), one connection
per role: `pipeline_db` (the commit role: the tasks), `pipeline_db_job` (the job role: the
Spark job's staging inserts), `pipeline_db_read` (the read role: status and the pipelines
view). Its fields are PostgreSQL's (a connection of type `postgres` works the same); the
extra holds libpq parameters such as `sslmode` and `sslrootcert`, which the Spark job
carries over to pgjdbc (`exactly_once.connections`)."""

from __future__ import annotations

from typing import Any

from airflow.providers.postgres.hooks.postgres import PostgresHook


class PipelineDatabaseHook(PostgresHook):
    conn_type = "exactly_once_pipeline_db"
    hook_name = "Exactly-once pipeline database"
    default_conn_name = "pipeline_db"

    @classmethod
    def get_ui_field_behaviour(cls) -> dict[str, Any]:
        return {
            "hidden_fields": [],
            "relabeling": {"schema": "Database", "login": "Role"},
            "placeholders": {
                "login": "the commit role (pipeline_db), the job role (pipeline_db_job) or the read role "
                         "(pipeline_db_read)",
                "extra": '{"sslmode": "verify-full", "sslrootcert": "/path/to/ca.pem"}',
            },
        }
