"""What planning asks Kafka, against a real broker: every partition of a topic at once
(`KafkaOffsets.topic_offsets`, each question one ListOffsets for all partitions) answers
what a read_committed consumer's watermarks say of each partition (the end is the last
stable offset, before a transaction still open) and what asking one partition answers; an
empty partition starts and ends at 0; the first offset at or after a moment is the first
record stamped then, or none after the last."""

from __future__ import annotations

from exactly_once.kafka_client import KafkaClient
from exactly_once.ledger.kafka_offsets import KafkaOffsets
from exactly_once.ledger.planning import PartitionOffsets
from tests.kafka_records import OpenTransaction, log_ends, moment_after_every_marker_of, produce_transactions

EMPTY = 2  # the topic fixture's third partition gets no record


def test_every_partition_at_once_answers_as_each_alone_up_to_the_last_stable_offset(kafka_servers, topic):
    produce_transactions(kafka_servers, topic, [(True, [(0, b"k", b"a1"), (1, b"k", b"b1")]),
                                                (False, [(0, b"k", b"aborted")])])
    between = moment_after_every_marker_of(kafka_servers, topic)
    committed = produce_transactions(kafka_servers, topic, [(True, [(0, b"k", b"a2"), (1, b"k", b"b2")])])
    after = moment_after_every_marker_of(kafka_servers, topic)
    with OpenTransaction(kafka_servers, topic) as still_open:
        still_open.produce([(0, b"k", b"open")])
        with KafkaOffsets(KafkaClient.at(kafka_servers)) as kafka:
            every = kafka.topic_offsets(topic, between, after, start_time=between)
            alone = {p: kafka.offsets(topic, p, between, after, between) for p in range(3)}
        watermarks = log_ends(kafka_servers, topic, "read_committed")
        still_open.end(commit=False)

    assert every == alone
    assert [every[p].last_stable for p in range(3)] == watermarks
    second = {r.partition: r.offset for r in committed}
    # partition 0: a1, a commit marker, the aborted record and its marker, a2 and its marker;
    # the open transaction's record after them is not stable
    assert every[0] == PartitionOffsets(0, second[0] + 2, second[0], None, second[0], every[0].topic_id)
    assert every[1] == PartitionOffsets(0, second[1] + 2, second[1], None, second[1], every[1].topic_id)
    assert every[EMPTY] == PartitionOffsets(0, 0, None, None, None, every[EMPTY].topic_id)
    assert every[0].topic_id is not None
