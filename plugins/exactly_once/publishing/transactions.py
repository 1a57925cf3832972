"""One short Kafka transaction of a kafka sink: its transactional producer (every earlier
one of the sink fenced), then a batch of outbox rows, each a record with its checkpoint in
its headers, and the batch's progress, committed together; or aborted, naming the first row
Kafka refused (`refusals.Refused`), read from the records' delivery reports.
"""

from __future__ import annotations

from confluent_kafka import KafkaError, KafkaException, Producer

from exactly_once import faults
from exactly_once.config import Sink
from exactly_once.errors import ConfigError
from exactly_once.kafka_client import KafkaClient
from exactly_once.publishing.progress import Progress
from exactly_once.publishing.refusals import ROW_REFUSALS, SINK_REFUSALS, Refused, first_refusal, kafka_error

CHECKPOINT_HEADER = "exactly_once.checkpoint"
REPLACES_HEADER = "exactly_once.replaces"


def producer(client: KafkaClient, sink: Sink, shard: str, transaction_timeout_ms: int) -> Producer:
    """The sink's transactional producer, every earlier one fenced."""
    made = Producer(client.librdkafka(**{
        "transactional.id": shard, "partitioner": "murmur2_random",
        "transaction.timeout.ms": transaction_timeout_ms, "linger.ms": 5}))
    _check_topic(made, sink)
    made.init_transactions(60)
    return made


def transaction(producer: Producer, sink: Sink, shard: str, progress_at: str, rows: list[tuple],
                transaction_timeout_ms: int) -> Progress:
    """The rows and their progress in one Kafka transaction, committed; `Refused` when Kafka
    refuses a record of it (its delivery report says so) or the topic, after aborting it."""
    refusals: list[tuple[int, KafkaError]] = []  # (the row's index, Kafka's refusal)

    def delivery(index: int):
        def delivered(error, _message) -> None:
            if error is not None and error.code() in ROW_REFUSALS | SINK_REFUSALS:
                refusals.append((index, error))
        return delivered

    producer.begin_transaction()
    try:
        for index, (checkpoint_id, position, epoch, replaces, key, value, _) in enumerate(rows):
            headers = [(CHECKPOINT_HEADER, str(checkpoint_id))]
            if replaces is not None:
                headers.append((REPLACES_HEADER, str(replaces)))
            try:
                _produce(producer, sink.topic, None if key is None else key.encode(), value.encode(),
                         headers, on_delivery=delivery(index))
            except KafkaException as refused:  # refused before it was sent (the client's own size limit)
                found = kafka_error(refused)
                if found is not None and found.code() in ROW_REFUSALS:
                    refusals.append((index, found))
                    raise Refused(found, index) from refused
                raise
        last = rows[-1]
        at = Progress(*last[:3], rank=last[6])
        _produce(producer, progress_at, shard.encode(), at.encode(), None, partition=0)
        faults.point("publish.before_commit")
        producer.flush(transaction_timeout_ms / 1000)  # the delivery reports: did Kafka refuse a record?
        if refusals:
            raise Refused(*first_refusal(refusals))
        producer.commit_transaction(transaction_timeout_ms / 1000)
    except Refused:
        _abort(producer)  # readers of the topic wait no longer on it
        raise
    except KafkaException as error:
        _abort(producer)
        if refusals:
            raise Refused(*first_refusal(refusals)) from error
        found = kafka_error(error)
        if found is not None and found.code() in ROW_REFUSALS | SINK_REFUSALS:
            raise Refused(found, 0) from error
        raise
    except BaseException:
        _abort(producer)
        raise
    return at


def _check_topic(producer: Producer, sink: Sink) -> None:
    if sink.topic not in producer.list_topics(timeout=30).topics:
        raise ConfigError(f"sink {sink.name!r}: Kafka topic {sink.topic!r} does not exist (create it with "
                          "the partitions its consumers need; the publisher does not guess them)")


def _produce(producer: Producer, topic: str, key: bytes | None, value: bytes, headers, **where) -> None:
    while True:
        try:
            producer.produce(topic, value, key, headers=headers, **where)
            return
        except BufferError:  # the local queue is full: let it drain
            producer.poll(0.5)


def _abort(producer: Producer) -> None:
    try:
        producer.abort_transaction(10)
    except Exception:  # fenced, or the broker gone: the broker aborts it at its timeout
        pass
