"""A pipeline of Avro orders keyed by customer, read through the stack's schema registry: its
final tables, three writer schemas of one subject, records as confluent-kafka's
AvroSerializer writes them (so the bytes are a real producer's), and the model the oracle
compares to — one row per order; per customer the newest record, gone when it is a
tombstone; a dead letter, with its reason, per hostile record."""

from __future__ import annotations

import json
import struct
import uuid
from collections.abc import Callable
from contextlib import closing
from dataclasses import dataclass

import psycopg2

from exactly_once import connections
from exactly_once.config import PipelineConfig, load_config
from exactly_once.errors import AttemptFailed
from exactly_once.kafka_client import KafkaClient
from exactly_once.ledger.checkpoints import Outcome
from exactly_once.ledger.invariants import violations
from exactly_once.ledger.kafka_offsets import KafkaOffsets
from exactly_once.ledger.protocol import Ledger
from exactly_once.orchestration import tasks
from exactly_once.orchestration.outcomes import TaskOutcome, after_begin
from exactly_once.spark.report import AttemptReport
from tests.job_role import in_process
from tests.kafka_records import produce_transactions
from tests.oracle import assert_same_rows

REGISTRY = "schema_registry_default"
TABLES = """
CREATE SCHEMA {s};
CREATE TABLE {s}.orders (id text NOT NULL, customer text NOT NULL, n bigint NOT NULL, note text NOT NULL,
    source text, kafka_topic text NOT NULL, kafka_partition int NOT NULL, kafka_offset bigint NOT NULL,
    UNIQUE (kafka_topic, kafka_partition, kafka_offset));
CREATE TABLE {s}.latest (customer text PRIMARY KEY, id text NOT NULL, n bigint NOT NULL, note text NOT NULL,
    kafka_partition int NOT NULL, kafka_offset bigint NOT NULL);
"""


def _order(*fields) -> dict:
    return {"type": "record", "name": "Order", "namespace": "tests.avro", "fields": list(fields)}


ID, NOTE = {"name": "id", "type": "string"}, {"name": "note", "type": "string", "default": ""}
# Each version can read the one before (the registry's BACKWARD rule checks it): v2 adds a
# field with a default, v3 widens n from int to long. The pipeline reads every record into v3.
WRITERS = {1: _order(ID, {"name": "n", "type": "int"}),
           2: _order(ID, {"name": "n", "type": "int"}, NOTE),
           3: _order(ID, {"name": "n", "type": "long"}, NOTE)}
READER = WRITERS[3]


@dataclass(frozen=True)
class Sent:
    """A record as produced and what it says: its order (None for a tombstone) or why it is a dead letter."""

    partition: int
    offset: int
    customer: str | None
    order: dict | None
    source: str | None = None
    dead: str | None = None


def registry_client():
    from confluent_kafka.schema_registry import SchemaRegistryClient

    c = connections.schema_registry(REGISTRY)
    return SchemaRegistryClient({"url": c.url, "basic.auth.user.info": ":".join(c.login), **c.tls_settings})


def partition_of(key: bytes | None) -> int:
    return sum(key or b"") % 3  # a customer's records stay in one partition, as upserts by offset need


