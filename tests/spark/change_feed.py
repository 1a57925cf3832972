"""A source table and its Debezium change feed, replicated by a pipeline with `source.envelope:
debezium`: the source database is modelled here (its rows, each change at the next LSN, as
Debezium's PostgreSQL connector writes the events: with or without the JSON converter's schema
part, or as its Avro converter does through the stack's schema registry (`AvroEvents`, two
writer schemas), a tombstone after each delete, a key update as a delete and a create), the events go to a
topic's partitions at random (so a key's changes come in any partition and any checkpoint), and
the oracle compares the replicated table with the source table, to the row; the audit table
with every event; the dead letters with every event that is none, with its reason."""

from __future__ import annotations

import json
import random
import struct
import uuid
from contextlib import closing
from dataclasses import dataclass, replace
from decimal import Decimal

import psycopg2
import pytest

from exactly_once import connections
from exactly_once.config import PipelineConfig, load_config
from exactly_once.debezium import NO_POSITION, UNAPPLIED_TRUNCATE
from exactly_once.errors import AttemptFailed
from exactly_once.faults import ENV as FAULTS
from exactly_once.kafka_client import KafkaClient
from exactly_once.ledger.checkpoints import Outcome
from exactly_once.ledger.invariants import violations
from exactly_once.ledger.kafka_offsets import KafkaOffsets
from exactly_once.ledger.protocol import Ledger
from exactly_once.orchestration import tasks
from exactly_once.orchestration.outcomes import TaskOutcome, after_begin
from tests.job_role import in_process
from tests.kafka_records import produce_transactions
from tests.oracle import assert_same_rows
from tests.spark.avro_orders import REGISTRY

TABLES = """
CREATE SCHEMA {s};
CREATE TABLE {s}.items (id int PRIMARY KEY, name varchar(20) NOT NULL, qty int NOT NULL,
    debezium_position numeric(38,0) NOT NULL, kafka_topic text NOT NULL, kafka_partition int NOT NULL,
    kafka_offset bigint NOT NULL, kafka_timestamp timestamptz NOT NULL);
CREATE TABLE {s}.changes (id int NOT NULL, name text, qty int, debezium_op text NOT NULL,
    debezium_position numeric(38,0) NOT NULL, kafka_topic text NOT NULL, kafka_partition int NOT NULL,
    kafka_offset bigint NOT NULL, UNIQUE (kafka_topic, kafka_partition, kafka_offset));
"""
SCHEMA_PART = {"type": "struct", "optional": False, "name": "source.public.items.Envelope", "fields": [
    {"field": "before", "type": "struct", "optional": True, "fields": [
        {"field": "id", "type": "int32"}, {"field": "name", "type": "string"}, {"field": "qty", "type": "int32"}]},
    {"field": "op", "type": "string"}]}  # abridged: the pipeline reads the payload only


@dataclass(frozen=True)
class Event:
    """A record as sent: its value (None: a tombstone), what it says (the source change it is,
    None for a tombstone or a hostile record), its dead letter's reason if any; where it landed."""

    value: bytes | None
    op: str | None = None
    row: dict | None = None        # the image the event's row takes: after, or a delete's before
    position: int | None = None
    dead: str | None = None
    partition: int = -1
    offset: int = -1


