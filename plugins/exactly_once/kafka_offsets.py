"""The thin Kafka adapter planning needs: partitions and offsets, read_committed."""

from __future__ import annotations

from datetime import datetime

from confluent_kafka import Consumer, TopicPartition

from exactly_once.planning import PartitionOffsets
from exactly_once.settings import required

SERVERS_VARIABLE = "KAFKA_BOOTSTRAP_SERVERS"


def bootstrap_servers() -> str:
    return required(SERVERS_VARIABLE, "the Kafka brokers as host:port[,host:port…]")


class KafkaOffsets:
    def __init__(self, bootstrap_servers: str, timeout: float = 30):
        self._timeout = timeout
        # read_committed: the high watermark Kafka reports is the last stable offset.
        self._consumer = Consumer({"bootstrap.servers": bootstrap_servers, "group.id": "exactly_once.planner",
                                   "isolation.level": "read_committed", "enable.auto.commit": False})

    def close(self) -> None:
        self._consumer.close()

    def __enter__(self) -> KafkaOffsets:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def partitions(self, topic: str) -> list[int]:
        found = self._consumer.list_topics(topic, timeout=self._timeout).topics.get(topic)
        if found is None or found.error is not None or not found.partitions:
            raise LookupError(f"Kafka topic {topic!r} does not exist ({found.error if found else 'unknown'})")
        return sorted(found.partitions)

    def offsets(self, topic: str, partition: int, interval_start: datetime | None, interval_end: datetime | None,
                start_time: datetime | None = None) -> PartitionOffsets:
        log_start, last_stable = self._consumer.get_watermark_offsets(
            TopicPartition(topic, partition), timeout=self._timeout, cached=False)
        at = {when: self._first_offset_at(topic, partition, when)
              for when in {interval_start, interval_end, start_time}}
        return PartitionOffsets(log_start, last_stable, at[interval_start], at[interval_end], at[start_time])

    def _first_offset_at(self, topic: str, partition: int, when: datetime | None) -> int | None:
        """The first offset stamped at or after `when`; read_committed, Kafka answers only
        offsets below the last stable one."""
        if when is None:
            return None
        millis = int(when.timestamp() * 1000)
        [found] = self._consumer.offsets_for_times([TopicPartition(topic, partition, millis)], timeout=self._timeout)
        return None if found.offset < 0 else found.offset
