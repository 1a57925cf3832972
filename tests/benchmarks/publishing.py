"""The publisher of kafka sinks beside the broker's own limit: N committed outbox rows (the
demo's per-checkpoint sku deltas, about 120 bytes of JSON each) published by
`exactly_once.publishing.Publisher`, against the same records produced by a bare
transactional confluent-kafka producer in transactions of the same size, with no outbox and
no database (what kafka-producer-perf-test measures, with transactions). Repetitions
interleaved (which runs first alternates), each on topics and a pipeline of its own; medians
printed.

    ./dev bench-publish [--rows 500000] [--repetitions 3]
"""

from __future__ import annotations

import argparse
import statistics
import time
import uuid
from contextlib import closing

import psycopg2
from confluent_kafka import Producer

from exactly_once.config import load_config
from exactly_once.kafka_client import KafkaClient
from exactly_once.ledger.migrate import migrate
from exactly_once.ledger.protocol import Ledger
from exactly_once.publishing.publisher import Publisher
from exactly_once_stack import lifecycle
from exactly_once_stack.settings import process_environment
from tests.kafka_records import create_topic

BATCH = 10_000  # rows per Kafka transaction, the publisher's default
PARTITIONS = 3
# Outbox rows as a commit of the demo's kafka sink promotes them (sql/merge/kafka.sql).
FILL = """
INSERT INTO exactly_once.outbox (pipeline, sink, checkpoint_id, position, epoch, key, record)
SELECT %(pipeline)s, 'deltas', 1, i, gen_random_uuid(),
       jsonb_build_array(date_trunc('minute', now()), 'sku-' || lpad((i %% 50)::text, 3, '0')),
       jsonb_build_object('minute', date_trunc('minute', now()), 'sku', 'sku-' || lpad((i %% 50)::text, 3, '0'),
                          'orders', i %% 40, 'qty', i %% 97, 'revenue', round((i %% 9973) * 1.37, 2))
FROM generate_series(1, %(rows)s) i
"""


def pipeline(db_url: str, servers: str) -> Ledger:
    """A registered pipeline with one kafka sink, on a topic of its own."""
    name = f"pub{uuid.uuid4().hex[:8]}"
    create_topic(servers, name, PARTITIONS)
    with closing(psycopg2.connect(db_url)) as conn, conn, conn.cursor() as cur:
        cur.execute(f"CREATE SCHEMA {name}; CREATE TABLE {name}.deltas (minute timestamptz, sku text, "
                    "orders bigint, qty bigint, revenue numeric(18,2))")
    config = load_config({"name": name, "source": {"topics": ["bench_unused"], "value_schema": {"sku": "string"}},
                          "sinks": [{"name": "deltas", "table": f"{name}.deltas", "mode": "kafka", "topic": name,
                                     "keys": ["minute", "sku"],
                                     "measures": {"orders": "sum", "qty": "sum", "revenue": "sum"}}]})
    ledger = Ledger(config, lambda: psycopg2.connect(db_url))
    ledger.register()
    return ledger


def publish(db_url: str, servers: str, rows: int) -> float:
    ledger = pipeline(db_url, servers)
    with closing(psycopg2.connect(db_url)) as conn, conn, conn.cursor() as cur:
        cur.execute(FILL, {"pipeline": ledger.config.name, "rows": rows})
    started = time.monotonic()
    [published] = Publisher(ledger.config, ledger.connect, KafkaClient.at(servers)).publish()
    took = time.monotonic() - started
    assert published.records == rows, published
    return took


def produce_alone(db_url: str, servers: str, rows: int) -> float:
    """The same records (keys and values as the publisher sends them) in transactions of BATCH."""
    name = pipeline(db_url, servers).config.name
    with closing(psycopg2.connect(db_url)) as conn, conn, conn.cursor() as cur:
        cur.execute(FILL, {"pipeline": name, "rows": rows})
        cur.execute("SELECT key::text, record::text FROM exactly_once.outbox WHERE pipeline = %s ORDER BY position",
                    (name,))
        records = [(key.encode(), value.encode()) for key, value in cur.fetchall()]
        cur.execute("DELETE FROM exactly_once.outbox WHERE pipeline = %s", (name,))
    producer = Producer({"bootstrap.servers": servers, "transactional.id": f"bench-{name}",
                         "partitioner": "murmur2_random", "linger.ms": 5})
    started = time.monotonic()
    producer.init_transactions(60)
    for first in range(0, len(records), BATCH):
        producer.begin_transaction()
        for key, value in records[first:first + BATCH]:
            while True:
                try:
                    producer.produce(name, value, key)
                    break
                except BufferError:
                    producer.poll(0.5)
        producer.commit_transaction(60)
    return time.monotonic() - started


def main() -> None:
    parser = argparse.ArgumentParser(prog="./dev bench-publish", description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=500_000)
    parser.add_argument("--repetitions", type=int, default=3)
    args = parser.parse_args()
    lifecycle.up()
    env = process_environment()
    db_url, servers = env["PIPELINE_DB_URL"], env["KAFKA_BOOTSTRAP_SERVERS"]
    with closing(psycopg2.connect(db_url)) as conn:
        migrate(conn)
    runs = {"publisher": [], "producer alone": []}
    for repetition in range(args.repetitions):
        order = list(runs) if repetition % 2 == 0 else list(reversed(runs))
        for kind in order:
            took = (publish if kind == "publisher" else produce_alone)(db_url, servers, args.rows)
            runs[kind].append(took)
            print(f"repetition {repetition + 1}: {kind}: {took:.2f} s", flush=True)
    print(f"\n{args.rows:,} records (the demo's sku deltas as JSON), transactions of {BATCH:,}, {PARTITIONS} "
          f"partitions; medians of {args.repetitions}\n")
    print("| | seconds | records/s |\n|---|---|---|")
    for kind, took in runs.items():
        median = statistics.median(took)
        print(f"| {kind} | {median:.2f} ({', '.join(f'{t:.2f}' for t in took)}) | {args.rows / median:,.0f} |")
    ratios = [p / a for p, a in zip(runs["publisher"], runs["producer alone"])]
    each = ", ".join(f"{r:.2f}" for r in ratios)
    print(f"\npublisher / producer alone: **{statistics.median(ratios):.2f}** ({each})")


if __name__ == "__main__":
    main()
