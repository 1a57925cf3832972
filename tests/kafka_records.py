"""Producing known records to the real broker, for tests: transactions that
commit or abort, and the offsets each record landed at."""

from __future__ import annotations

import time
import uuid
from dataclasses import dataclass

from confluent_kafka import Consumer, KafkaException, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic


@dataclass(frozen=True)
class Produced:
    partition: int
    offset: int
    key: bytes | None
    value: bytes
    committed: bool


def create_topic(servers: str, name: str, partitions: int) -> None:
    admin = AdminClient({"bootstrap.servers": servers})  # must outlive the future
    admin.create_topics([NewTopic(name, num_partitions=partitions, replication_factor=1)])[name].result(timeout=30)


def last_stable_offset(servers: str, topic: str, partition: int) -> int:
    consumer = Consumer({"bootstrap.servers": servers, "group.id": "tests-lso", "isolation.level": "read_committed"})
    try:
        return consumer.get_watermark_offsets(TopicPartition(topic, partition), timeout=10)[1]
    finally:
        consumer.close()


def produce_transactions(servers: str, topic: str, transactions: list[tuple[bool, list[tuple[int, bytes | None, bytes]]]]
                         ) -> list[Produced]:
    """Produces each (commit?, [(partition, key, value), ...]) as one transaction.

    Aborted records are flushed to the broker before the abort, so they really
    occupy offsets (librdkafka would otherwise drop unsent ones). Returns when
    the last stable offset of every touched partition is past the records,
    i.e. when a read_committed reader can see all of them.
    """
    producer = Producer({"bootstrap.servers": servers, "transactional.id": f"tests-{uuid.uuid4()}",
                         "linger.ms": 5})
    producer.init_transactions(30)
    produced: list[Produced] = []
    for commit, records in transactions:
        delivered = []

        def on_delivery(err, msg, delivered=delivered):
            if err is not None:
                raise KafkaException(err)
            delivered.append(msg)

        producer.begin_transaction()
        for partition, key, value in records:
            producer.produce(topic, value=value, key=key, partition=partition, on_delivery=on_delivery)
        producer.flush(30)
        if commit:
            producer.commit_transaction(30)
        else:
            producer.abort_transaction(30)
        produced += [Produced(m.partition(), m.offset(), m.key(), m.value(), commit) for m in delivered]
    _wait_until_stable(servers, topic, produced)
    return produced


def _wait_until_stable(servers: str, topic: str, produced: list[Produced]) -> None:
    # Transaction markers are written after commit/abort returns.
    last = {}
    for record in produced:
        last[record.partition] = max(last.get(record.partition, -1), record.offset)
    deadline = time.monotonic() + 30
    for partition, offset in last.items():
        while last_stable_offset(servers, topic, partition) <= offset + 1:
            if time.monotonic() > deadline:
                raise TimeoutError(f"{topic}/{partition}: last stable offset never passed {offset + 1}")
            time.sleep(0.05)
