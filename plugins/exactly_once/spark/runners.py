"""How a task runs one attempt's Spark job, chosen by the type of its Spark connection
(`spark_default`):

- type `spark` (a master URL: `local[N]`, `spark://host:port`, `yarn`, `k8s://...`):
  spark-submit of the job's module (`shipping.launcher`) through Airflow's `SparkSubmitHook`,
  with the code archive (`exactly_once.spark.shipping`) as `--py-files`. The driver runs beside the task
  (client mode): Spark refuses cluster deploy mode for Python applications on a
  standalone master, and the task must see its job end to know the attempt's verdict.
- type `spark_connect` (`sc://host:port`, a token over TLS): a Python process beside the
  task is the Spark Connect client of a warm server, and the code archive reaches the
  server's Python workers as an artifact (`addArtifacts`), for the transform's Python UDFs.

Both run `exactly_once.spark.job` with the same arguments, the private settings file and
a private report file, and return what the job staged (for the task to pre-commit) or
raise how it failed (`exactly_once.spark.report`).
"""

from __future__ import annotations

import logging
import os
import subprocess
import sys
from abc import ABC, abstractmethod
from dataclasses import replace
from pathlib import Path

from exactly_once.config import PipelineConfig
from exactly_once.errors import ConfigError
from exactly_once.spark.report import AttemptReport, read_report, reported_failure
from exactly_once.spark.settings import JobSettings, private_directory, private_file
from exactly_once.spark.shipping import code_archive, launcher

log = logging.getLogger(__name__)

CONNECT = "spark_connect"  # the Spark provider's connection type of a Spark Connect endpoint
STOP_SECONDS = 30  # a stopped Connect job's time to interrupt its operations before it is killed


class JobFailed(Exception):
    """The Spark job exited with a failure (the ledger says which)."""


class JobRunner(ABC):
    """Runs the job of one attempt, given its arguments; `on_kill` stops it when Airflow stops
    the task. The job's processes get the task's environment less its secrets
    (`JobSettings.job_environment`) and an empty private working directory: the driver-side
    transform runs there, and finds no credential but the job role's."""

    def __init__(self, conn_id: str, name: str, config: PipelineConfig, settings: JobSettings):
        self.conn_id, self.name, self.settings = conn_id, name, settings
        self.archive = str(code_archive(config))  # before any attempt starts: a transform that is not there fails here

    def __call__(self, arguments: list[str]) -> AttemptReport:
        settings = self.job_settings()
        with settings.written() as settings_file, private_file("exactly_once-report-") as report, \
                private_directory("exactly_once-job-") as workdir:
            try:
                self.run([*arguments, "--settings", str(settings_file), "--report", str(report)], self.archive,
                         settings.job_environment(os.environ), workdir)
            except Exception as ended:
                failure = reported_failure(report)
                if failure is None:
                    raise
                raise failure from ended
            return read_report(report)

    def job_settings(self) -> JobSettings:
        """What the job gets in its settings file."""
        return self.settings

    @abstractmethod
    def run(self, arguments: list[str], archive: str, env: dict[str, str], workdir: Path) -> None:
        """Runs the job with its arguments (the settings file's included), the code archive, its
        environment and working directory; raises if it fails."""

    @abstractmethod
    def on_kill(self) -> None:
        """Stops the job's work."""


class SubmitRunner(JobRunner):
    """spark-submit on the connection's master, the code shipped with --py-files."""

    hook = None

    def run(self, arguments: list[str], archive: str, env: dict[str, str], workdir: Path) -> None:
        from airflow.providers.apache.spark.hooks.spark_submit import SparkSubmitHook

        self.hook = SparkSubmitHook(conn_id=self.conn_id, name=self.name, py_files=archive,
                                    application_args=arguments)
        self.hook.submit(str(launcher()), env=env, cwd=workdir)  # raises on a non-zero exit

    def on_kill(self) -> None:
        if self.hook is not None:
            self.hook.on_kill()


class ConnectRunner(JobRunner):
    """The job in a Python process of its own beside the task, a Spark Connect client of the
    connection's server (`python -m exactly_once.spark.job --connect-artifacts ARCHIVE`): the
    code archive is its import path and reaches the server's Python workers as an artifact,
    for the transform's Python UDFs. The server's URL, which may hold a token, travels in
    the settings file."""

    process = None

    def job_settings(self) -> JobSettings:
        from airflow.providers.apache.spark.hooks.spark_connect import SparkConnectHook

        return replace(self.settings, spark_remote=SparkConnectHook(self.conn_id).get_connection_url())

    def run(self, arguments: list[str], archive: str, env: dict[str, str], workdir: Path) -> None:
        command = [sys.executable, "-m", "exactly_once.spark.job", "--connect-artifacts", archive, *arguments]
        self.process = subprocess.Popen(command, env={**env, "PYTHONPATH": archive}, cwd=workdir,
                                        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        for line in self.process.stdout:
            log.info("%s", line.rstrip())
        status = self.process.wait()
        if status != 0:
            raise JobFailed(f"the increment job over Spark Connect ended with status {status}")

    def on_kill(self) -> None:
        process = self.process
        if process is not None and process.poll() is None:
            process.terminate()  # the job interrupts its operations on the server, then exits
            try:
                process.wait(STOP_SECONDS)
            except subprocess.TimeoutExpired:  # a server that does not answer the interrupt
                process.kill()


def job_settings(config: PipelineConfig) -> JobSettings:
    """What the pipeline's Spark job reaches its services with, from the task's connections:
    the pipeline database as the job role (`pipeline_db_job`), never the tasks' own."""
    from exactly_once import connections  # Airflow's: the job's own processes import this module without it

    registry = config.source.schema_registry
    return JobSettings(connections.pipeline_db_url(connections.PIPELINE_DB_JOB), connections.kafka_client(),
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
