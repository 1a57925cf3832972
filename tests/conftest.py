"""Session fixtures for the real local services.

`stack_env` starts whatever of the local stack is not running (PostgreSQL,
Kafka, Airflow's metadata database), exports its environment for the whole
session, and at the end stops, by PID, only what it started. A service that
cannot be started fails the tests that need it; nothing is skipped.
"""

from __future__ import annotations

import logging
import os
import uuid
from contextlib import closing

import psycopg2
import pytest

from exactly_once_stack import lifecycle
from exactly_once_stack.settings import process_environment


@pytest.fixture(scope="session")
def stack_env() -> dict[str, str]:
    started = lifecycle.up()
    saved = dict(os.environ)
    env = process_environment()
    os.environ.update(env)  # in-process clients (SparkSession, DagBag) read the same variables
    yield env
    os.environ.clear()
    os.environ.update(saved)
    lifecycle.down(started)


@pytest.fixture(scope="session")
def kafka_servers(stack_env) -> str:
    return stack_env["KAFKA_BOOTSTRAP_SERVERS"]


@pytest.fixture(scope="session")
def pipeline_db_url(stack_env) -> str:
    return stack_env["PIPELINE_DB_URL"]


@pytest.fixture(scope="session")
def ledger_db(pipeline_db_url) -> str:
    """The pipeline database with the ledger schema migrated."""
    from exactly_once.ledger.migrate import migrate

    with closing(psycopg2.connect(pipeline_db_url)) as conn:
        migrate(conn)
    return pipeline_db_url


@pytest.fixture(scope="session")
def spark(stack_env):
    """One local SparkSession per test session (starting one costs ~9 s)."""
    from pyspark.sql import SparkSession

    logging.getLogger("py4j").setLevel(logging.WARNING)  # its __del__ logs after pytest closed stderr
    session = SparkSession.builder.master("local[2]").appName("tests").getOrCreate()
    yield session
    session.stop()


@pytest.fixture
def topic(kafka_servers, request) -> str:
    """A new, uniquely named topic with 3 partitions for one test."""
    from tests.kafka_records import create_topic

    name = f"t_{request.node.name[:40]}_{uuid.uuid4().hex[:8]}".replace("[", "_").replace("]", "_")
    create_topic(kafka_servers, name, partitions=3)
    return name
