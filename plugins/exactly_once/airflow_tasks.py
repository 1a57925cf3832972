"""A pipeline DAG in a few lines: `checkpoint_tasks(config)` inside a DAG gives

    begin_checkpoint ──▶ increment (spark-submit, one attempt) ──▶ commit

Operators are thin: the work of each task is in `exactly_once.tasks`, and what
follows a task (skip, retry, fail without retry) is `exactly_once.outcomes`'s
word, applied here by `airflow_outcome`. The pipeline database comes from the
Airflow connection `pipeline_db`; the Spark master from `spark_default`.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from datetime import timedelta
from typing import Any

import psycopg2
from airflow.providers.apache.spark.operators.spark_submit import SparkSubmitOperator
from airflow.providers.postgres.hooks.postgres import PostgresHook
from airflow.sdk import BaseHook, task
from airflow.sdk.exceptions import AirflowFailException, AirflowNotFoundException

from exactly_once import tasks
from exactly_once.config import ConfigError, PipelineConfig
from exactly_once.kafka_offsets import KafkaOffsets, bootstrap_servers
from exactly_once.outcomes import TaskOutcome, after_begin, after_error
from exactly_once.planning import Reach
from exactly_once.problems import PreflightFailed, Problem
from exactly_once.protocol import Ledger

PIPELINE_DB = "pipeline_db"
SPARK = "spark_default"


def connector(conn_id: str = PIPELINE_DB):
    """psycopg2 connections to the pipeline database of an Airflow connection (the hook's
    own connections may be psycopg 3, which psycopg2.sql cannot compose for)."""
    c = PostgresHook.get_connection(conn_id)
    settings = {"host": c.host, "port": c.port or 5432, "user": c.login, "password": c.password, "dbname": c.schema}
    return lambda: psycopg2.connect(**settings)


def connection_problems(conn_ids: tuple[str, ...] = (PIPELINE_DB, SPARK)) -> list[Problem]:
    """The pipeline's Airflow connections that are not defined, and the pipeline database's
    refusal of its connection (PostgreSQL's words, which never quote the password). A database
    that did not answer, or refused for a reason that may pass (too many clients, starting up),
    is a problem that may pass by itself: the task is retried."""
    undefined = [conn_id for conn_id in conn_ids if not _defined(conn_id)]
    problems = [Problem(f"connection {conn_id!r}", "is not defined (Admin → Connections in the UI, "
                                                   f"or AIRFLOW_CONN_{conn_id.upper()})") for conn_id in undefined]
    if PIPELINE_DB in conn_ids and PIPELINE_DB not in undefined:
        try:
            connector()().close()
        except psycopg2.OperationalError as refused:
            said = " ".join(str(refused).split())
            problems.append(Problem(f"connection {PIPELINE_DB!r}", f"the pipeline database refuses it: {said}",
                                    passing=not any(lasting in said for lasting in LASTING_REFUSALS)))
    return problems


# What PostgreSQL says (libpq gives no SQLSTATE at connect) when a login cannot work as it is
# configured: a wrong password or user, a database that does not exist, no pg_hba.conf entry.
LASTING_REFUSALS = ("authentication failed", "does not exist", "pg_hba.conf", "permission denied")


def _defined(conn_id: str) -> bool:
    try:
        BaseHook.get_connection(conn_id)
    except AirflowNotFoundException:
        return False
    return True


def ledger(config: PipelineConfig, conn_id: str = PIPELINE_DB) -> Ledger:
    return Ledger(config, connector(conn_id))


def reach_of(run_type: str) -> Reach:
    """A backfill run takes its interval's records; any other run (scheduled, manual,
    triggered) also the records no interval claimed before it (exactly_once.planning)."""
    return Reach.INTERVAL if run_type == "backfill" else Reach.BACKLOG


@contextmanager
def airflow_outcome() -> Iterator[None]:
    """A failure no retry can fix fails the task at once (AirflowFailException); any other
    is raised as it is, so Airflow retries it."""
    try:
        yield
    except Exception as error:
        if after_error(error) is TaskOutcome.FAIL:
            raise AirflowFailException(str(error)) from error
        raise


class IncrementOperator(SparkSubmitOperator):
    """One attempt of the run's checkpoint through spark-submit (`tasks.run_increment`)."""

    def __init__(self, *, config: PipelineConfig, **kwargs: Any):
        super().__init__(application=tasks.JOB, name=f"{config.name} increment", **kwargs)
        self.config = config

    def execute(self, context) -> None:
        def submit(arguments: list[str]) -> None:
            self.application_args = arguments
            super(IncrementOperator, self).execute(context)

        checkpoint_id = context["ti"].xcom_pull(task_ids="begin_checkpoint")
        with airflow_outcome():
            tasks.run_increment(ledger(self.config), checkpoint_id, submit)


def checkpoint_tasks(config: PipelineConfig, increment_retries: int = 2, commit_retries: int = 4):
    """The three tasks of a pipeline run, chained; call inside a DAG. A failed attempt is
    retried on the same frozen ranges (Flink's restart strategy), with back-off. The
    increment's tries must reach the pipeline's `stall_after`, or a failure that persists
    would end each run without stalling its checkpoint."""
    if config.stall_after > increment_retries + 1:
        raise ConfigError(f"pipeline {config.name!r}: stall_after {config.stall_after} exceeds the increment "
                          f"task's {increment_retries + 1} tries (increment_retries + 1): a failure that persists "
                          "would never stall its checkpoint")

    @task.short_circuit(task_id="begin_checkpoint")
    def begin_checkpoint(**context) -> int | None:
        with airflow_outcome():
            problems = connection_problems()
            if problems:
                raise PreflightFailed(config.name, problems)
            with KafkaOffsets(bootstrap_servers()) as kafka:
                begun = tasks.begin_checkpoint(ledger(config), kafka, context["run_id"],
                                               context.get("data_interval_start"),
                                               context.get("data_interval_end"),
                                               reach_of(context["dag_run"].run_type))
        return None if after_begin(begun) is TaskOutcome.SKIP else begun.checkpoint.id

    @task(task_id="commit", retries=commit_retries, retry_delay=timedelta(seconds=5),
          retry_exponential_backoff=True)
    def commit(**context) -> str:
        ti = context["ti"]
        with airflow_outcome():
            return tasks.commit_checkpoint(ledger(config), ti.xcom_pull(task_ids="begin_checkpoint"),
                                           ti.try_number).value

    begun = begin_checkpoint()
    increment = IncrementOperator(task_id="increment", config=config, conn_id=SPARK,
                                  retries=increment_retries, retry_delay=timedelta(seconds=30),
                                  retry_exponential_backoff=True)
    begun >> increment >> commit()