class SourceTable:
    """The source database's table `items` (id, name, qty) and the change events its log makes,
    as Debezium's PostgreSQL connector writes them: each change at the next LSN, its
    `source.sequence` [the commit of the transaction streamed before it, its LSN]."""

    def __init__(self, seed: int):
        self.rows: dict[int, dict] = {}
        self.lsn, self.tx = 10_000_000, 500
        self.last_commit: int | None = None  # of the transaction streamed last: none before the first
        self.in_transaction = False
        self.random = random.Random(seed)

    def _event(self, op: str, before: dict | None, after: dict | None, lsn: int,
               sequence: tuple[int | None, int] | None = None) -> Event:
        first, _ = sequence or (self.last_commit, lsn)
        event = {"before": before, "after": after, "op": op, "ts_ms": 1_780_000_000_000 + lsn,
                 "source": {"connector": "postgresql", "name": "source", "lsn": lsn, "txId": self.tx,
                            "sequence": json.dumps([None if first is None else str(first), str(lsn)]),
                            "ts_ms": 1_780_000_000_000 + lsn, "snapshot": "true" if op == "r" else "false",
                            "db": "source", "schema": "public", "table": "items"}}
        if self.random.random() < 0.5:  # the JSON converter with schemas.enable
            event = {"schema": SCHEMA_PART, "payload": event}
        # the position the pipeline computes: commit order, then snapshot reads first, then the LSN
        position = int(f"{first or 0:018d}{0 if op == 'r' else 1}{lsn:019d}")
        return Event(json.dumps(event).encode(), op, before if op == "d" else after, position)

    def _next(self) -> int:
        self.lsn += self.random.randint(1, 80)
        return self.lsn

    def _committed(self, events: list[Event]) -> list[Event]:
        """A change's events; outside a transaction() it commits at once."""
        if not self.in_transaction:
            self.last_commit, self.tx = self._next(), self.tx + 1
        return events

    def preexisting(self, ids) -> None:
        """Rows the table held before Debezium was started: no event; the initial snapshot reads them."""
        for i in ids:
            self.rows[i] = {"id": i, "name": f"item {i}", "qty": i}

    def insert(self, id: int, name: str, qty: int) -> list[Event]:
        self.rows[id] = {"id": id, "name": name, "qty": qty}
        return self._committed([self._event("c", None, dict(self.rows[id]), self._next())])

    def update(self, id: int, **changes) -> list[Event]:
        self.rows[id] = {**self.rows[id], **changes}
        return self._committed([self._event("u", None, dict(self.rows[id]), self._next())])  # no before: default

    def delete(self, id: int) -> list[Event]:
        del self.rows[id]
        return self._committed([self._event("d", {"id": id, "name": None, "qty": None}, None, self._next()),
                                Event(None)])

    def rekey(self, old: int, new: int) -> list[Event]:
        """An update of the primary key: Debezium writes a delete of the old key, its tombstone,
        then a create of the new one."""
        row = {**self.rows.pop(old), "id": new}
        self.rows[new] = row
        return self._committed([self._event("d", {"id": old, "name": None, "qty": None}, None, self._next()),
                                Event(None), self._event("c", None, dict(row), self._next())])

    def truncate(self) -> list[Event]:
        """TRUNCATE of the table: Debezium's truncate event (no images; a record key of none)."""
        self.rows.clear()
        return self._committed([self._event("t", None, None, self._next())])

    def transaction(self, *changes) -> list[Event]:
        """Several changes in one source transaction (one txId, one commit)."""
        self.in_transaction = True
        events = [e for change in changes for e in change()]
        self.in_transaction = False
        return self._committed(events)

    def initial_snapshot(self, in_flight: int, **changes) -> list[Event]:
        """Debezium's first snapshot while a transaction that changes row `in_flight` is open: it
        wrote its change (at an LSN below the snapshot's) before the snapshot began and commits
        after; the snapshot reads the row as it was. Its streamed change must win."""
        written, snapshot = self._next(), self._next()
        reads = [self._event("r", None, dict(row), snapshot, sequence=(None, snapshot)) for row in self.rows.values()]
        self.rows[in_flight] = {**self.rows[in_flight], **changes}
        change = self._event("u", None, dict(self.rows[in_flight]), written)  # the first streamed: no commit before
        return reads + self._committed([change])

    def hostile(self, id: int, truncates: bool = False) -> list[Event]:
        """Records that are no change to apply, each with its dead letter's reason: the source
        table does not change. `truncates`: the pipeline applies truncates, so the hostile one
        is a truncate without a position."""
        lsn = self._next()

        def raw(event: dict, why: str) -> Event:
            return Event(json.dumps(event).encode(), dead=why)

        source = {"lsn": lsn, "txId": self.tx}
        return [
            raw({"id": id, "name": "x", "qty": 1}, "value is no Debezium change event: it has no op"),
            raw({"op": "x", "source": source}, "op x is none of c, r, u, d, t"),
            raw({"op": "c", "before": None, "after": None, "source": source}, "op c has no after image"),
            raw({"op": "t", "source": {"db": "source"}}, NO_POSITION) if truncates else
            raw({"op": "t", "source": source}, UNAPPLIED_TRUNCATE),
            raw({"op": "u", "after": {"id": id, "name": "x", "qty": "many"}, "source": source},
                "value does not fit the change event's schema: after.qty: not int"),
            raw({"schema": SCHEMA_PART, "payload": {"op": "u", "after": {"id": "eight", "name": "x", "qty": 1},
                                                    "source": source}},
                "value does not fit the change event's schema: after.id: not int"),
            raw({"op": "d", "before": {"name": "x"}, "source": source},
                "op d: its before image lacks the key column(s) id (the source table's replica identity must hold "
                "them)"),
            raw({"op": "c", "after": {"id": id, "name": "x", "qty": 1}, "source": {"db": "source"}},
                NO_POSITION),
            raw({"op": "u", "after": {"id": id, "name": "nul\x00here", "qty": 1}, "source": source},
                "sink items: column name: contains NUL (0x00)"),
            raw({"op": "u", "after": {"id": id, "name": "n" * 25, "qty": 1}, "source": source},
                "sink items: column name: 25 characters, longer than character varying(20)"),
            # a delete the audit table refuses deletes nothing
            raw({"op": "d", "before": {"id": id, "name": "nul\x00here", "qty": None}, "source": source},
                "sink changes: column name: contains NUL (0x00)"),
            Event(b"\xff\xfe{", dead="value is not valid UTF-8"),
            Event(b'{"op": "c", "after": ', dead="value is not valid JSON"),
        ]


