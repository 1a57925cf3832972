"""A pipeline of orders whose final tables refuse what PostgreSQL refuses, with its model
for the oracle (tests/oracle.py), and one run of it through the pipeline's own run path
(exactly_once.orchestration.tasks) with the Spark job in this process."""

from __future__ import annotations

import json
import uuid
from collections.abc import Callable
from contextlib import closing
from datetime import datetime, timezone
from decimal import Decimal

import psycopg2

from exactly_once.config import PipelineConfig, load_config
from exactly_once.kafka_client import KafkaClient
from exactly_once.ledger.checkpoints import Outcome, TaskTry
from exactly_once.ledger.invariants import violations
from exactly_once.ledger.kafka_offsets import KafkaOffsets
from exactly_once.ledger.protocol import Ledger
from exactly_once.orchestration import tasks
from exactly_once.orchestration.outcomes import TaskOutcome, after_begin
from exactly_once.spark.report import AttemptReport
from tests import oracle
from tests.job_role import in_process
from tests.kafka_records import produce_transactions
from tests.oracle import Record

TRANSFORM = "tests.spark.transforms:refuses_one_order"
TABLES = """
CREATE SCHEMA {s};
CREATE TABLE {s}.latest (sku varchar(8) PRIMARY KEY, price numeric(6,2) NOT NULL,
    kafka_partition int NOT NULL, kafka_offset bigint NOT NULL);
CREATE TABLE {s}.per_sku (sku varchar(8) PRIMARY KEY, orders bigint NOT NULL, quantity bigint NOT NULL);
CREATE DOMAIN {s}.quantity AS int CHECK (VALUE <> -1);
CREATE TABLE {s}.orders (id text NOT NULL, sku varchar(8) NOT NULL, note text NOT NULL,
    price numeric(6,2) NOT NULL, at timestamptz NOT NULL, qty {s}.quantity NOT NULL CHECK (qty < 1000),
    kafka_topic text NOT NULL, kafka_partition int NOT NULL, kafka_offset bigint NOT NULL,
    UNIQUE (kafka_topic, kafka_partition, kafka_offset));
CREATE FUNCTION {s}.refuse_cursed() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF NEW.id = 'cursed' THEN RAISE EXCEPTION 'order % is cursed', NEW.id; END IF;
    RETURN NEW;
END $$;
CREATE TRIGGER refuse_cursed BEFORE INSERT ON {s}.orders FOR EACH ROW EXECUTE FUNCTION {s}.refuse_cursed();
"""
AT = "2026-01-01T00:00:00Z"


def make_pipeline(db_url: str, topic: str, extra_ddl: str = "", transform: str = TRANSFORM) -> PipelineConfig:
    name = f"p{uuid.uuid4().hex[:10]}"
    with closing(psycopg2.connect(db_url)) as conn, conn, conn.cursor() as cur:
        cur.execute(TABLES.format(s=name) + extra_ddl.format(s=name))
    return load_config({
        "name": name, "transform": transform,
        "source": {"topics": [topic], "value_schema": {"id": "string", "sku": "string", "note": "string",
                                                       "price": "decimal(10,3)", "at": "timestamp",
                                                       "qty": "bigint"}},
        "sinks": [
            {"name": "latest", "table": f"{name}.latest", "mode": "upsert", "keys": ["sku"]},
            {"name": "per_sku", "table": f"{name}.per_sku", "mode": "aggregate", "keys": ["sku"],
             "measures": {"orders": "count", "quantity": "sum"}},
            {"name": "orders", "table": f"{name}.orders", "mode": "append"},
        ],
    })


def order(order_id: str, sku: str = "apple", note: str = "ok", price: str = "1.25", at: str = AT,
          qty: int = 1) -> bytes:
    return json.dumps({"id": order_id, "sku": sku, "note": note, "price": price, "at": at, "qty": qty}).encode()


def valid_orders(first: int, n: int) -> list[tuple[int, bytes, bytes]]:
    """(partition, key, value) of n valid orders over three partitions and three skus."""
    return [(i % 3, f"k{i}".encode(), order(f"o{i}", ("apple", "pear", "plum")[i % 3], price=f"{i}.5", qty=i % 7))
            for i in range(first, first + n)]


class Orders:
    """The pipeline, what was produced to it, and its model."""

    def __init__(self, db_url: str, servers: str, topic: str, bad: frozenset[bytes] = frozenset(), **tables):
        self.db_url, self.servers, self.topic = db_url, servers, topic
        self.config = make_pipeline(db_url, topic, **tables)
        self.ledger = Ledger(self.config, lambda: psycopg2.connect(db_url))
        self.bad = set(bad)      # values the model says are dead letters
        self.records: list[Record] = []
        self.runs = 0

    def produce(self, records: list[tuple[int, bytes | None, bytes]]) -> None:
        produced = produce_transactions(self.servers, self.topic, [(True, records)])
        self.records += [Record(self.topic, p.partition, p.offset, p.key, p.value) for p in produced]

    def row_of(self, record: Record) -> dict | None:
        if record.value in self.bad:
            return None
        v = json.loads(record.value)
        return {**v, "price": Decimal(v["price"]), "at": datetime(2026, 1, 1, tzinfo=timezone.utc),
                "quantity": v["qty"]}

    def begin(self) -> int | None:
        """A run's first task; the checkpoint, or None when there is nothing to read."""
        self.runs += 1
        with KafkaOffsets(KafkaClient.at(self.servers)) as kafka:
            begun = tasks.begin_checkpoint(self.ledger, kafka, f"run{self.runs}", None, None)
        return begun.checkpoint.id if after_begin(begun) is TaskOutcome.DONE else None

    def increment(self, spark, checkpoint_id: int, runner: Callable[[list[str]], AttemptReport] | None = None,
                  cleared: bool = False) -> None:
        """The run's increment task (or, `cleared`, one an operator cleared: its try begins
        now): the Spark job run by `runner`, as the Airflow task runs it
        (exactly_once.spark.runners), else in this process's session as the job role."""
        tasks.run_increment(self.ledger, checkpoint_id, runner or in_process(spark, self.config.name, self.servers),
                            TaskTry(2, self.ledger.now()) if cleared else None)

    def run(self, spark=None, runner: Callable[[list[str]], AttemptReport] | None = None) -> int | None:
        """A whole DAG run: begin, increment, commit."""
        checkpoint_id = self.begin()
        if checkpoint_id is not None:
            self.increment(spark, checkpoint_id, runner)
            assert tasks.commit_checkpoint(self.ledger, checkpoint_id, 1) is Outcome.COMMITTED
        return checkpoint_id

    def dead_letter_reasons(self) -> dict[tuple[int, int], str]:
        with closing(psycopg2.connect(self.db_url)) as conn, conn.cursor() as cur:
            cur.execute('SELECT partition, "offset", reason FROM exactly_once.dead_letters WHERE pipeline = %s',
                        (self.config.name,))
            return {(p, o): reason for p, o, reason in cur.fetchall()}

    def assert_exact(self) -> None:
        """The final tables and dead letters equal the model's, to the row; the ledger's invariants hold."""
        oracle.assert_exact(oracle.expected(self.config, self.records, self.row_of),
                            oracle.actual(self.db_url, self.config))
        with closing(psycopg2.connect(self.db_url)) as conn:
            assert violations(conn, self.config) == []


def written_table_by_table(*args, **kwargs):
    """`StagingWrites.every_table` where a test's write must be the one pass."""
    raise AssertionError("written table by table")
