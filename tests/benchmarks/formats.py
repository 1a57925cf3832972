"""Avro, Protobuf and Debezium change events beside JSON: N demo orders in each format, each read by a
checkpoint of a copy of the demo pipeline as its tasks run it (plan, spark-submit of the job
with the registry in its settings file, commit), repetitions interleaved (the format that runs
first rotates), medians printed. The JSON topic is the demo's (`produce`: every 7th transaction
aborted, a few malformed and poison orders); the Avro topic holds the same orders' fields as
confluent-kafka's serializer writes them (fastavro, the registry's wire format), every 7th
transaction aborted too, none malformed; the Protobuf topic the same orders as a message of
the registry (its `.proto` text registered), framed as confluent-kafka's serializer frames it,
its price a decimal's text and its time a google.protobuf.Timestamp, decoded by the project's
JVM function; the Debezium topic holds the JSON topic's orders as
the after images of create events with the JSON converter's schema part (`source.envelope:
debezium`, its upsert sink ordered by the source's position).

    ./dev bench-formats [--orders 1000000] [--repetitions 3]
"""

from __future__ import annotations

import argparse
import io
import json
import os
import random
import statistics
import struct
import time
from contextlib import closing
from datetime import datetime, timezone
from decimal import Decimal
from pathlib import Path

import psycopg2

from exactly_once import connections, debezium
from exactly_once.config import load_config
from exactly_once.kafka_client import KafkaClient
from exactly_once.ledger.checkpoints import Outcome
from exactly_once.ledger.kafka_offsets import KafkaOffsets
from exactly_once.ledger.migrate import migrate
from exactly_once.ledger.protocol import Ledger
from exactly_once.orchestration import tasks
from exactly_once.spark.settings import JobSettings
from exactly_once.spark.shipping import launcher
from exactly_once_demo.pipeline import config as demo_config
from exactly_once_demo.produce import SKUS, order, produce
from exactly_once_stack import lifecycle
from exactly_once_stack.settings import LOCAL, process_environment
from tests.benchmarks import copies
from tests.benchmarks.spark_app import increment_job
from tests.benchmarks.throughput import PER_TRANSACTION
from tests.spark.avro_orders import REGISTRY, registry_client
from tests.spark.protobuf_orders import framed, message_class, proto, registered

READER = {"type": "record", "name": "Order", "namespace": "bench", "fields": [
    {"name": "order_id", "type": "string"}, {"name": "sku", "type": "string"}, {"name": "qty", "type": "int"},
    {"name": "price", "type": {"type": "bytes", "logicalType": "decimal", "precision": 12, "scale": 2}},
    {"name": "ts", "type": {"type": "long", "logicalType": "timestamp-micros"}}]}
FORMATS = ("json", "avro", "protobuf", "debezium")
NAMES = {"json": "JSON", "avro": "Avro", "protobuf": "Protobuf", "debezium": "Debezium JSON"}
ORDER_PROTO = proto("""message Order {
  string order_id = 1; string sku = 2; int32 qty = 3; string price = 4; google.protobuf.Timestamp ts = 5;
}""", imports=("google/protobuf/timestamp.proto",))
COLUMNS = {"order_id": "string", "sku": "string", "qty": "int", "price": "decimal(12,2)", "ts": "timestamp"}


def _debezium_schema_part() -> str:
    """The schema part Debezium's JSON converter (schemas.enable, its default) puts in every
    event of a table like the orders, as its PostgreSQL connector writes it."""
    def struct(name: str, optional: bool, fields: list[tuple[str, str, bool]], **extra) -> dict:
        return {"type": "struct", "fields": [{"type": t, "optional": o, "field": f} for f, t, o in fields],
                "optional": optional, "name": name, **extra}

    row = [("order_id", "string", False), ("sku", "string", False), ("qty", "int32", False),
           ("price", "double", False), ("ts", "string", False)]
    source = [("version", "string", False), ("connector", "string", False), ("name", "string", False),
              ("ts_ms", "int64", False), ("snapshot", "string", True), ("db", "string", False),
              ("sequence", "string", True), ("ts_us", "int64", True), ("ts_ns", "int64", True),
              ("schema", "string", False), ("table", "string", False), ("txId", "int64", True),
              ("lsn", "int64", True), ("xmin", "int64", True)]
    envelope = struct("shop.public.orders.Envelope", False, [("op", "string", False), ("ts_ms", "int64", True)],
                      version=2)
    envelope["fields"] = [{**struct("shop.public.orders.Value", True, row), "field": "before"},
                          {**struct("shop.public.orders.Value", True, row), "field": "after"},
                          {**struct("io.debezium.connector.postgresql.Source", False, source), "field": "source"},
                          *envelope["fields"]]
    return json.dumps(envelope)


