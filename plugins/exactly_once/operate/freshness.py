"""How old a pipeline's oldest record not yet committed is, per partition, from the
timestamp Kafka stamped on it: the age a monitoring system alerts on (lag in offsets says
nothing about time, and counts transaction markers).
"""

from __future__ import annotations

import time
from collections.abc import Iterable
from datetime import datetime, timezone

from confluent_kafka import TIMESTAMP_NOT_AVAILABLE, Consumer, KafkaError, TopicPartition

from exactly_once.kafka_client import KafkaClient
from exactly_once.operate.status import PartitionLag


class RecordTimes:
    """Reads one record at an offset, read_committed (aborted records and transaction
    markers are skipped); a consumer of its own, with end-of-partition events, so that a
    partition holding only markers before its last stable offset answers at once."""

    def __init__(self, client: KafkaClient, timeout: float = 5):
        self._timeout = timeout
        self._consumer = Consumer({**client.planner_config(), "enable.partition.eof": True})

    def close(self) -> None:
        self._consumer.close()

    def __enter__(self) -> RecordTimes:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def first_stamp(self, topic: str, partition: int, offset: int, last_stable: int) -> datetime | None:
        """When the first committed record at or after `offset` and before `last_stable` was
        stamped; None if there is none. TimeoutError if Kafka gives no answer in time."""
        if offset >= last_stable:
            return None
        self._consumer.assign([TopicPartition(topic, partition, offset)])
        try:
            deadline = time.monotonic() + self._timeout
            while time.monotonic() < deadline:
                message = self._consumer.poll(max(0.1, min(1.0, deadline - time.monotonic())))
                if message is None:
                    continue
                if (message.topic(), message.partition()) != (topic, partition):
                    continue  # an event of the partition read before
                if message.error() is not None:
                    if message.error().code() == KafkaError._PARTITION_EOF:
                        return None
                    raise TimeoutError(f"{topic}[{partition}]: {message.error().str()}")
                kind, millis = message.timestamp()
                if message.offset() >= last_stable or kind == TIMESTAMP_NOT_AVAILABLE:
                    return None  # no record left to commit; or one of the old format, without a time
                return datetime.fromtimestamp(millis / 1000, timezone.utc)
            raise TimeoutError(f"{topic}[{partition}]: no record at offset {offset} within {self._timeout} s")
        finally:
            self._consumer.unassign()


def ages(times: RecordTimes, lag: Iterable[PartitionLag], now: datetime) -> dict[tuple[str, int], float]:
    """Per partition of the status's lag: the age in seconds of its oldest record not
    committed yet; 0 when none is left."""
    stamps = {(p.topic, p.partition): times.first_stamp(p.topic, p.partition, p.committed_end, p.last_stable)
              for p in lag}
    return {where: 0.0 if stamp is None else max(0.0, (now - stamp).total_seconds())
            for where, stamp in stamps.items()}
