"""Where a kafka sink's publishing stands. Kafka keeps it: each Kafka transaction of
records also writes, to the sink's compacted progress topic under the publisher's
transactional id, the last outbox row it holds, so Kafka's own commit says what was
published. The database learns it after each commit (exactly_once.outbox_published) and
prunes the outbox up to it; a crash between the two is found and repaired by the next
publisher, which reads Kafka first.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from functools import total_ordering

from confluent_kafka import OFFSET_BEGINNING, Consumer, KafkaError, KafkaException, TopicPartition
from confluent_kafka.admin import AdminClient, ConfigResource, NewTopic

from exactly_once.errors import ConfigError, Permanent
from exactly_once.kafka_client import KafkaClient


class OutboxMismatch(Permanent):
    """Kafka's progress and the database disagree on what was published: publishing stops
    rather than skip or repeat records (a database restored from a backup, a progress topic
    deleted). A person decides."""


NEVER = 2**63 - 1  # after every checkpoint id


@total_ordering
@dataclass(frozen=True)
class Progress:
    """The last outbox row published: (checkpoint, position) names the row; `epoch` names
    the promotion that wrote it. Rows are published in frontier order, (rank, checkpoint,
    position), where `rank` is the first checkpoint that planned the row's offsets (its own,
    unless it plans again a range an aborted checkpoint released); unknown, its checkpoint's."""

    checkpoint_id: int
    position: int
    epoch: str = field(compare=False)
    rank: int | None = field(default=None, compare=False)

    @property
    def order(self) -> tuple[int, int, int]:
        return (self.checkpoint_id if self.rank is None else self.rank, self.checkpoint_id, self.position)

    def __lt__(self, other: Progress) -> bool:
        return self.order < other.order

    def encode(self) -> bytes:
        return json.dumps({"checkpoint_id": self.checkpoint_id, "position": self.position,
                           "epoch": self.epoch}).encode()

    @classmethod
    def decode(cls, value: bytes) -> Progress:
        fields = json.loads(value)
        return cls(fields["checkpoint_id"], fields["position"], fields["epoch"])

    def __str__(self) -> str:
        return f"checkpoint {self.checkpoint_id} row {self.position} (epoch {self.epoch})"


@dataclass(frozen=True)
class Hold:
    """What publishing waits for: the first work of the pipeline, in frontier order, that is
    not committed. `checkpoint_id` is the open checkpoint; None, a range an aborted checkpoint
    (`rank`) released that no checkpoint plans again yet."""

    rank: int
    checkpoint_id: int | None

    @property
    def order(self) -> tuple[int, int]:
        return (self.rank, NEVER if self.checkpoint_id is None else self.checkpoint_id)

    def __str__(self) -> str:
        if self.checkpoint_id is None:
            return f"checkpoint {self.rank} (aborted, its offsets not planned again)"
        if self.checkpoint_id == self.rank:
            return f"checkpoint {self.checkpoint_id} (open, planned before)"
        return f"checkpoint {self.checkpoint_id} (open, plans again offsets of checkpoint {self.rank})"