def debezium_orders():
    """`produce`'s orders (malformed and poison ones alike) as the after images of Debezium's
    create events, with the JSON converter's schema part, each at its own LSN."""
    schema = _debezium_schema_part()

    def encoded(i: int, rng: random.Random, when: datetime) -> tuple[bytes, bytes]:
        key, value = order(i, rng, when)
        millis = int(when.timestamp() * 1000)
        source = (f'{{"version": "3.6.1.Final", "connector": "postgresql", "name": "shop", "ts_ms": {millis}, '
                  f'"snapshot": "false", "db": "shop", "sequence": null, "ts_us": null, "ts_ns": null, '
                  f'"schema": "public", "table": "orders", "txId": {1000 + i // 100}, "lsn": {2**28 + 64 * i}, '
                  f'"xmin": null}}')
        return key, (f'{{"schema": {schema}, "payload": {{"before": null, "after": {value.decode()}, '
                     f'"source": {source}, "op": "c", "ts_ms": {millis}}}}}').encode()
    return encoded


def avro_orders(topic: str):
    """`produce`'s encoder of orders in the registry's wire format under READER's id, as
    AvroSerializer frames them."""
    from confluent_kafka.schema_registry import Schema
    from fastavro import parse_schema, schemaless_writer

    schema_id = registry_client().register_schema(f"{topic}-value", Schema(json.dumps(READER), "AVRO"))
    header, parsed = b"\x00" + struct.pack(">I", schema_id), parse_schema(READER)

    def encoded(i: int, rng: random.Random, when: datetime) -> tuple[bytes, bytes]:
        sku, out = rng.choice(SKUS), io.BytesIO(header)
        out.seek(len(header))
        schemaless_writer(out, parsed, {"order_id": f"o-{i}", "sku": sku, "qty": rng.randint(1, 9),
                                        "price": Decimal(f"{rng.uniform(1, 100):.2f}"), "ts": when})
        return sku.encode(), out.getvalue()
    return encoded


