"""A pipeline whose orders go to a PostgreSQL table and, through the outbox, to two Kafka
topics (a record per order keyed by sku, and per-checkpoint sku totals), with its model
for the oracle (tests/oracle.py); its runs go through the pipeline's own run path
(exactly_once.orchestration.tasks) with the Spark job in this process, and its publisher
runs here or as the `publish` command, a process of its own that a test can kill or pause."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import uuid
from contextlib import closing

import psycopg2

from exactly_once.config import load_config
from exactly_once.kafka_client import KafkaClient
from exactly_once.ledger.checkpoints import Outcome
from exactly_once.ledger.invariants import violations
from exactly_once.ledger.kafka_offsets import KafkaOffsets
from exactly_once.ledger.protocol import Ledger
from exactly_once.orchestration import tasks
from exactly_once.orchestration.outcomes import TaskOutcome, after_begin
from exactly_once.publishing.publisher import Published, Publisher
from tests import oracle
from tests.job_role import in_process
from tests.kafka_records import Consumed, committed_records, create_topic, produce_transactions
from tests.oracle import Record

TABLES = """
CREATE SCHEMA {s};
CREATE TABLE {s}.orders (id text NOT NULL, sku text NOT NULL, qty bigint NOT NULL,
    kafka_topic text NOT NULL, kafka_partition int NOT NULL, kafka_offset bigint NOT NULL,
    UNIQUE (kafka_topic, kafka_partition, kafka_offset));
CREATE TABLE {s}.order_events (id text NOT NULL, sku text NOT NULL, qty bigint NOT NULL,
    kafka_topic text NOT NULL, kafka_partition int NOT NULL, kafka_offset bigint NOT NULL);
CREATE TABLE {s}.sku_totals (sku text NOT NULL, orders bigint NOT NULL, qty bigint NOT NULL);
"""
SKUS = ("apple", "pear", "plum", "fig", "kiwi")


def order(i: int) -> bytes:
    return json.dumps({"id": f"o{i}", "sku": SKUS[i % len(SKUS)], "qty": i % 7}).encode()


def orders(first: int, n: int) -> list[tuple[int, bytes, bytes]]:
    """(partition, key, value) of n valid orders; one sku's orders in several partitions."""
    return [(i % 3, f"k{i}".encode(), order(i)) for i in range(first, first + n)]


class OutboxPipeline:
    """The pipeline, what was produced to it, and its model."""

    def __init__(self, db_url: str, servers: str, topic: str, on_reprocess: str = "refuse"):
        self.db_url, self.servers, self.topic = db_url, servers, topic
        self.name = name = f"k{uuid.uuid4().hex[:10]}"
        with closing(psycopg2.connect(db_url)) as conn, conn, conn.cursor() as cur:
            cur.execute(TABLES.format(s=name))
        self.events_topic, self.totals_topic = f"{name}_events", f"{name}_totals"
        create_topic(servers, self.events_topic, partitions=4)
        create_topic(servers, self.totals_topic, partitions=2)
        self.config = load_config({
            "name": name,
            "source": {"topics": [topic], "value_schema": {"id": "string", "sku": "string", "qty": "bigint"}},
            "sinks": [
                {"name": "orders", "table": f"{name}.orders", "mode": "append"},
                {"name": "events", "table": f"{name}.order_events", "mode": "kafka", "keys": ["sku"],
                 "topic": self.events_topic, "on_reprocess": on_reprocess},
                {"name": "totals", "table": f"{name}.sku_totals", "mode": "kafka", "keys": ["sku"],
                 "measures": {"orders": "count", "qty": "sum"}, "topic": self.totals_topic,
                 "on_reprocess": on_reprocess},
            ],
        })
        self.ledger = Ledger(self.config, lambda: psycopg2.connect(db_url))
        self.records: list[Record] = []
        self.runs = 0

    def produce(self, records: list[tuple[int, bytes | None, bytes]], commit: bool = True) -> None:
        produced = produce_transactions(self.servers, self.topic, [(commit, records)])
        self.records += [Record(self.topic, p.partition, p.offset, p.key, p.value) for p in produced if commit]

    def row_of(self, record: Record) -> dict | None:
        try:
            return {**json.loads(record.value), "orders": 1}
        except ValueError:
            return None  # a dead letter: published nowhere

    def begin(self) -> int | None:
        self.runs += 1
        with KafkaOffsets(KafkaClient.at(self.servers)) as kafka:
            begun = tasks.begin_checkpoint(self.ledger, kafka, f"run{self.runs}", None, None)
        return begun.checkpoint.id if after_begin(begun) is TaskOutcome.DONE else None

    def increment(self, spark, checkpoint_id: int) -> None:
        tasks.run_increment(self.ledger, checkpoint_id, in_process(spark, self.config.name, self.servers))

    def commit(self, checkpoint_id: int) -> None:
        assert tasks.commit_checkpoint(self.ledger, checkpoint_id, 1) is Outcome.COMMITTED

    def run(self, spark) -> int:
        """begin, increment, commit: a run that has not published yet."""
        checkpoint_id = self.begin()
        self.increment(spark, checkpoint_id)
        self.commit(checkpoint_id)
        return checkpoint_id

    def publish(self, **options) -> list[Published]:
        return Publisher(self.config, self.ledger.connect, KafkaClient.at(self.servers), **options).publish()

    def publish_process(self, faults: str = "", *options: str) -> subprocess.Popen:
        """The `publish` command, with fault points switched on (exactly_once.faults)."""
        return subprocess.Popen([sys.executable, "-m", "exactly_once", "publish", self.name, *options],
                                env={**os.environ, "EXACTLY_ONCE_FAULTS": faults}, stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True)

    def published(self, topic: str) -> list[Consumed]:
        return committed_records(self.servers, topic)

    def sql(self, statement: str, *params) -> list[tuple]:
        with closing(psycopg2.connect(self.db_url)) as conn, conn, conn.cursor() as cur:
            cur.execute(statement, params)
            return cur.fetchall() if cur.description else []

    def outbox_rows(self) -> int:
        return self.sql("SELECT count(*) FROM exactly_once.outbox WHERE pipeline = %s", self.name)[0][0]

    def assert_exact(self) -> None:
        """The table, both topics and the dead letters equal the model's, to the row (no
        record lost, duplicated or wrong); the ledger's invariants hold."""
        oracle.assert_exact(oracle.expected(self.config, self.records, self.row_of),
                            oracle.actual(self.db_url, self.config, self.servers))
        with closing(psycopg2.connect(self.db_url)) as conn:
            assert violations(conn, self.config) == []
