"""Promise 8 over Spark Connect (issue 36 item 10): the poison records of test_poison.py,
with the increment job run as the Airflow task runs it on a `spark_connect` connection
(exactly_once.spark.runners: the task a client of a Spark Connect server, the code shipped as
an artifact), each become the one dead letter they become on local[2], with the same
reason, and the rest commit exactly once. A Connect client's errors carry no py4j
`java_exception`: isolation reads only what the server sends, where the COPY staging writer
states PostgreSQL's SQLSTATE. Failures no record causes are still not narrowed. The Connect
server's command line and environment (sampled from /proc while the job runs) hold neither the
job's database password nor the Kafka login's: the job's settings reach it inside the plan."""

from __future__ import annotations

import json
import uuid
from contextlib import closing
from urllib.parse import urlsplit

import psycopg2
import pytest
from pyspark.sql import SparkSession
from pyspark.sql import functions as F

from exactly_once.db import jdbc_options
from exactly_once.kafka_client import KafkaClient
from exactly_once.spark.copy_writer import write_staging
from exactly_once.spark.runners import ConnectRunner, job_runner
from exactly_once.spark.settings import JobSettings
from exactly_once.sqlstates import record_failure
from exactly_once_stack.settings import passwords
from tests.dags.test_kafka_connection import Processes, assert_no_secret_in
from tests.job_role import job_db_url
from tests.spark.conftest import CONNECTION
from tests.spark.poison import Orders
from tests.spark.test_poison import POISON, assert_each_poison_record_is_its_dead_letter, produce_poison_among_valid


@pytest.fixture
def orders(ledger_db, kafka_servers, topic) -> Orders:
    return Orders(ledger_db, kafka_servers, topic,
                  bad=frozenset(value for value, _, reason in POISON.values() if reason is not None))


def test_each_poison_record_is_the_dead_letter_it_is_on_local_spark_and_the_rest_commits(
        connect_server, orders, monkeypatch):
    monkeypatch.setenv(f"AIRFLOW_CONN_{CONNECTION.upper()}", json.dumps(connect_server))
    runner = job_runner(CONNECTION, f"{orders.config.name} increment", orders.config,
                        JobSettings(job_db_url(), KafkaClient.at(orders.servers)))
    assert isinstance(runner, ConnectRunner)
    produce_poison_among_valid(orders)

    with Processes(("SparkConnectServer",)) as server:  # sampled from /proc while the job runs
        checkpoint_id = orders.run(runner=runner)

    assert_each_poison_record_is_its_dead_letter(orders, checkpoint_id)
    # The job's database login reached the server inside the plan: not in its command line or environment.
    assert server.seen
    assert_no_secret_in(sorted(server.seen), "", [urlsplit(job_db_url()).password, passwords()["kafka_pipeline"]])


@pytest.fixture
def session(connect_server):
    created = SparkSession.builder.remote(f"sc://{connect_server['host']}:{connect_server['port']}").create()
    yield created
    created.stop()


def test_failures_no_record_causes_are_not_record_failures_over_connect(session, ledger_db):
    def raises_connection_error(order_id):  # nested: pickled with its code, not imported by the server
        raise ConnectionError(f"lost the price service while pricing {order_id}")

    with pytest.raises(Exception) as environment:  # a UDF's error of its environment, not of a record
        session.createDataFrame([("o1",)], "id string").select(F.udf(raises_connection_error)("id")).collect()
    assert "ConnectionError: lost the price service" in str(environment.value)
    assert record_failure(environment.value) is None

    schema = f"c{uuid.uuid4().hex[:10]}"
    with closing(psycopg2.connect(ledger_db)) as conn, conn, conn.cursor() as cur:
        cur.execute(f"""
            CREATE SCHEMA {schema};
            CREATE TABLE {schema}.refusing (n int CHECK (n > 0), checkpoint_id bigint, attempt int);
            CREATE TABLE {schema}.busy (n int, checkpoint_id bigint, attempt int);
            CREATE FUNCTION {schema}.busy() RETURNS trigger LANGUAGE plpgsql AS $$
            BEGIN RAISE EXCEPTION 'could not serialize access' USING ERRCODE = '40001'; END $$;
            CREATE TRIGGER busy BEFORE INSERT ON {schema}.busy FOR EACH ROW EXECUTE FUNCTION {schema}.busy();
            CREATE SEQUENCE {schema}.tries;
            CREATE TABLE {schema}.once (n int, checkpoint_id bigint, attempt int);
            CREATE FUNCTION {schema}.once() RETURNS trigger LANGUAGE plpgsql AS $$
            BEGIN
                IF nextval('{schema}.tries') = 1 THEN  -- a sequence is not rolled back: only the first try fails
                    RAISE EXCEPTION 'refused once' USING ERRCODE = '23514';
                END IF;
                RETURN NEW;
            END $$;
            CREATE TRIGGER once BEFORE INSERT ON {schema}.once FOR EACH ROW EXECUTE FUNCTION {schema}.once();
        """)

    def failure_writing_to(table: str):
        with pytest.raises(Exception) as refused:
            write_staging(session.createDataFrame([(-1,)], "n int"), f"{schema}.{table}", jdbc_options(ledger_db),
                          {"n": "int4", "checkpoint_id": "int8", "attempt": "int4"}, checkpoint_id=1, attempt=1)
        assert "PostgreSQL refused binary COPY" in str(refused.value)  # an int into int4: binary
        assert not hasattr(refused.value, "java_exception")  # only what the server sent
        return record_failure(refused.value)

    assert failure_writing_to("refusing") == \
        ("23514", 'new row for relation "refusing" violates check constraint "refusing_n_check"')
    assert failure_writing_to("busy") is None  # PostgreSQL refuses, but with a SQLSTATE of no record's (40001)
    # A record's SQLSTATE, as on local Spark: isolation then finds no record that fails on its own
    # and says so (tests/spark/test_isolation.py).
    assert failure_writing_to("once") == ("23514", "refused once")