def protobuf_orders(topic: str):
    """`produce`'s encoder of orders as ORDER_PROTO's message under its id, framed as
    ProtobufSerializer frames the first message of a schema."""
    from google.protobuf import message_factory

    schema_id = registered(f"{topic}-value", ORDER_PROTO)
    Order = message_class(ORDER_PROTO, "Order")
    Timestamp = message_factory.GetMessageClass(Order.DESCRIPTOR.fields_by_name["ts"].message_type)

    def encoded(i: int, rng: random.Random, when: datetime) -> tuple[bytes, bytes]:
        sku, micros = rng.choice(SKUS), int(when.timestamp() * 1_000_000)
        message = Order(order_id=f"o-{i}", sku=sku, qty=rng.randint(1, 9), price=f"{rng.uniform(1, 100):.2f}",
                        ts=Timestamp(seconds=micros // 1_000_000, nanos=micros % 1_000_000 * 1000))
        return sku.encode(), framed(schema_id, message)
    return encoded


def checkpoint(fmt: str, topic: str, repetition: int, servers: str, db_url: str, folder: Path) -> dict:
    """One checkpoint of a fresh copy of the demo over the whole topic: its job's report and wall times."""
    name = f"fmt_{fmt}_{repetition}"
    readers = {"avro": json.dumps(READER), "protobuf": {"subject": f"{topic}-value", "version": 1}}
    registry = {"source": {"topics": [topic], "value_format": fmt, "schema_registry": REGISTRY,
                           "value_reader_schema": readers[fmt], "value_schema": COLUMNS}} if fmt in readers else {}
    config = demo_config(name, topic, name, **registry)
    copies.forget(db_url, config, [name])
    copies.create_demo_tables(db_url, name)
    if fmt == "debezium":
        config = _change_feed(config, name, db_url)
    ledger = Ledger(config, lambda: psycopg2.connect(db_url))
    ledger.register()
    settings = JobSettings(connections.pipeline_db_url(connections.PIPELINE_DB_JOB), KafkaClient.at(servers),
                           connections.schema_registry(REGISTRY))
    started = time.perf_counter()
    with KafkaOffsets(KafkaClient.at(servers)) as kafka:
        checkpoint_id = tasks.begin_checkpoint(ledger, kafka, "benchmark", None, datetime.now(timezone.utc)
                                               ).checkpoint.id
    jobs = []
    with settings.written() as settings_file:
        tasks.run_increment(ledger, checkpoint_id, increment_job(launcher(), settings_file, folder / f"{name}.log", jobs))
    if tasks.commit_checkpoint(ledger, checkpoint_id, try_number=1) is not Outcome.COMMITTED:
        raise AssertionError(f"{name}: checkpoint {checkpoint_id} not committed")
    seconds = time.perf_counter() - started
    copies.forget(db_url, config, [name])
    report = jobs[0].report
    return {"records": report["records"], "end_to_end": seconds, "job": jobs[0].seconds,
            "read": report["seconds"]["read"], "write_staging": report["seconds"]["write_staging"],
            "java_peak_gib": jobs[0].peak_jvm / 2**30}


def _change_feed(config, schema: str, db_url: str):
    """The demo pipeline reading the orders as change events: its upsert sink ordered by the
    source's position, which its table gets (and the topic, which an order_by's ties compare)."""
    data = config.model_dump(mode="json")
    data["source"]["envelope"] = "debezium"
    for sink in data["sinks"]:
        if sink["mode"] == "upsert":
            sink["order_by"] = debezium.POSITION
    with closing(psycopg2.connect(db_url)) as conn, conn, conn.cursor() as cur:
        cur.execute(f"ALTER TABLE {schema}.sku_last_price ADD COLUMN {debezium.POSITION} numeric(38,0) NOT NULL, "
                    "ADD COLUMN IF NOT EXISTS kafka_topic text NOT NULL")
    return load_config(data)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--orders", type=int, default=1_000_000)
    parser.add_argument("--repetitions", type=int, default=3)
    args = parser.parse_args()
    lifecycle.up()
    os.environ.update(process_environment())
    servers, db_url = os.environ["KAFKA_BOOTSTRAP_SERVERS"], os.environ["PIPELINE_DB_URL"]
    with closing(psycopg2.connect(db_url)) as conn:
        migrate(conn)
    folder = LOCAL / "artifacts" / "bench-formats"
    folder.mkdir(parents=True, exist_ok=True)
    topics = {fmt: f"bench_fmt_{fmt}_{args.orders}" for fmt in FORMATS}
    for topic in topics.values():
        copies.delete_topic(servers, topic)
    produce(servers, args.orders, topic=topics["json"], per_transaction=PER_TRANSACTION)
    produce(servers, args.orders, topic=topics["avro"], per_transaction=PER_TRANSACTION,
            encoded=avro_orders(topics["avro"]))
    produce(servers, args.orders, topic=topics["protobuf"], per_transaction=PER_TRANSACTION,
            encoded=protobuf_orders(topics["protobuf"]))
    produce(servers, args.orders, topic=topics["debezium"], per_transaction=PER_TRANSACTION,
            encoded=debezium_orders())
    runs = {fmt: [] for fmt in FORMATS}
    for repetition in range(args.repetitions):
        for fmt in FORMATS[repetition % len(FORMATS):] + FORMATS[:repetition % len(FORMATS)]:
            runs[fmt].append(checkpoint(fmt, topics[fmt], repetition, servers, db_url, folder))
            print(fmt, repetition, runs[fmt][-1], flush=True)
    print(f"\n{args.orders} orders, medians of {args.repetitions} (values in brackets); ratios to JSON")
    others = FORMATS[1:]
    print("| " + " | ".join(["", *(NAMES[f] for f in FORMATS), *(f"{NAMES[f]}/JSON" for f in others)]) + " |")
    print("|---" * (len(FORMATS) + len(others) + 1) + "|")
    for figure in ("records", "end_to_end", "job", "read", "write_staging", "java_peak_gib"):
        medians = {fmt: statistics.median(r[figure] for r in runs[fmt]) for fmt in FORMATS}
        values = [f"{medians[f]:.4g} [{', '.join(f'{r[figure]:.3g}' for r in runs[f])}]" for f in FORMATS]
        print(f"| {figure} | " + " | ".join([*values, *(f"{medians[f] / medians['json']:.2f}" for f in others)])
              + " |")
    records = {fmt: statistics.median(r["records"] / r["end_to_end"] for r in runs[fmt]) for fmt in FORMATS}
    print("| records/s end to end | " + " | ".join([*(f"{records[f]:.0f}" for f in FORMATS),
                                                   *(f"{records[f] / records['json']:.2f}" for f in others)]) + " |")
    for topic in topics.values():
        copies.delete_topic(servers, topic)


if __name__ == "__main__":
    main()
