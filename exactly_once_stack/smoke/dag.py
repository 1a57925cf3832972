"""Checks the whole local stack in one run: a transactional Kafka producer,
Spark reading a bounded range with read_committed through the spark_default
connection, and PostgreSQL holding the result.

produce (1 aborted and 1 committed transaction) -> count in Spark (job.py) -> verify.

A check of the local services, not a product DAG: it lives outside dags/, and Airflow
reads it with this folder as its DAGs folder (tests/stack/test_airflow.py).
"""

from __future__ import annotations

import os
import time
from pathlib import Path

import pendulum
from airflow.providers.apache.spark.operators.spark_submit import SparkSubmitOperator
from airflow.sdk import dag, task

TOPIC = "stack_smoke"
COMMITTED = 5
JOB = str(Path(__file__).resolve().with_name("job.py"))


@dag(schedule=None, start_date=pendulum.datetime(2026, 1, 1, tz="UTC"), catchup=False,
     tags=["stack"], max_active_runs=1)
def stack_smoke():
    @task
    def produce(run_id: str | None = None) -> dict[str, list[int]]:
        from confluent_kafka import Consumer, Producer, TopicPartition
        from confluent_kafka.admin import AdminClient, NewTopic

        servers = os.environ["KAFKA_BOOTSTRAP_SERVERS"]
        admin = AdminClient({"bootstrap.servers": servers})
        if TOPIC not in admin.list_topics(timeout=10).topics:
            admin.create_topics([NewTopic(TOPIC, 1, 1)])[TOPIC].result()
        start = _high_watermark(Consumer, TopicPartition, servers)

        producer = Producer({"bootstrap.servers": servers, "transactional.id": f"stack_smoke-{run_id}"})
        producer.init_transactions()
        producer.begin_transaction()
        producer.produce(TOPIC, b"aborted")
        producer.flush()  # on the broker before the abort, or librdkafka just drops it
        producer.abort_transaction()
        offsets = []
        producer.begin_transaction()
        for i in range(COMMITTED):
            producer.produce(TOPIC, f"{run_id}:{i}".encode(), on_delivery=lambda err, msg: offsets.append(msg.offset()))
        producer.commit_transaction()
        # The broker writes commit markers after commit_transaction() returns, so
        # the last stable offset reaches our records a moment later.
        deadline = time.monotonic() + 30
        while (end := _high_watermark(Consumer, TopicPartition, servers)) <= max(offsets):
            if time.monotonic() > deadline:
                raise TimeoutError(f"last stable offset of {TOPIC} stuck at {end}, below {max(offsets) + 1}")
            time.sleep(0.1)
        return {"0": [start, end]}

    count = SparkSubmitOperator(
        task_id="count_in_spark",
        conn_id="spark_default",
        name="stack_smoke",
        application=JOB,
        application_args=[
            "--topic", TOPIC,
            "--ranges", "{{ ti.xcom_pull(task_ids='produce') | tojson }}",
            "--run-id", "{{ run_id }}",
        ],
    )

    @task
    def verify(run_id: str | None = None) -> int:
        import psycopg2

        with psycopg2.connect(os.environ["PIPELINE_DB_URL"]) as conn, conn.cursor() as cur:
            cur.execute("SELECT records FROM stack_smoke_counts WHERE run_id = %s", (run_id,))
            found = [row[0] for row in cur.fetchall()]
        if found != [COMMITTED]:
            raise ValueError(f"Spark counted {found} committed records for run {run_id}, expected [{COMMITTED}]")
        return COMMITTED

    produce() >> count >> verify()


def _high_watermark(consumer_cls, partition_cls, servers: str) -> int:
    """With read_committed, the broker answers with the last stable offset."""
    consumer = consumer_cls({"bootstrap.servers": servers, "group.id": "stack_smoke",
                             "isolation.level": "read_committed"})
    try:
        return consumer.get_watermark_offsets(partition_cls(TOPIC, 0), timeout=10)[1]
    finally:
        consumer.close()


stack_smoke()