def verdict(shard: str, in_kafka: Progress | None, known: Progress | None, epoch_at: str | None,
            first_open: Hold | int | None) -> Progress | None:
    """Where publishing goes on: after Kafka's progress, once the database agrees with it.
    `known` is what the database recorded as published; `epoch_at` the epoch of the outbox
    row at Kafka's progress (None if the outbox holds no such row); `first_open` the
    pipeline's first work not committed (a Hold; an int: that open checkpoint). OutboxMismatch if Kafka says less than the database
    recorded, or more than it can confirm: a row it lacks, or a checkpoint it holds open
    (publishing never passes one)."""
    restored = ("; was the database restored from a backup, or the outbox changed? Publishing stays stopped "
                "until a person compares the topic with the outbox (docs/guide/kafka-output.md, \"A "
                "restored database\")")
    if in_kafka is None:
        if known is not None:
            raise OutboxMismatch(f"{shard}: Kafka holds no progress, but this database recorded {known} as "
                                 "published; was the progress topic deleted? Publishing stays stopped rather "
                                 "than publish again (docs/guide/kafka-output.md)")
        return None
    hold = Hold(first_open, first_open) if isinstance(first_open, int) else first_open
    if hold is not None and hold.order <= in_kafka.order[:2]:
        if hold.checkpoint_id is None:
            raise OutboxMismatch(f"{shard}: Kafka's progress says {in_kafka} was published, but offsets "
                                 f"checkpoint {hold.rank} planned before it are released, not committed, in this "
                                 f"database{restored}")
        before = "planned before it" if hold.rank == hold.checkpoint_id else \
            f"planning again offsets of checkpoint {hold.rank}, before it"
        raise OutboxMismatch(f"{shard}: Kafka's progress says {in_kafka} was published, but checkpoint "
                             f"{hold.checkpoint_id}, {before}, is open in this database{restored}")
    if known is not None and in_kafka < known:
        raise OutboxMismatch(f"{shard}: Kafka's progress, {in_kafka}, is behind what this database recorded as "
                             f"published, {known}{restored}")
    if known is not None and (in_kafka.checkpoint_id, in_kafka.position) == (known.checkpoint_id, known.position):
        if in_kafka.epoch != known.epoch:
            raise OutboxMismatch(f"{shard}: Kafka's progress, {in_kafka}, names another epoch than this "
                                 f"database's, {known}{restored}")
        return in_kafka
    if epoch_at != in_kafka.epoch:
        held = "holds no such row" if epoch_at is None else f"holds that row with epoch {epoch_at}"
        raise OutboxMismatch(f"{shard}: Kafka's progress says {in_kafka} was published, but the outbox "
                             f"{held}{restored}")
    return in_kafka


def read(client: KafkaClient, topic: str, key: str, timeout: float = 30) -> Progress | None:
    """The last committed progress under `key` in the topic (read_committed); None if none,
    or if a tombstone came after it."""
    consumer = Consumer({**client.planner_config(), "enable.partition.eof": True})
    try:
        consumer.assign([TopicPartition(topic, 0, OFFSET_BEGINNING)])  # compaction moves the first offset
        last = None
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            message = consumer.poll(1.0)
            if message is None:
                continue
            if message.error() is not None:
                if message.error().code() == KafkaError._PARTITION_EOF:
                    return last
                raise KafkaException(message.error())
            if message.key() == key.encode():  # a tombstone (no value) forgets the progress before it
                last = None if message.value() is None else Progress.decode(message.value())
        raise TimeoutError(f"progress topic {topic}: not read to its end within {timeout} s")
    finally:
        consumer.close()


def ensure_topic(client: KafkaClient, topic: str) -> None:
    """The progress topic, created compacted with one partition if missing (the broker's
    default replication); rolled hourly so that compaction keeps it small. An existing one
    must be compacted (ConfigError otherwise): under `delete` alone, retention would expire
    the progress record, and publishing would stop on `OutboxMismatch` once it is gone."""
    admin = AdminClient(client.librdkafka())
    if topic in admin.list_topics(timeout=30).topics:
        require_compacted(admin, topic)
        return
    new = NewTopic(topic, num_partitions=1, config={"cleanup.policy": "compact", "segment.ms": "3600000"})
    try:
        admin.create_topics([new])[topic].result(30)
    except KafkaException as error:
        if error.args[0].code() != KafkaError.TOPIC_ALREADY_EXISTS:
            raise
        require_compacted(admin, topic)  # created meanwhile by someone else: by us, or not


def require_compacted(admin: AdminClient, topic: str) -> None:
    """ConfigError, naming the topic, its policy and the fix, unless its `cleanup.policy`
    includes `compact` (`compact,delete` keeps the last record of each key too)."""
    resource = ConfigResource(ConfigResource.Type.TOPIC, topic)
    policy = admin.describe_configs([resource])[resource].result(30)["cleanup.policy"].value or ""
    if "compact" not in {p.strip() for p in policy.split(",")}:
        raise ConfigError(f"progress topic {topic!r} has cleanup.policy={policy}: retention would expire the "
                          "publisher's progress record and publishing would then stop; make it compacted "
                          f"(kafka-configs.sh --alter --entity-type topics --entity-name {topic} --add-config "
                          "cleanup.policy=compact) or name another topic in the sink's progress_topic")
