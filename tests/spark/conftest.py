"""Fixtures of the Spark tests that run the job as the Airflow task runs it."""

from __future__ import annotations

import os

import pytest

from exactly_once.kafka_client import KafkaClient
from exactly_once.spark.runners import ConnectRunner, job_runner
from exactly_once.spark.settings import JobSettings
from exactly_once_stack import spark_cluster
from exactly_once_stack.settings import spark_connection
from tests.job_role import job_db_url

CONNECTION = "spark_connect_isolation"  # the Airflow connection the tests give the Connect server


@pytest.fixture(scope="module")
def connect_server(stack_env) -> dict:
    """The local stack's Spark Connect server as an Airflow connection; started if none
    runs, and then stopped (by PID) at the end. A Connect session leaves this process in
    Connect mode (pyspark sets SPARK_CONNECT_MODE_ENABLED and never unsets it for a remote
    server): the environment is put back, so later tests get local sessions again."""
    saved = dict(os.environ)
    started = spark_cluster.start("connect")
    yield spark_connection("connect")
    spark_cluster.stop_named(started)
    os.environ.clear()
    os.environ.update(saved)


def connect_runner(config, servers: str, registry, connect_server: dict, monkeypatch) -> ConnectRunner:
    """The runner the Airflow task picks for a Spark connection to the stack's Connect server."""
    import json

    monkeypatch.setenv(f"AIRFLOW_CONN_{CONNECTION.upper()}", json.dumps(connect_server))
    runner = job_runner(CONNECTION, f"{config.name} increment", config,
                        JobSettings(job_db_url(), KafkaClient.at(servers), registry))
    assert isinstance(runner, ConnectRunner)
    return runner