class AvroOrders:
    def __init__(self, db_url: str, servers: str, topic: str, **source):
        self.db_url, self.servers, self.topic = db_url, servers, topic
        self.subject = f"{topic}-value"
        self.config = self._config(**source)
        self.ledger = Ledger(self.config, lambda: psycopg2.connect(db_url))
        self.registry = connections.schema_registry(REGISTRY)
        self.sent: list[Sent] = []
        self.runs = 0
        self._serializers = {}

    def _config(self, **source) -> PipelineConfig:
        name = f"p{uuid.uuid4().hex[:10]}"
        with closing(psycopg2.connect(self.db_url)) as conn, conn, conn.cursor() as cur:
            cur.execute(TABLES.format(s=name))
        return load_config({
            "name": name, "transform": "tests.spark.transforms:header_source",
            "source": {"topics": [self.topic], "schema_registry": REGISTRY, "value_format": "avro",
                       "value_schema": {"id": "string", "n": "bigint", "note": "string"},
                       "value_reader_schema": json.dumps(READER), "key_format": "string",
                       "key_schema": {"customer": "string"}, "tombstones": "delete", **source},
            "sinks": [{"name": "orders", "table": f"{name}.orders", "mode": "append"},
                      {"name": "latest", "table": f"{name}.latest", "mode": "upsert", "keys": ["customer"]}]})

    def encoded(self, version: int, order: dict) -> bytes:
        """The order as AvroSerializer writes it with writer schema `version` (registered on first use)."""
        from confluent_kafka.schema_registry.avro import AvroSerializer
        from confluent_kafka.serialization import MessageField, SerializationContext

        if version not in self._serializers:
            self._serializers[version] = AvroSerializer(registry_client(), json.dumps(WRITERS[version]),
                                                        conf={"auto.register.schemas": True})
        return self._serializers[version](order, SerializationContext(self.topic, MessageField.VALUE))

    def schema_id(self, version: int) -> int:
        return struct.unpack(">I", self.encoded(version, {"id": "x", "n": 0, "note": ""})[1:5])[0]

    def produce(self, records: list[tuple]) -> None:
        """Each (customer (text, or the key's bytes), value bytes, the order they say or None,
        the dead letter's reason or None, its source header or None), in one transaction."""
        keys = [c.encode() if isinstance(c, str) else c for c, *_ in records]
        produced = produce_transactions(self.servers, self.topic, [(True, [
            (partition_of(key), key, value, [("source", source.encode())] if source else [])
            for key, (_, value, _, _, source) in zip(keys, records)])])
        delivered = {}  # in delivery order, which is not the records' order: matched by key and value
        for p in produced:
            delivered.setdefault((p.key, p.value), []).append(p)
        for key, (customer, value, order, dead, source) in zip(keys, records):
            p = delivered[(key, value)].pop(0)
            self.sent.append(Sent(p.partition, p.offset, customer, order, source, dead))

    def begin(self) -> int | None:
        """A run's first task; the checkpoint, or None when there is nothing to read."""
        self.runs += 1
        with KafkaOffsets(KafkaClient.at(self.servers)) as kafka:
            begun = tasks.begin_checkpoint(self.ledger, kafka, f"run{self.runs}", None, None)
        return begun.checkpoint.id if after_begin(begun) is TaskOutcome.DONE else None

    def run(self, spark, runner: Callable[[list[str]], AttemptReport] | None = None) -> int | None:
        """A whole DAG run through the run path (begin, increment, commit); an attempt failed
        for an unknown schema id is retried once, as the increment task's retry does."""
        checkpoint_id = self.begin()
        if checkpoint_id is not None:
            try:
                self.increment(spark, checkpoint_id, runner=runner)
            except AttemptFailed as failed:  # an unknown schema id's first attempt: the task's retry
                if not (failed.retryable and "is unknown to the schema registry" in str(failed)):
                    raise
                self.increment(spark, checkpoint_id, runner=runner)
            self.commit(checkpoint_id)
        return checkpoint_id

    def commit(self, checkpoint_id: int) -> None:
        assert tasks.commit_checkpoint(self.ledger, checkpoint_id, 1) is Outcome.COMMITTED

    def increment(self, spark, checkpoint_id: int, registry=None,
                  runner: Callable[[list[str]], AttemptReport] | None = None) -> None:
        """The run's increment task: the Spark job run by `runner` as the Airflow task runs it
        (exactly_once.spark.runners), else in this process's session with `registry`."""
        execute = runner or in_process(spark, self.config.name, self.servers, registry or self.registry)
        tasks.run_increment(self.ledger, checkpoint_id, execute)

    def expected(self) -> dict[str, set]:
        deletes = self.config.source.tombstones == "delete"  # skipped ones make nothing; dead letters say why
        good = [s for s in self.sent if s.dead is None and (s.order is not None or deletes)]
        newest = {}
        for s in sorted(good, key=lambda s: s.offset):
            newest[s.customer] = s
        return {
            "orders": {(s.order["id"], s.customer, s.order["n"], s.order.get("note", ""), s.source, self.topic,
                        s.partition, s.offset) for s in good if s.order is not None},
            "latest": {(c, s.order["id"], s.order["n"], s.order.get("note", ""), s.partition, s.offset)
                       for c, s in newest.items() if s.order is not None},
            "dead_letters": {(s.partition, s.offset, s.dead) for s in self.sent if s.dead is not None}}

    def assert_exact(self) -> dict[str, set]:
        """The tables and dead letters equal the model's, to the row (each table's rows shown
        sorted when not); the model's tables."""
        expected = self.expected()
        assert_same_rows(expected, self.actual())
        return expected

    def actual(self) -> dict[str, set]:
        with closing(psycopg2.connect(self.db_url)) as conn, conn.cursor() as cur:
            name = self.config.name
            cur.execute(f"SELECT id, customer, n, note, source, kafka_topic, kafka_partition, kafka_offset "
                        f"FROM {name}.orders")
            orders = cur.fetchall()
            cur.execute(f"SELECT customer, id, n, note, kafka_partition, kafka_offset FROM {name}.latest")
            latest = set(cur.fetchall())
            cur.execute('SELECT partition, "offset", reason FROM exactly_once.dead_letters WHERE pipeline = %s',
                        (name,))
            dead = cur.fetchall()
            assert len(orders) == len(set(orders)) and len(dead) == len(set(dead)), "a record counted twice"
            assert violations(conn, self.config) == []
        return {"orders": set(orders), "latest": latest, "dead_letters": set(dead)}
