"""Offsets that go backwards, against a real broker (issue 36, item 4): a topic deleted and
created again leaves the pipeline's frontier beyond the partitions' new log ends. The
pipeline stops loudly naming each partition and both offsets (every run, the status, the
view), and an operator's recorded reset reads the new records exactly once, keeping the
history of the old ones under a label."""

from __future__ import annotations

import time
from contextlib import closing
from dataclasses import replace

import psycopg2
import pytest
from confluent_kafka.admin import AdminClient

from exactly_once.errors import ConfigError
from exactly_once.kafka_client import KafkaClient
from exactly_once.ledger import replays
from exactly_once.ledger.invariants import violations
from exactly_once.ledger.kafka_offsets import KafkaOffsets
from exactly_once.ledger.lost_offsets import OffsetsWentBack
from exactly_once.ledger.refusals import NotReprocessable
from exactly_once.operate import stalls
from exactly_once.operate.status import read_status
from tests import oracle
from tests.kafka_records import create_topic
from tests.ledger.harness import Pipeline, committed_records, row_of, workload


def recreate(servers: str, topic: str) -> None:
    """Deletes the topic and creates it again, empty, once the broker has forgotten it."""
    admin = AdminClient({"bootstrap.servers": servers})
    admin.delete_topics([topic])[topic].result(timeout=30)
    deadline = time.monotonic() + 60
    while True:
        try:
            create_topic(servers, topic, partitions=3)
            return
        except Exception:  # noqa: BLE001 - TOPIC_ALREADY_EXISTS while the deletion completes
            if time.monotonic() > deadline:
                raise
            time.sleep(0.5)


def test_offsets_that_go_backwards_stop_every_run_and_a_reset_reads_the_new_records_once(ledger_db, kafka_servers,
                                                                                           topic):
    pipeline = Pipeline(ledger_db, kafka_servers, topic)
    with_order = [s for s in pipeline.config.sinks if s.mode != "upsert"]  # see the refusal below
    pipeline.config = pipeline.ledger.config = pipeline.config.model_copy(update={"sinks": tuple(with_order)})
    pipeline.produce(workload(0, rounds=3))
    first = pipeline.run_once()
    before = committed_records(pipeline.produced, topic)

    recreate(kafka_servers, topic)
    pipeline.produced = []
    pipeline.produce(workload(500))  # fewer offsets than before in every partition
    for _ in range(2):
        with pytest.raises(OffsetsWentBack, match=rf"{topic}\[0\]: offsets went backwards: the pipeline planned "
                                                  r"up to offset \d+, but the partition's log now ends at \d+"):
            pipeline.run_once()
    with closing(psycopg2.connect(ledger_db)) as conn, KafkaOffsets(KafkaClient.at(kafka_servers)) as kafka:
        status = read_status(conn, kafka, pipeline.config.name)
    assert status.stopped and {p.partition for p in status.lag if p.went_back} == {0, 1, 2}

    labels = {p: stalls.reset_partition(pipeline.ledger, topic, p, 0, "topic created again") for p in (0, 1, 2)}
    assert labels == {p: f"{topic}@reset-1" for p in (0, 1, 2)}
    # A checkpoint that read the old log cannot be read again: refused naming the reset, no Kafka error.
    with pytest.raises(NotReprocessable, match=rf"checkpoint {first} read {topic}@reset-1\[0\].*reset since"):
        replays.reprocess(pipeline.ledger, first, "reprocess the old log")
    pipeline.run_once()
    pipeline.run_once()  # nothing new

    # The old records keep their rows (append rows relabelled like the ledger's history), the new ones count once.
    relabelled = [replace(r, topic=labels[r.partition]) for r in before]
    expected = oracle.expected(pipeline.config, relabelled + committed_records(pipeline.produced, topic), row_of)
    oracle.assert_exact(expected, pipeline.actual())
    with closing(psycopg2.connect(ledger_db)) as conn:
        assert violations(conn, pipeline.config) == []


def test_a_reset_is_refused_for_an_upsert_sink_without_an_order_and_for_a_partition_a_checkpoint_holds(pipeline):
    pipeline.produce(workload(0))
    pipeline.run_once()
    with pytest.raises(ConfigError, match=r"upsert sink\(s\) \['latest'\]"):
        stalls.reset_partition(pipeline.ledger, pipeline.topic, 0, 0, "why")
    keyless = pipeline.config.model_copy(update={"sinks": pipeline.config.sinks[::2]})
    pipeline.config = pipeline.ledger.config = keyless
    pipeline.produce(workload(100))
    held = pipeline.begin().checkpoint
    with pytest.raises(ConfigError, match=rf"checkpoint\(s\) hold some of it: {held.id} \(planned\)"):
        stalls.reset_partition(pipeline.ledger, pipeline.topic, 0, 0, "why")


@pytest.fixture
def pipeline(ledger_db, kafka_servers, topic) -> Pipeline:
    return Pipeline(ledger_db, kafka_servers, topic)


def test_partitions_added_to_a_topic_stop_a_pipeline_whose_upsert_sink_is_ordered_by_offset(pipeline):
    from confluent_kafka.admin import NewPartitions

    pipeline.produce(workload(0))
    pipeline.run_once()
    admin = AdminClient({"bootstrap.servers": pipeline.servers})
    admin.create_partitions([NewPartitions(pipeline.topic, 4)])[pipeline.topic].result(timeout=30)
    with pytest.raises(ConfigError, match=rf"partitions {pipeline.topic}\[3\] were added; .*upsert sink 'latest'"):
        pipeline.run_once()
    pipeline.assert_exact()  # nothing planned: the pipeline stops where it was
