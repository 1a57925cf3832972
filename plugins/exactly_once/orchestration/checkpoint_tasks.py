"""A pipeline DAG in a few lines: `checkpoint_tasks(config)` inside a DAG gives

    begin_checkpoint ──▶ increment (one attempt of the Spark job) ──▶ commit ──▶ publish (kafka sinks)

Operators are thin: the work of each task is in `exactly_once.orchestration.tasks`, and what
follows a task (skip, retry, fail without retry) is `exactly_once.orchestration.outcomes`'s
word, applied here by `airflow_outcome`. The pipeline database, Kafka and the Spark
master come from Airflow connections (`exactly_once.connections`).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from datetime import timedelta
from typing import Any

from airflow.sdk import BaseOperator, Param, task
from airflow.sdk.exceptions import AirflowFailException

from exactly_once.config import PipelineConfig
from exactly_once.connections import (KAFKA, PIPELINE_DB, PIPELINE_DB_JOB, SPARK, connection_problems, connector,
                                      defined_connector, kafka_client, pipeline_db_location, schema_registry_problems)
from exactly_once.errors import ConfigError
from exactly_once.ledger import announcements, run_refusals
from exactly_once.ledger.checkpoints import TaskTry
from exactly_once.ledger.kafka_offsets import KafkaOffsets
from exactly_once.ledger.planning import Reach
from exactly_once.ledger.protocol import Ledger
from exactly_once.operate import overview
from exactly_once.orchestration import assets, lineage, tasks
from exactly_once.orchestration.alerting import Alerts
from exactly_once.orchestration.observed import observed
from exactly_once.orchestration.outcomes import TaskOutcome, after_begin, after_error
from exactly_once.problems import PreflightFailed
from exactly_once.publishing.publisher import kafka_sinks
from exactly_once.spark.runners import job_runner, job_settings


def ledger(config: PipelineConfig, conn_id: str = PIPELINE_DB) -> Ledger:
    return Ledger(config, connector(conn_id))


def announce_committed(context, config: PipelineConfig, location: tuple[str, int, str]) -> None:
    """Asset events for the committed checkpoints this task claims (exactly_once.ledger.announcements):
    the task's last step, so a try that fails before it claims nothing. `location`: the
    pipeline database's host, port and name, looked up before anything is committed."""
    claimed = announcements.claim(ledger(config), assets.announcer(context))
    assets.announce(context, config, assets.committed_events(config, claimed, *location))


def reach_of(run_type: str) -> Reach:
    """A backfill run takes the unclaimed offsets of its interval (by position: from the first
    offset stamped at or after its start to the first at or after its end); any other run
    (scheduled, manual, triggered) also the records no interval claimed before it
    (exactly_once.ledger.planning)."""
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


class IncrementOperator(BaseOperator):
    """One attempt of the run's checkpoint (`tasks.run_increment`), its Spark job run as the
    Spark connection's type says (`exactly_once.spark.runners`: spark-submit, or Spark
    Connect); the job reaches Kafka with this task's connection and the pipeline database
    as the job role, `pipeline_db_job` (`exactly_once.spark.settings`)."""

    def __init__(self, *, config: PipelineConfig, conn_id: str = SPARK, alerts: Alerts | None = None, **kwargs: Any):
        super().__init__(**kwargs)
        self.config, self.conn_id, self.alerts = config, conn_id, alerts
        self.runner = None

    def execute(self, context) -> None:
        checkpoint_id = context["ti"].xcom_pull(task_ids="begin_checkpoint")
        with airflow_outcome(), observed(lambda: ledger(self.config), self.alerts, kafka_client, context):
            self.runner = job_runner(self.conn_id, f"{self.config.name} increment", self.config,
                                     job_settings(self.config))
            ti = context["ti"]
            tasks.run_increment(ledger(self.config), checkpoint_id, self.runner, TaskTry(ti.try_number, ti.start_date))

    def on_kill(self) -> None:
        if self.runner is not None:
            self.runner.on_kill()

    def get_openlineage_facets_on_complete(self, task_instance):
        """The run's lineage (`exactly_once.orchestration.lineage`): the topics in; the sink tables, the
        dead letters and the kafka sinks' topics out."""
        from airflow.providers.common.compat.openlineage.facet import Dataset
        from airflow.providers.openlineage.extractors import OperatorLineage

        def datasets(names: list[lineage.DatasetName]) -> list[Dataset]:
            return [Dataset(namespace=n.namespace, name=n.name) for n in names]

        servers = kafka_client().bootstrap_servers
        return OperatorLineage(inputs=datasets(lineage.inputs(self.config, servers)),
                               outputs=datasets(lineage.outputs(self.config, *pipeline_db_location(), servers)))


REPROCESS = "reprocess"  # the run parameter that makes a run whose checkpoint is committed replay it


