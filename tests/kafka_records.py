"""Producing known records to the real broker, for tests: transactions that
commit or abort, and the offsets each record landed at."""

from __future__ import annotations

import time
import uuid
from dataclasses import dataclass
from datetime import datetime, timezone

from confluent_kafka import Consumer, KafkaError, KafkaException, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic


@dataclass(frozen=True)
class Produced:
    partition: int
    offset: int
    key: bytes | None
    value: bytes
    committed: bool
    timestamp: int = 0  # milliseconds since the epoch, as Kafka stamped the record


def create_topic(servers: str, name: str, partitions: int) -> None:
    """Returns once the broker's metadata shows the topic with its partitions: on a busy
    machine a topic just created is unknown to metadata requests for a while."""
    admin = AdminClient({"bootstrap.servers": servers})  # must outlive the future
    admin.create_topics([NewTopic(name, num_partitions=partitions, replication_factor=1)])[name].result(timeout=30)
    deadline = time.monotonic() + 30
    while True:
        shown = admin.list_topics(name, timeout=10).topics.get(name)
        if shown is not None and shown.error is None and len(shown.partitions) == partitions:
            return
        if time.monotonic() > deadline:
            raise TimeoutError(f"topic {name!r} created but not shown by the broker's metadata after 30 s")
        time.sleep(0.1)


def last_stable_offset(servers: str, topic: str, partition: int) -> int:
    consumer = Consumer({"bootstrap.servers": servers, "group.id": "tests-lso", "isolation.level": "read_committed"})
    try:
        return consumer.get_watermark_offsets(TopicPartition(topic, partition), timeout=10)[1]
    finally:
        consumer.close()


Record = tuple  # (partition, key, value) or (partition, key, value, headers: [(name, bytes)])


def produce_transactions(servers: str, topic: str, transactions: list[tuple[bool, list[Record]]]) -> list[Produced]:
    """Produces each (commit?, [(partition, key, value), ...]) as one transaction.

    Aborted records are flushed to the broker before the abort, so they really
    occupy offsets (librdkafka would otherwise drop unsent ones). Returns when
    the last stable offset of every touched partition is past the records,
    i.e. when a read_committed reader can see all of them.
    """
    produced: list[Produced] = []
    for commit, records in transactions:
        with OpenTransaction(servers, topic) as transaction:
            transaction.produce(records)
            produced += transaction.end(commit)
    wait_until_stable(servers, topic, produced)
    return produced


class OpenTransaction:
    """A Kafka transaction a test keeps open (across an interval's end, say) until `end`."""

    def __init__(self, servers: str, topic: str):
        self.topic = topic
        self.producer = Producer({"bootstrap.servers": servers, "transactional.id": f"tests-{uuid.uuid4()}",
                                  "linger.ms": 5})
        self.producer.init_transactions(30)
        self.producer.begin_transaction()
        self.delivered = []

    def __enter__(self) -> OpenTransaction:
        return self

    def __exit__(self, *exc) -> None:
        self.producer.flush(30)

    def _on_delivery(self, err, msg) -> None:
        if err is not None:
            raise KafkaException(err)
        self.delivered.append(msg)

    def produce(self, records: list[Record]) -> None:
        """The records, sent to the broker (still uncommitted)."""
        for partition, key, value, *headers in records:
            self.producer.produce(self.topic, value=value, key=key, partition=partition,
                                  headers=headers[0] if headers else None, on_delivery=self._on_delivery)
        self.producer.flush(30)

    def end(self, commit: bool) -> list[Produced]:
        """Commits or aborts; the records as produced."""
        if commit:
            self.producer.commit_transaction(30)
        else:
            self.producer.abort_transaction(30)
        return [Produced(m.partition(), m.offset(), m.key(), m.value(), commit, m.timestamp()[1])
                for m in self.delivered]


def moment_after_the_last_marker() -> datetime:
    """A moment after every record and transaction marker written so far, before any
    written next (producers stamp records when they send them, the broker stamps markers
    when it writes them; this machine's clock is the broker's): an interval boundary
    between two batches, however long producing them took."""
    time.sleep(0.05)
    moment = datetime.now(timezone.utc)
    time.sleep(0.05)
    return moment


def moment_after_every_marker_of(servers: str, topic: str) -> datetime:
    """`moment_after_the_last_marker` once `topic` is stable (`wait_for_markers`)."""
    wait_for_markers(servers, topic)
    return moment_after_the_last_marker()


