"""The broker: transactions commit and abort, read_committed hides the aborted."""

from confluent_kafka import Consumer, TopicPartition

from tests.kafka_records import produce_transactions


def read_all(servers: str, topic: str, partition: int, isolation: str) -> list[tuple[int, bytes]]:
    consumer = Consumer({"bootstrap.servers": servers, "group.id": f"read-{isolation}",
                         "isolation.level": isolation, "enable.auto.commit": False})
    consumer.assign([TopicPartition(topic, partition, 0)])
    seen = []
    try:
        while True:
            msg = consumer.poll(5)
            if msg is None:
                return seen
            if msg.error() is None:
                seen.append((msg.offset(), msg.value()))
    finally:
        consumer.close()


def test_read_committed_sees_exactly_the_committed_records_with_marker_gaps(kafka_servers, topic):
    produced = produce_transactions(kafka_servers, topic, [
        (True, [(0, b"k", b"c1"), (0, b"k", b"c2")]),
        (False, [(0, b"k", b"a1"), (0, b"k", b"a2")]),
        (True, [(0, b"k", b"c3")]),
    ])

    committed = [(r.offset, r.value) for r in produced if r.committed]
    assert read_all(kafka_servers, topic, 0, "read_committed") == committed
    assert [v for _, v in read_all(kafka_servers, topic, 0, "read_uncommitted")] == [b"c1", b"c2", b"a1", b"a2", b"c3"]
    # Each transaction ends with a control marker that takes one offset.
    assert [r.offset for r in produced] == [0, 1, 3, 4, 6]
    consumer = Consumer({"bootstrap.servers": kafka_servers, "group.id": "wm", "isolation.level": "read_committed"})
    assert consumer.get_watermark_offsets(TopicPartition(topic, 0), timeout=10) == (0, 8)
    consumer.close()
