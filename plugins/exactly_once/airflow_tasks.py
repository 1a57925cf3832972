"""A pipeline DAG in a few lines: `checkpoint_tasks(config)` inside a DAG gives

    begin_checkpoint ──▶ increment (spark-submit, one attempt) ──▶ commit

Operators are thin: each step is one call into `exactly_once.protocol.Ledger`.
The pipeline database comes from the Airflow connection `pipeline_db`; the Spark
master from `spark_default`.
"""

from __future__ import annotations

from contextlib import closing
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import psycopg2
from airflow.providers.apache.spark.operators.spark_submit import SparkSubmitOperator
from airflow.providers.postgres.hooks.postgres import PostgresHook
from airflow.sdk import task
from airflow.sdk.exceptions import AirflowFailException

from exactly_once import faults
from exactly_once.config import PipelineConfig
from exactly_once.kafka_offsets import KafkaOffsets, bootstrap_servers
from exactly_once.migrate import migrate
from exactly_once.protocol import Ledger, NotPreCommitted, NotRunnable, StagedDataChanged
from exactly_once.status import describe_ranges, holders

JOB = str(Path(__file__).resolve().parents[2] / "jobs" / "increment.py")
PIPELINE_DB = "pipeline_db"


def connector(conn_id: str = PIPELINE_DB):
    """psycopg2 connections to the pipeline database of an Airflow connection (the hook's
    own connections may be psycopg 3, which psycopg2.sql cannot compose for)."""
    c = PostgresHook.get_connection(conn_id)
    settings = {"host": c.host, "port": c.port or 5432, "user": c.login, "password": c.password, "dbname": c.schema}
    return lambda: psycopg2.connect(**settings)


def ledger(config: PipelineConfig, conn_id: str = PIPELINE_DB) -> Ledger:
    return Ledger(config, connector(conn_id))


class IncrementOperator(SparkSubmitOperator):
    """Starts a new attempt of the run's checkpoint (fencing off any older one) and
    submits the increment job for it. A failed attempt is aborted, so a retry runs the
    same frozen ranges again. Nothing to do if the checkpoint is already pre-committed
    or committed (a cleared task in a finished run)."""

    def __init__(self, *, config: PipelineConfig, **kwargs: Any):
        super().__init__(application=JOB, name=f"{config.name} increment", **kwargs)
        self.config = config

    def execute(self, context) -> None:
        checkpoint_id = context["ti"].xcom_pull(task_ids="begin_checkpoint")
        pipeline = ledger(self.config)
        try:
            attempt = pipeline.start_attempt(checkpoint_id).attempt
        except NotRunnable as done:
            if done.state in ("precommitted", "committed"):
                self.log.info("nothing to run: %s", done)
                return
            raise AirflowFailException(str(done)) from done
        self.application_args = ["--pipeline", self.config.name, "--checkpoint-id", str(checkpoint_id),
                                 "--attempt", str(attempt)]
        self.log.info("checkpoint %s attempt %s: submitting %s", checkpoint_id, attempt, JOB)
        try:
            super().execute(context)
        except BaseException as failure:
            if pipeline.abort_attempt(checkpoint_id, attempt, f"Spark job failed: {failure}"):
                self.log.info("attempt %s of checkpoint %s aborted; a retry runs the same ranges", attempt,
                              checkpoint_id)
            raise


def interval_holders(config: PipelineConfig, kafka: KafkaOffsets, start: datetime, end: datetime) -> str:
    """Which checkpoints took the records of an interval this run finds empty (a backfill
    over intervals already processed, or a run late behind a later one)."""
    with closing(connector()()) as conn:
        held = holders(conn, kafka, config.name, config.source.topics, start, end)
    interval = f"{start.isoformat()} → {end.isoformat()}"
    if not held:
        return f"no records in the interval {interval}"
    return (f"the records of the interval {interval} are already held by checkpoint(s) "
            + ", ".join(f"{h.checkpoint_id} ({h.state}, DAG run {h.dag_run_id})" for h in held))


def checkpoint_tasks(config: PipelineConfig, commit_retries: int = 4):
    """The three tasks of a pipeline run, chained; call inside a DAG."""

    @task.short_circuit(task_id="begin_checkpoint")
    def begin_checkpoint(**context) -> int | None:
        with closing(connector()()) as conn:
            migrate(conn)
        start, end = context.get("data_interval_start"), context.get("data_interval_end")
        with KafkaOffsets(bootstrap_servers()) as kafka:
            begun = ledger(config).begin(context["run_id"], start, end, kafka)
            checkpoint = begun.checkpoint
            print(f"recovery: {begun.recovery}")
            ranges = describe_ranges(checkpoint.ranges)
            if checkpoint.is_empty:
                print(f"checkpoint {checkpoint.id}: nothing to read ({ranges}); no Spark job")
                if start is not None and end is not None and start < end:
                    print(interval_holders(config, kafka, start, end))
                return None
        if checkpoint.state in ("precommitted", "committed"):
            print(f"checkpoint {checkpoint.id} of this run is already {checkpoint.state} ({ranges})")
        else:
            print(f"checkpoint {checkpoint.id} ({'new' if begun.new else 'begun before'}): {ranges}")
        return checkpoint.id

    @task(task_id="commit", retries=commit_retries, retry_delay=timedelta(seconds=5),
          retry_exponential_backoff=True)
    def commit(**context) -> str:
        ti = context["ti"]
        checkpoint_id = ti.xcom_pull(task_ids="begin_checkpoint")
        faults.point(f"commit_task.try{ti.try_number}")  # e.g. fail only the first try, in tests
        try:
            outcome = ledger(config).commit(checkpoint_id)
        except (StagedDataChanged, NotPreCommitted) as refused:
            raise AirflowFailException(str(refused)) from refused
        print(f"checkpoint {checkpoint_id}: {outcome.value}")
        return outcome.value

    begun = begin_checkpoint()
    increment = IncrementOperator(task_id="increment", config=config, conn_id="spark_default")
    begun >> increment >> commit()
