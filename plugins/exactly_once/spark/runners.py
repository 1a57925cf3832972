"""How a task runs one attempt's Spark job, chosen by the type of its Spark connection
(`spark_default`):

- type `spark` (a master URL: `local[N]`, `spark://host:port`, `yarn`, `k8s://...`):
  spark-submit of `jobs/increment.py` through Airflow's `SparkSubmitHook`, with the code
  archive (`exactly_once.spark.shipping`) as `--py-files`. The driver runs beside the task
  (client mode): Spark refuses cluster deploy mode for Python applications on a
  standalone master, and the task must see its job end to know the attempt's verdict.
- type `spark_connect` (`sc://host:port`, a token over TLS): the task itself is the
  Spark Connect client of a warm server, and the code archive reaches the server's
  Python workers as an artifact (`addArtifacts`), for the transform's Python UDFs.

Both run `exactly_once.spark.job` with the same arguments and the private settings file, and
raise when the job fails; what the failure means is read from the ledger.
"""

from __future__ import annotations

import logging
import os
from abc import ABC, abstractmethod
from pathlib import Path

from exactly_once.config import PipelineConfig
from exactly_once.errors import ConfigError
from exactly_once.spark.settings import JobSettings
from exactly_once.spark.shipping import code_archive

log = logging.getLogger(__name__)

JOB = str(Path(__file__).resolve().parents[3] / "jobs" / "increment.py")  # spark-submit's application
CONNECT = "spark_connect"  # the Spark provider's connection type of a Spark Connect endpoint


class JobFailed(Exception):
    """The Spark job exited with a failure (the ledger says which)."""


class JobRunner(ABC):
    """Runs the job of one attempt, given its arguments; `on_kill` stops it when Airflow stops the task."""

    def __init__(self, conn_id: str, name: str, config: PipelineConfig, settings: JobSettings):
        self.conn_id, self.name, self.settings = conn_id, name, settings
        self.archive = str(code_archive(config))  # before any attempt starts: a transform that is not there fails here

    def __call__(self, arguments: list[str]) -> None:
        with self.settings.written() as settings:
            self.run([*arguments, "--settings", str(settings)], self.archive)

    @abstractmethod
    def run(self, arguments: list[str], archive: str) -> None:
        """Runs the job with its arguments (the settings file's included) and the code archive."""

    @abstractmethod
    def on_kill(self) -> None:
        """Stops the job's work."""


class SubmitRunner(JobRunner):
    """spark-submit on the connection's master, the code shipped with --py-files."""

    hook = None

    def run(self, arguments: list[str], archive: str) -> None:
        from airflow.providers.apache.spark.hooks.spark_submit import SparkSubmitHook

        self.hook = SparkSubmitHook(conn_id=self.conn_id, name=self.name, py_files=archive,
                                    application_args=arguments)
        self.hook.submit(JOB, env=self.settings.job_environment(os.environ))  # raises on a non-zero exit

    def on_kill(self) -> None:
        if self.hook is not None:
            self.hook.on_kill()


class ConnectRunner(JobRunner):
    """The job in this process, a Spark Connect client of the connection's server."""

    session = None

    def run(self, arguments: list[str], archive: str) -> None:
        from airflow.providers.apache.spark.hooks.spark_connect import SparkConnectHook
        from pyspark.sql import SparkSession

        from exactly_once.spark import job

        url = SparkConnectHook(self.conn_id).get_connection_url()

        def session(name: str) -> SparkSession:
            created = SparkSession.builder.remote(url).appName(name).create()
            try:
                created.addArtifacts(archive, pyfile=True)
            except BaseException:
                created.stop()
                raise
            self.session = created
            return created

        try:
            status = job.run(arguments, session)
        finally:
            self.session = None  # stopped by the job
        if status != 0:
            raise JobFailed(f"the increment job over Spark Connect ended with status {status}")

    def on_kill(self) -> None:
        session = self.session
        if session is not None:
            session.interruptAll()


def job_settings(config: PipelineConfig) -> JobSettings:
    """What the pipeline's Spark job reaches its services with, from the task's connections."""
    from exactly_once import connections  # Airflow's: the job's own processes import this module without it

    registry = config.source.schema_registry
    return JobSettings(connections.pipeline_db_url(), connections.kafka_client(),
                       connections.schema_registry(registry) if registry else None)


def job_runner(conn_id: str, name: str, config: PipelineConfig, settings: JobSettings) -> JobRunner:
    """The runner the Spark connection's type selects. Client mode only: the job's settings
    file is private to the task's machine, and the task must see the job end."""
    from airflow.sdk import BaseHook

    connection = BaseHook.get_connection(conn_id)
    conn_type = connection.conn_type
    if connection.extra_dejson.get("deploy-mode", "client") != "client":
        raise ConfigError(f"connection {conn_id!r}: deploy-mode {connection.extra_dejson['deploy-mode']!r}; the "
                          "increment job runs in client mode (its driver beside the task), so leave deploy-mode "
                          "unset or 'client'")
    runner = ConnectRunner if conn_type == CONNECT else SubmitRunner
    log.info("Spark connection %r of type %r: %s", conn_id, conn_type, runner.__doc__.split(",")[0])
    return runner(conn_id, name, config, settings)