def _envelope(value: dict) -> dict:
    """Debezium's Avro writer schema of `items`' events: version 1, or 2, whose row images have a
    column more (added with a default, as the registry's BACKWARD rule allows)."""
    columns = [{"name": "id", "type": "int"}, {"name": "name", "type": ["null", "string"], "default": None},
               {"name": "qty", "type": ["null", "int"], "default": None}, *value.get("more", [])]
    optional = {"long": ["null", "long"], "string": ["null", "string"]}
    source = [{"name": n, "type": t} for n, t in (("version", "string"), ("connector", "string"), ("name", "string"),
                                                   ("ts_ms", "long"), ("db", "string"), ("schema", "string"),
                                                   ("table", "string"))]
    source += [{"name": n, "type": optional[t], "default": None}
               for n, t in (("snapshot", "string"), ("sequence", "string"), ("txId", "long"), ("lsn", "long"))]
    return {"type": "record", "name": "Envelope", "namespace": "source.public.items", "fields": [
        {"name": "before", "type": ["null", {"type": "record", "name": "Value", "fields": columns}], "default": None},
        {"name": "after", "type": ["null", "Value"], "default": None},
        {"name": "source", "type": {"type": "record", "name": "Source", "namespace": "io.debezium.connector.postgresql",
                                    "fields": source}},
        {"name": "op", "type": "string"}, {"name": "ts_ms", "type": ["null", "long"], "default": None}]}


AVRO_WRITERS = {1: _envelope({}), 2: _envelope({"more": [{"name": "note", "type": ["null", "string"],
                                                          "default": None}]})}


class AvroEvents:
    """The model's events as Debezium's Avro converter writes them (confluent-kafka's
    AvroSerializer, the stack's schema registry), each with writer schema 1 or 2 at random."""

    def __init__(self, topic: str, seed: int):
        from confluent_kafka.schema_registry.avro import AvroSerializer

        from tests.spark.avro_orders import registry_client

        self.topic, self.random = topic, random.Random(seed)
        self.serializers = {v: AvroSerializer(registry_client(), json.dumps(w), conf={"auto.register.schemas": True})
                            for v, w in AVRO_WRITERS.items()}

    def write(self, event: dict, version: int | None = None) -> bytes:
        from confluent_kafka.serialization import MessageField, SerializationContext

        event = event.get("payload", event)
        source = {k: event["source"].get(k) for k in ("ts_ms", "snapshot", "sequence", "txId", "lsn")}
        record = {"before": event.get("before"), "after": event.get("after"), "op": event["op"],
                  "ts_ms": event.get("ts_ms"), "source": {"version": "3.6.1.Final", "connector": "postgresql",
                                                          "name": "source", "db": "source", "schema": "public",
                                                          "table": "items", **source}}
        serializer = self.serializers[version or self.random.choice(list(self.serializers))]
        return serializer(record, SerializationContext(self.topic, MessageField.VALUE))

    def __call__(self, value: bytes | None) -> bytes | None:
        return None if value is None else self.write(json.loads(value))

    def hostile(self, lsn: int) -> list[Event]:
        """Records the Avro envelope does not apply, each with its dead letter's reason."""
        source = {"ts_ms": 1_780_000_000_000, "lsn": lsn, "sequence": json.dumps([None, str(lsn)])}
        row = {"id": 8, "name": "x", "qty": 1}
        valid = self.write({"op": "c", "after": row, "source": source}, 1)
        schema_id = struct.unpack(">I", valid[1:5])[0]
        return [
            Event(b"plain", dead="value is not in the schema registry's wire format (magic byte 0 and a 4-byte schema "
                                 "id, then the Avro payload)"),
            Event(valid[:7], dead=f"value does not decode with its writer schema (id {schema_id}) into the reader "
                                  f"schema"),
            Event(self.write({"op": "t", "source": source}), dead=UNAPPLIED_TRUNCATE),
            Event(self.write({"op": "x", "after": row, "source": source}), dead="op x is none of c, r, u, d, t"),
            Event(self.write({"op": "c", "source": source}), dead="op c has no after image"),
            Event(self.write({"op": "u", "after": {**row, "name": "nul\x00here"}, "source": source}),
                  dead="sink items: column name: contains NUL (0x00)"),
        ]


