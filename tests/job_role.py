"""The Spark job of an attempt in this process's session, as `exactly_once.spark.job` runs it:
connected as the job role (the local stack's `pipeline_db_job` connection; README, "Roles by
duty"), with the configuration its attempt was started with. What it staged is returned for
the task to pre-commit (`exactly_once.orchestration.tasks.run_increment`)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import psycopg2

from exactly_once.connections import PIPELINE_DB_JOB, pipeline_db_url
from exactly_once.kafka_client import KafkaClient
from exactly_once.ledger.protocol import Ledger
from exactly_once.schema_registry import SchemaRegistry
from exactly_once.spark.increment import execute_attempt
from exactly_once.spark.report import AttemptReport


def job_db_url() -> str:
    return pipeline_db_url(PIPELINE_DB_JOB)


def in_process(spark, pipeline: str, servers: str, registry: SchemaRegistry | None = None
               ) -> Callable[[list[str]], AttemptReport]:
    """An `execute` for `tasks.run_increment`: the job's attempt in `spark`, as the job role."""
    def execute(arguments: list[str]) -> AttemptReport:
        given = dict(zip(arguments[::2], arguments[1::2]))
        checkpoint_id, attempt = int(given["--checkpoint-id"]), int(given["--attempt"])
        url = job_db_url()
        ledger = Ledger.of_attempt(pipeline, checkpoint_id, attempt, lambda: psycopg2.connect(url))
        token = Path(given["--token"]).read_text()
        return execute_attempt(spark, ledger, checkpoint_id, attempt, token, KafkaClient.at(servers), url, registry)
    return execute