def wait_for_markers(servers: str, topic: str, timeout: float = 30) -> None:
    """Returns once every partition of `topic` is stable: its read_committed end is its log end,
    so the markers of the transactions committed or aborted so far are written (the broker
    writes them after commit/abort returns, stamped when written)."""
    deadline = time.monotonic() + timeout
    while (ends := {isolation: log_ends(servers, topic, isolation)
                    for isolation in ("read_committed", "read_uncommitted")}) \
            and ends["read_committed"] != ends["read_uncommitted"]:
        if time.monotonic() > deadline:
            raise TimeoutError(f"{topic}: a transaction is still open ({ends})")
        time.sleep(0.05)


def log_ends(servers: str, topic: str, isolation: str) -> list[int]:
    """Each partition's end offset as a consumer of that isolation level sees it."""
    consumer = Consumer({"bootstrap.servers": servers, "group.id": "tests-ends", "isolation.level": isolation})
    try:
        partitions = sorted(consumer.list_topics(topic, timeout=10).topics[topic].partitions)
        return [consumer.get_watermark_offsets(TopicPartition(topic, p), timeout=10)[1] for p in partitions]
    finally:
        consumer.close()


def wait_until_stable(servers: str, topic: str, produced: list[Produced]) -> None:
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


@dataclass(frozen=True)
class Consumed:
    partition: int
    offset: int
    key: bytes | None
    value: bytes
    headers: tuple[tuple[str, bytes], ...]


def committed_records(servers: str, topic: str, timeout: float = 30) -> list[Consumed]:
    """Every record of the topic a read_committed consumer sees (aborted and open
    transactions' records are not), per partition in offset order, partitions in turn."""
    consumer = Consumer({"bootstrap.servers": servers, "group.id": f"tests-{uuid.uuid4()}",
                         "isolation.level": "read_committed", "enable.partition.eof": True,
                         "enable.auto.commit": False})
    try:
        partitions = consumer.list_topics(topic, timeout=10).topics[topic].partitions
        consumer.assign([TopicPartition(topic, p, 0) for p in partitions])
        records, ended = [], set()
        deadline = time.monotonic() + timeout
        while len(ended) < len(partitions):
            if time.monotonic() > deadline:
                raise TimeoutError(f"{topic}: partitions {sorted(set(partitions) - ended)} not read to their end")
            message = consumer.poll(1.0)
            if message is None:
                continue
            if message.error() is not None:
                if message.error().code() != KafkaError._PARTITION_EOF:
                    raise KafkaException(message.error())
                ended.add(message.partition())
                continue
            records.append(Consumed(message.partition(), message.offset(), message.key(), message.value(),
                                    tuple(message.headers() or ())))
        return sorted(records, key=lambda r: (r.partition, r.offset))
    finally:
        consumer.close()


def forget_progress(servers: str, topic: str, transactional_id: str) -> None:
    """A tombstone for a publisher's progress (exactly_once.publishing.progress), if its topic exists."""
    producer = Producer({"bootstrap.servers": servers})
    if topic in producer.list_topics(timeout=30).topics:
        producer.produce(topic, value=None, key=transactional_id.encode())
        producer.flush(30)


def java_committed_records(servers: str, topic: str) -> list[tuple[int, str, str, str]]:
    """What Java's read_committed consumer (the broker's own console consumer) sees of the
    topic: (partition, headers as `name:value,…`, key, value) per record."""
    from exactly_once_stack.kafka import tool

    printed = tool("org.apache.kafka.tools.consumer.ConsoleConsumer", "--bootstrap-server", servers, "--topic", topic,
                   "--from-beginning", "--isolation-level", "read_committed", "--timeout-ms", "3000",
                   "--property", "print.partition=true", "--property", "print.headers=true",
                   "--property", "print.key=true")
    records = [line.split("\t", 3) for line in printed.splitlines() if line.startswith("Partition:")]
    return [(int(partition.removeprefix("Partition:")), headers, key, value)
            for partition, headers, key, value in records]


def as_printed(records: list[Consumed]) -> list[tuple[int, str, str, str]]:
    """librdkafka's records as the console consumer prints them."""
    return [(r.partition, ",".join(f"{name}:{value.decode()}" for name, value in r.headers), r.key.decode(),
             r.value.decode()) for r in records]