class ChangeFeed:
    """The pipeline replicating `items` from `topic`, run through the product's run path; its
    events as Debezium's JSON converter writes them, or its Avro converter (`avro`)."""

    def __init__(self, db_url: str, servers: str, topic: str, seed: int = 7, avro: bool = False,
                 truncates: bool = False):
        self.db_url, self.servers, self.topic, self.truncates = db_url, servers, topic, truncates
        self.source = SourceTable(seed)
        self.avro = AvroEvents(topic, seed) if avro else None
        self.registry = connections.schema_registry(REGISTRY) if avro else None
        self.config = self._config()
        self.ledger = Ledger(self.config, lambda: psycopg2.connect(db_url))
        self.sent: list[Event] = []
        self.runs = 0
        self.mirrors_source = True  # every change sent, and applied: the replica is the source table

    def _config(self) -> PipelineConfig:
        name = f"p{uuid.uuid4().hex[:10]}"
        with closing(psycopg2.connect(self.db_url)) as conn, conn, conn.cursor() as cur:
            cur.execute(TABLES.format(s=name))
        return load_config({
            "name": name,
            "source": {"topics": [self.topic], "envelope": "debezium",
                       "value_schema": {"id": "int", "name": "string", "qty": "int"},
                       **({"on_truncate": "truncate"} if self.truncates else {}),
                       **({"value_format": "avro", "schema_registry": REGISTRY} if self.avro else {})},
            "sinks": [{"name": "items", "table": f"{name}.items", "mode": "upsert", "keys": ["id"],
                       "order_by": "debezium_position"},
                      {"name": "changes", "table": f"{name}.changes", "mode": "append"}]})

    def apply_truncates(self, apply: bool) -> None:
        """The pipeline's configuration changed to apply truncates or to leave them unapplied
        (dead letters), as a user would before a reprocessing; the model's truncates sent
        become such dead letters, or truncates again."""
        source = {**self.config.source.model_dump(), "on_truncate": "truncate" if apply else "dead_letter"}
        self.config = load_config({**self.config.model_dump(), "source": source})
        self.ledger = Ledger(self.config, lambda: psycopg2.connect(self.db_url))
        self.sent = [replace(e, dead=None if apply else UNAPPLIED_TRUNCATE) if e.op == "t" else e for e in self.sent]
        self.truncates = self.mirrors_source = apply

    def hostile(self, id: int) -> list[Event]:
        """Records that are no change to apply, in the feed's format, each with its reason."""
        return self.avro.hostile(self.source._next()) if self.avro else self.source.hostile(id, self.truncates)

    def produce(self, events: list[Event]) -> None:
        """The events in one Kafka transaction, each to a partition at random; the model's
        events in the feed's format (hostile ones are in it already)."""
        if self.avro:  # the model's (not yet produced: sent again, an event is in the feed's format)
            events = [Event(self.avro(e.value), e.op, e.row, e.position) if e.offset < 0 and not e.dead else e
                      for e in events]
        partitions = [self.source.random.randrange(3) for _ in events]
        produced = produce_transactions(self.servers, self.topic, [(True, [
            (p, b'{"id": 0}', e.value) for p, e in zip(partitions, events)])])
        delivered = {}  # in delivery order: matched by partition and value, in the order sent
        for p in produced:
            delivered.setdefault((p.partition, p.value), []).append(p)
        for partition, event in zip(partitions, events):
            p = delivered[(partition, event.value)].pop(0)
            self.sent.append(Event(event.value, event.op, event.row, event.position, event.dead, p.partition,
                                   p.offset))

    def begin(self) -> int | None:
        self.runs += 1
        with KafkaOffsets(KafkaClient.at(self.servers)) as kafka:
            begun = tasks.begin_checkpoint(self.ledger, kafka, f"run{self.runs}", None, None)
        return begun.checkpoint.id if after_begin(begun) is TaskOutcome.DONE else None

    def increment(self, spark, checkpoint_id: int, runner=None) -> None:
        tasks.run_increment(self.ledger, checkpoint_id,
                            runner or in_process(spark, self.config.name, self.servers, self.registry))

    def commit(self, checkpoint_id: int) -> Outcome:
        return tasks.commit_checkpoint(self.ledger, checkpoint_id, 1)

    def run(self, spark, runner=None) -> int:
        checkpoint_id = self.begin()
        assert checkpoint_id is not None
        self.increment(spark, checkpoint_id, runner)
        assert self.commit(checkpoint_id) is Outcome.COMMITTED
        return checkpoint_id

    def expected(self) -> dict[str, set]:
        applied = [e for e in self.sent if e.op is not None and e.dead is None]
        newest = {}

        def order(e: Event) -> tuple[int, int, int]:
            return e.position, e.partition, e.offset

        for e in sorted((e for e in applied if e.op != "t"), key=order):
            newest[e.row["id"]] = e
        # a truncate empties the replica of every change older than it, whenever either came
        truncation = max((order(e) for e in applied if e.op == "t"), default=None)
        items = {(id, e.row["name"], e.row["qty"], Decimal(e.position), e.partition, e.offset)
                 for id, e in newest.items() if e.op != "d" and (truncation is None or order(e) > truncation)}
        # the replica is the source table: its rows, each from the newest change of its key
        assert not self.mirrors_source or {(i, n, q) for i, n, q, *_ in items} == {
            (r["id"], r["name"], r["qty"]) for r in self.source.rows.values()}
        return {"items": items,
                "changes": {(e.row["id"], e.row["name"], e.row["qty"], e.op, Decimal(e.position), e.partition,
                             e.offset) for e in applied if e.op != "t"},  # an append sink takes no truncate
                "dead_letters": {(e.partition, e.offset, e.dead) for e in self.sent if e.dead is not None}}

    def actual(self) -> dict[str, set]:
        name = self.config.name
        with closing(psycopg2.connect(self.db_url)) as conn, conn.cursor() as cur:
            cur.execute(f"SELECT id, name, qty, debezium_position, kafka_partition, kafka_offset FROM {name}.items")
            items = cur.fetchall()
            cur.execute(f"SELECT id, name, qty, debezium_op, debezium_position, kafka_partition, kafka_offset "
                        f"FROM {name}.changes")
            changes = cur.fetchall()
            cur.execute('SELECT partition, "offset", reason FROM exactly_once.dead_letters WHERE pipeline = %s',
                        (name,))
            dead = cur.fetchall()
            assert len(changes) == len(set(changes)) and len(dead) == len(set(dead)), "a record counted twice"
            assert violations(conn, self.config) == []
        return {"items": set(items), "changes": set(changes), "dead_letters": set(dead)}

    def assert_exact(self) -> None:
        assert_same_rows(self.expected(), self.actual())


class Run:
    """A DAG run of the feed: in this process's Spark session, or by `runner`."""

    def __init__(self, feed: ChangeFeed, spark, runner=None):
        self.feed, self.spark, self.runner = feed, spark, runner

    def __call__(self) -> int:
        return self.feed.run(self.spark, self.runner)


def failed_once_and_retried(feed: ChangeFeed, run: Run, monkeypatch) -> int:
    """A checkpoint whose first Spark job fails after staging the replicated table, retried,
    committed, and its commit replayed."""
    checkpoint = feed.begin()
    monkeypatch.setenv(FAULTS, "increment.wrote.items=raise")
    with pytest.raises(AttemptFailed, match="InjectedFault: fault injected at increment.wrote.items"):
        feed.increment(run.spark, checkpoint, run.runner)
    monkeypatch.delenv(FAULTS)
    feed.increment(run.spark, checkpoint, run.runner)  # the task's retry: a new attempt
    assert feed.commit(checkpoint) is Outcome.COMMITTED
    assert feed.commit(checkpoint) is Outcome.ALREADY_COMMITTED  # a commit replayed changes nothing
    return checkpoint
