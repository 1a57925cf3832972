"""Writes N sample orders to the demo topic: most in committed transactions, some in
aborted ones, a few malformed, a few poison (valid JSON that fits the schema, but a NUL
character in the sku, which PostgreSQL text cannot hold). Orders are stamped with the time they are produced:
Kafka stamps transaction markers with the wall clock too, and offsets_for_times
stops at the first marker past an interval's end, so back-dated records would be
cut at the first marker.

    python -m exactly_once_demo.produce N      (to the brokers of the Airflow connection kafka_default)
"""

from __future__ import annotations

import argparse
import os
import random
from collections.abc import Callable, Mapping
from datetime import datetime, timezone
from functools import lru_cache

from confluent_kafka import KafkaException, Producer
from confluent_kafka.admin import AdminClient, NewTopic

from exactly_once import connections
from exactly_once.kafka_client import KafkaClient
from exactly_once_demo.pipeline import PARTITIONS, TOPIC

SKUS = [f"sku-{i:03d}" for i in range(50)]
TRANSACTION = 500       # records per Kafka transaction
ABORT_EVERY = 7         # every 7th transaction is aborted
MALFORMED_EVERY = 997   # every 997th record is not a valid order
POISON_EVERY = 499      # every 499th order's sku holds a NUL character (one per batch of 500)


def client_config(kafka: str | KafkaClient) -> Mapping[str, str]:
    """The librdkafka config of brokers given as host:port (the tests' plaintext listener) or
    as the pipeline's Kafka connection, its log lines to Python logging."""
    return (KafkaClient.at(kafka) if isinstance(kafka, str) else kafka).librdkafka()


def ensure_topic(kafka: str | KafkaClient, topic: str = TOPIC) -> None:
    admin = AdminClient({**client_config(kafka)})
    if topic not in admin.list_topics(timeout=30).topics:
        admin.create_topics([NewTopic(topic, PARTITIONS, 1)])[topic].result(timeout=30)


def order(i: int, rng: random.Random, when: datetime) -> tuple[bytes, bytes]:
    """Order number i as (key, value), stamped `when`; formatted by hand, as json.dumps
    would, because it runs millions of times in the benchmarks."""
    sku = rng.choice(SKUS)
    if i % MALFORMED_EVERY == MALFORMED_EVERY - 1:
        return sku.encode(), b'{"order_id": "broken", "qty": "many"}'
    if i % POISON_EVERY == POISON_EVERY - 1:
        sku = sku[:4] + "\\u0000" + sku[4:]  # JSON's escape: the parsed sku holds a NUL
    id_prefix, ts = _stamps(when)
    value = (f'{{"order_id": "{id_prefix}{i}", "sku": "{sku}", "qty": {rng.randint(1, 9)}, '
             f'"price": {round(rng.uniform(1, 100), 2)!r}, "ts": "{ts}"}}')
    return sku.encode(), value.encode()


@lru_cache(maxsize=1)
def _stamps(when: datetime) -> tuple[str, str]:
    return f"o-{when:%Y%m%d%H%M%S%f}-", f"{when:%Y-%m-%dT%H:%M:%S.%fZ}"


def produce(kafka: str | KafkaClient, n: int, seed: int = 0, topic: str = TOPIC,
            per_transaction: int = TRANSACTION, encoded: Callable[[int, random.Random, datetime], tuple[bytes, bytes]]
            = order) -> None:
    """Orders in transactions of `per_transaction` (at most 100,000: librdkafka's queue),
    each transaction's orders stamped with the time it began; `encoded(i, rng, when)` makes
    order i's key and value (JSON here; the format benchmark's Avro)."""
    ensure_topic(kafka, topic)
    rng = random.Random(seed)
    producer = Producer({**client_config(kafka), "linger.ms": 20, "batch.num.messages": 10_000,
                         "transactional.id": f"demo-producer-{os.getpid()}"})
    producer.init_transactions(30)
    for first in range(0, n, per_transaction):
        producer.begin_transaction()
        when = datetime.now(timezone.utc)
        for i in range(first, min(n, first + per_transaction)):
            key, value = encoded(i, rng, when)
            producer.produce(topic, value, key)
        producer.flush(60)  # on the broker before an abort, or librdkafka drops them unsent
        if (first // per_transaction) % ABORT_EVERY == ABORT_EVERY - 1:
            producer.abort_transaction(60)
        else:
            producer.commit_transaction(60)
    print(f"produced {n} orders to {topic!r}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("n", type=int)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    try:
        produce(connections.for_command_line(connections.kafka_client), args.n, args.seed)
    except KafkaException as error:
        raise SystemExit(f"producing to {TOPIC!r} failed: {error}") from error


if __name__ == "__main__":
    main()