def reprocess_param() -> Param:
    return Param(False, type="boolean", title="Reprocess the run's committed checkpoint",
                 description="With 'reprocess completed runs' in a backfill (or a cleared run): read the run's "
                             "checkpoint's frozen offset ranges again with today's configuration and replace "
                             "what it wrote in every sink, in one transaction. Off: a completed run changes "
                             "nothing.")


def checkpoint_tasks(config: PipelineConfig, increment_retries: int = 2, commit_retries: int = 4,
                     spark_conn_id: str = SPARK, begin_retries: int = 3,
                     increment_timeout: timedelta = timedelta(hours=6), alerts: Alerts | None = None):
    """The three tasks of a pipeline run, chained; call inside a DAG. A failed attempt is
    retried on the same frozen ranges (Flink's restart strategy), with back-off; so is a
    begin that failed for a reason a retry may fix (a Kafka blip, a deadlock). The
    increment's tries must reach the pipeline's `stall_after`, or a failure that persists
    would end each run without stalling its checkpoint; a try that runs longer than
    `increment_timeout` is stopped and counts as failed. A pipeline with kafka sinks publishes
    its committed outbox after the commit, and its begin publishes what earlier runs left
    before it plans (a publish that fails orphans no checkpoint: `tasks.publish_first`). `spark_conn_id`: the Spark
    connection its jobs run on (exactly_once.spark.runners). `alerts`: the notifier each
    task calls, once per event, when the pipeline stalls or its records wait too long
    (exactly_once.orchestration.alerting). Declares the DAG's `reprocess` parameter, so the
    trigger and backfill forms show it."""
    if config.stall_after > increment_retries + 1:
        raise ConfigError(f"pipeline {config.name!r}: stall_after {config.stall_after} exceeds the increment "
                          f"task's {increment_retries + 1} tries (increment_retries + 1): a failure that persists "
                          "would never stall its checkpoint")

    @task.short_circuit(task_id="begin_checkpoint", retries=begin_retries, retry_delay=timedelta(seconds=10),
                        retry_exponential_backoff=True, outlets=assets.table_outlets(config))
    def begin_checkpoint(**context) -> int | None:
        with airflow_outcome(), observed(lambda: ledger(config), alerts, kafka_client, context):
            problems = connection_problems((PIPELINE_DB, PIPELINE_DB_JOB, KAFKA, spark_conn_id))
            problems += schema_registry_problems(config.source)
            if problems:
                refused = PreflightFailed(config.name, problems)
                # Recorded where status looks, if the pipeline database can be reached (else only logged).
                run_refusals.record(lambda: ledger(config).connect(), config.name, run_refusals.BEGIN, refused)
                raise refused
            with KafkaOffsets(kafka_client()) as kafka:  # publishes what earlier runs left, then plans
                location = pipeline_db_location()
                begun = tasks.begin_checkpoint(ledger(config), kafka, context["run_id"],
                                               context.get("data_interval_start"),
                                               context.get("data_interval_end"),
                                               reach_of(context["dag_run"].run_type),
                                               reprocess=bool(context["params"].get(REPROCESS)),
                                               connect_as=defined_connector,
                                               publish_with=kafka_client() if kafka_sinks(config) else None)
            overview.record_dag(connector(), config.name, context["dag"].dag_id)  # the view's links to runs
            announce_committed(context, config, location)  # what its recovery committed, say
        return None if after_begin(begun) is TaskOutcome.SKIP else begun.checkpoint.id

    @task(task_id="commit", retries=commit_retries, retry_delay=timedelta(seconds=5),
          retry_exponential_backoff=True, outlets=assets.table_outlets(config))
    def commit(**context) -> str:
        ti = context["ti"]
        with airflow_outcome(), observed(lambda: ledger(config), alerts, kafka_client, context):
            location = pipeline_db_location()
            outcome = tasks.commit_checkpoint(ledger(config), ti.xcom_pull(task_ids="begin_checkpoint"),
                                              ti.try_number, ti.start_date)
            announce_committed(context, config, location)
            return outcome.value

    @task(task_id="publish", retries=commit_retries, retry_delay=timedelta(seconds=5),
          retry_exponential_backoff=True, outlets=assets.topic_outlets(config))
    def publish(**context) -> str:
        with airflow_outcome(), observed(lambda: ledger(config), alerts, kafka_client, context):
            client = kafka_client()
            published = tasks.publish_outbox(ledger(config), client)
            assets.announce(context, config, assets.published_events(config, published, client.bootstrap_servers))
            return "; ".join(map(str, published))

    begun = begin_checkpoint()
    increment = IncrementOperator(task_id="increment", config=config, conn_id=spark_conn_id, alerts=alerts,
                                  retries=increment_retries, retry_delay=timedelta(seconds=30),
                                  retry_exponential_backoff=True, execution_timeout=increment_timeout)
    committed = begun >> increment >> commit()
    if kafka_sinks(config):
        committed >> publish()
    if REPROCESS not in increment.dag.params:
        increment.dag.params[REPROCESS] = reprocess_param()
