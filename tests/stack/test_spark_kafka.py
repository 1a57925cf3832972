"""Spark's Kafka source in batch mode reads exactly a frozen offset range."""

import json

import pytest

from tests.kafka_records import produce_transactions


def kafka_range(spark, servers, topic, start: dict[int, int], end: dict[int, int], **options: str):
    return (
        spark.read.format("kafka")
        .options(**options)
        .option("kafka.bootstrap.servers", servers)
        .option("kafka.isolation.level", "read_committed")
        .option("failOnDataLoss", "true")
        .option("assign", json.dumps({topic: sorted(start)}))
        .option("startingOffsets", json.dumps({topic: {str(p): o for p, o in start.items()}}))
        .option("endingOffsets", json.dumps({topic: {str(p): o for p, o in end.items()}}))
        .load()
        .select("partition", "offset", "value")
    )


def read_range(spark, servers, topic, start: dict[int, int], end: dict[int, int], **options: str):
    rows = kafka_range(spark, servers, topic, start, end, **options).collect()
    return sorted((r.partition, r.offset, bytes(r.value)) for r in rows)


@pytest.fixture
def produced(kafka_servers, topic):
    # Partition 0: c0 c1 |m a0 a1 |m c2 |m      partition 1: a2 |m c3 |m
    return produce_transactions(kafka_servers, topic, [
        (True, [(0, None, b"c0"), (0, None, b"c1")]),
        (False, [(0, None, b"a0"), (0, None, b"a1"), (1, None, b"a2")]),
        (True, [(0, None, b"c2"), (1, None, b"c3")]),
    ])


def test_whole_range_returns_exactly_the_committed_records(spark, kafka_servers, topic, produced):
    rows = read_range(spark, kafka_servers, topic, {0: 0, 1: 0}, {0: 8, 1: 4})
    assert rows == sorted((r.partition, r.offset, r.value) for r in produced if r.committed)
    assert [v for *_, v in rows] == [b"c0", b"c1", b"c2", b"c3"]


def test_a_range_split_into_one_offset_per_task_returns_exactly_the_committed_records(
        spark, kafka_servers, topic, produced):
    # The job bounds the offsets per Spark task: here every task's range is one offset, so
    # tasks start and end on markers and inside the aborted transaction.
    ranges = ({0: 0, 1: 0}, {0: 8, 1: 4})
    assert kafka_range(spark, kafka_servers, topic, *ranges, maxRecordsPerPartition="1").rdd.getNumPartitions() == 12
    rows = read_range(spark, kafka_servers, topic, *ranges, maxRecordsPerPartition="1")
    assert rows == sorted((r.partition, r.offset, r.value) for r in produced if r.committed)


def test_range_ending_right_after_a_marker_finishes(spark, kafka_servers, topic, produced):
    # [0, 3) ends just past the first commit marker (offset 2).
    assert read_range(spark, kafka_servers, topic, {0: 0}, {0: 3}) == [(0, 0, b"c0"), (0, 1, b"c1")]


def test_range_of_only_aborted_records_and_markers_is_empty(spark, kafka_servers, topic, produced):
    # Partition 0 [3, 6): a0 a1 and the abort marker; partition 1 [0, 2): a2 and its marker.
    assert read_range(spark, kafka_servers, topic, {0: 3, 1: 0}, {0: 6, 1: 2}) == []
