"""What Airflow's providers manager reads of this package (the `apache_airflow_provider` entry
point): its name and version, and the connection type of the pipeline database. Imported by
every Airflow process that lists providers, so it imports nothing but the version."""

from __future__ import annotations

from exactly_once import __version__

PACKAGE = "airflow-provider-exactly-once"


def get_provider_info() -> dict:
    return {
        "package-name": PACKAGE,
        "name": "Exactly-once batch increments (Kafka → Spark → PostgreSQL)",
        "description": "Kafka records into PostgreSQL tables exactly once, in scheduled increments that a Spark "
                       "job computes and a ledger in PostgreSQL commits.",
        "versions": [__version__],
        "integrations": [{"integration-name": "Exactly-once pipelines", "external-doc-url":
                          "https://pypi.org/project/airflow-provider-exactly-once/", "tags": ["software"]}],
        "hooks": [{"integration-name": "Exactly-once pipelines",
                   "python-modules": ["exactly_once.orchestration.pipeline_db_hook"]}],
        "connection-types": [{
            "connection-type": "exactly_once_pipeline_db", "hook-name": "Exactly-once pipeline database",
            "hook-class-name": "exactly_once.orchestration.pipeline_db_hook.PipelineDatabaseHook",
            "ui-field-behaviour": {
                "hidden-fields": [],
                "relabeling": {"schema": "Database", "login": "Role"},
                "placeholders": {"login": "the commit role (pipeline_db), the job role (pipeline_db_job) or the read "
                                          "role (pipeline_db_read)",
                                 "extra": '{"sslmode": "verify-full", "sslrootcert": "/path/to/ca.pem"}'},
            },
        }],
    }
