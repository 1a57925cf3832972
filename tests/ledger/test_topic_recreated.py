"""A topic deleted and created again, then refilled past the pipeline's frontier (issue 60,
item 5), against a real broker: its new log is no shorter than what was planned, so only
the topic's id (KIP-516) tells it from the old one. The next run stops with
`OffsetsWentBack` naming the topic and both ids, planning and skipping nothing; a
checkpoint planned before the re-creation fails its attempt naming both ids instead of
reading the new records under the old ones' ranges (promise 7); and after an operator's
`reset-partition` the pipeline reads the new topic from its start, every record once."""

from __future__ import annotations

import re
import time
import uuid
from contextlib import closing
from dataclasses import replace
from pathlib import Path

import psycopg2
import pytest
from confluent_kafka import TopicCollection
from confluent_kafka.admin import AdminClient

from exactly_once.errors import ConfigError
from exactly_once.kafka_client import KafkaClient
from exactly_once.ledger.invariants import violations
from exactly_once.ledger.kafka_offsets import KafkaOffsets
from exactly_once.ledger.lost_offsets import OffsetsWentBack
from exactly_once.operate import stalls
from exactly_once.operate.status import read_status
from exactly_once.orchestration import tasks
from exactly_once.spark import increment
from tests import oracle
from tests.kafka_records import create_topic
from tests.ledger.harness import KEYS, Pipeline, committed_records, order, query, row_of

PARTITIONS = 2


def topic_id(servers: str, topic: str) -> str:
    admin = AdminClient({"bootstrap.servers": servers})
    return str(admin.describe_topics(TopicCollection([topic]), request_timeout=10)[topic].result().topic_id)


def recreate(servers: str, topic: str, old_id: str) -> str:
    """Deletes the topic and creates it again, empty; returns once the broker's metadata
    shows the new topic (its new id); the new id."""
    admin = AdminClient({"bootstrap.servers": servers})
    admin.delete_topics([topic])[topic].result(timeout=30)
    deadline = time.monotonic() + 60
    while True:
        try:
            create_topic(servers, topic, partitions=PARTITIONS)
            break
        except Exception:  # noqa: BLE001 - TOPIC_ALREADY_EXISTS while the deletion completes
            if time.monotonic() > deadline:
                raise
            time.sleep(0.5)
    while True:
        try:
            new_id = topic_id(servers, topic)
            if new_id != old_id:
                return new_id
        except Exception:  # noqa: BLE001 - unknown for a moment on a busy broker
            pass
        if time.monotonic() > deadline:
            raise TimeoutError(f"topic {topic!r} created again but its metadata still shows id {old_id}")
        time.sleep(0.2)


def orders(first: int, transactions: int, per_transaction: int = 10) -> list:
    """Committed transactions over both partitions (and one aborted), keys that repeat."""
    out = []
    for t in range(transactions):
        i = first + 100 * t
        out.append((True, [(j % PARTITIONS, KEYS[(i + j) % 4].encode(), order(i + j, KEYS[(i + j) % 4], i + j))
                           for j in range(per_transaction)]))
    out.append((False, [(p, b"x", order(first + 99, "apple", 10_000)) for p in range(PARTITIONS)]))
    return out


@pytest.fixture
def pipeline(ledger_db, kafka_servers) -> Pipeline:
    topic = f"t_recreated_{uuid.uuid4().hex[:8]}"
    create_topic(kafka_servers, topic, partitions=PARTITIONS)
    pipeline = Pipeline(ledger_db, kafka_servers, topic)
    # a reset is refused for an upsert sink ordered by offset (test_partition_reset.py)
    keyless = tuple(s for s in pipeline.config.sinks if s.mode != "upsert")
    pipeline.config = pipeline.ledger.config = pipeline.config.model_copy(update={"sinks": keyless})
    return pipeline


def frontiers(pipeline: Pipeline) -> dict[int, int]:
    return dict(query(pipeline.db_url, "SELECT partition, frontier FROM exactly_once.partitions WHERE pipeline = %s",
                      pipeline.config.name))


def recorded_ids(pipeline: Pipeline) -> set[str | None]:
    return {tid for tid, in query(pipeline.db_url, "SELECT topic_id FROM exactly_once.partitions WHERE pipeline = %s",
                                  pipeline.config.name)}


def planned_ranges(pipeline: Pipeline) -> list[tuple]:
    return query(pipeline.db_url, "SELECT checkpoint_id, topic, partition, from_offset, to_offset "
                                  "FROM exactly_once.checkpoint_ranges WHERE pipeline = %s ORDER BY 1, 2, 3",
                 pipeline.config.name)


def test_a_topic_created_again_and_refilled_past_the_frontier_stops_the_pipeline_until_a_reset(pipeline):
    topic, servers = pipeline.topic, pipeline.servers
    pipeline.produce(orders(0, transactions=3))
    pipeline.run_once()
    pipeline.produce(orders(1000, transactions=2))
    pipeline.run_once()
    before = committed_records(pipeline.produced, topic)
    old_id = topic_id(servers, topic)
    frontier = frontiers(pipeline)

    new_id = recreate(servers, topic, old_id)
    pipeline.produced = []
    pipeline.produce(orders(5000, transactions=8))  # past the old frontier in every partition
    with KafkaOffsets(KafkaClient.at(servers)) as kafka:
        assert all(kafka.offsets(topic, p, None, None).last_stable > frontier[p] for p in range(PARTITIONS))
    planned = planned_ranges(pipeline)
    for _ in range(2):
        with pytest.raises(OffsetsWentBack) as went_back:
            pipeline.run_once()
        said = str(went_back.value)
        print(said)
        assert f"{topic}[" in said and old_id in said and new_id in said, said
        assert "reset-partition" in said
    assert planned_ranges(pipeline) == planned  # nothing planned, nothing skipped
    assert frontiers(pipeline) == frontier
    with closing(psycopg2.connect(pipeline.db_url)) as conn, KafkaOffsets(KafkaClient.at(servers)) as kafka:
        status = read_status(conn, kafka, pipeline.config.name)
    assert status.stopped and {p.partition for p in status.lag if p.went_back} == set(range(PARTITIONS))

    with KafkaOffsets(KafkaClient.at(servers)) as kafka:
        labels = {p: stalls.reset_partition(pipeline.ledger, topic, p, 0, "topic created again", kafka=kafka)
                  for p in range(PARTITIONS)}
    assert labels == {p: f"{topic}@reset-1" for p in range(PARTITIONS)}
    assert recorded_ids(pipeline) == {new_id}
    pipeline.run_once()
    pipeline.run_once()  # nothing new

    relabelled = [replace(r, topic=labels[r.partition]) for r in before]
    expected = oracle.expected(pipeline.config, relabelled + committed_records(pipeline.produced, topic), row_of)
    oracle.assert_exact(expected, pipeline.actual())
    with closing(psycopg2.connect(pipeline.db_url)) as conn:
        assert violations(conn, pipeline.config) == []
    assert {tid for *_, tid in query(pipeline.db_url, "SELECT topic_id FROM exactly_once.checkpoint_ranges "
                                     "WHERE pipeline = %s AND topic = %s", pipeline.config.name, topic)} == {new_id}


def test_a_checkpoint_planned_before_the_topic_was_created_again_fails_its_attempt_naming_both_ids(pipeline):
    topic, servers = pipeline.topic, pipeline.servers
    pipeline.produce(orders(0, transactions=2))
    pipeline.run_once()
    before = committed_records(pipeline.produced, topic)
    pipeline.produce(orders(1000, transactions=2))
    checkpoint = pipeline.begin().checkpoint  # its ranges frozen in the old topic
    assert checkpoint.ranges
    old_id = topic_id(servers, topic)
    new_id = recreate(servers, topic, old_id)
    pipeline.produced = []
    pipeline.produce(orders(5000, transactions=8))  # the new log covers the frozen ranges

    def job(arguments: list[str]):
        """The Spark job's own code (increment.execute_attempt) up to its read, which it must not reach."""
        given = dict(zip(arguments[::2], arguments[1::2]))
        return increment.execute_attempt(None, pipeline.ledger, int(given["--checkpoint-id"]),
                                         int(given["--attempt"]), Path(given["--token"]).read_text(),
                                         KafkaClient.at(servers), pipeline.db_url)

    with pytest.raises(Exception) as failed:  # noqa: PT011 - Stalled, or the job's failure
        tasks.run_increment(pipeline.ledger, checkpoint.id, job)
    print(failed.value)
    [(reason, retryable)] = query(pipeline.db_url, "SELECT reason, retryable FROM exactly_once.attempts "
                                                   "WHERE checkpoint_id = %s", checkpoint.id)
    print(reason)
    assert topic in reason and old_id in reason and new_id in reason, reason
    assert retryable is False

    # The way out it names: release it, then reset the partitions; the new topic is read from its start.
    stalls.retry(pipeline.ledger, checkpoint.id)
    with pytest.raises(OffsetsWentBack, match=re.escape(f"id was {old_id} and is now {new_id}")):  # base64: + and /
        pipeline.run_once()
    with KafkaOffsets(KafkaClient.at(servers)) as kafka:
        labels = {p: stalls.reset_partition(pipeline.ledger, topic, p, 0, "topic created again", kafka=kafka)
                  for p in range(PARTITIONS)}
    pipeline.run_once()
    relabelled = [replace(r, topic=labels[r.partition]) for r in before]
    expected = oracle.expected(pipeline.config, relabelled + committed_records(pipeline.produced, topic), row_of)
    oracle.assert_exact(expected, pipeline.actual())
    with closing(psycopg2.connect(pipeline.db_url)) as conn:
        assert violations(conn, pipeline.config) == []


def test_a_ledger_without_ids_adopts_them_and_a_reset_is_refused_unless_kafka_shows_the_offsets_went_back(pipeline):
    topic, servers = pipeline.topic, pipeline.servers
    pipeline.produce(orders(0, transactions=2))
    pipeline.run_once()
    # as a ledger recorded before migration 0019 is: no ids; its next plan adopts the topic's
    query(pipeline.db_url, "UPDATE exactly_once.partitions SET topic_id = NULL WHERE pipeline = %s",
          pipeline.config.name)
    pipeline.produce(orders(1000, transactions=1))
    pipeline.run_once()
    assert recorded_ids(pipeline) == {topic_id(servers, topic)}
    pipeline.assert_exact()
    with KafkaOffsets(KafkaClient.at(servers)) as kafka:
        with pytest.raises(ConfigError, match=r"nothing says its offsets went back: the topic's id is still \S+ and"):
            stalls.reset_partition(pipeline.ledger, topic, 0, 0, "why", kafka=kafka)
        assert stalls.reset_partition(pipeline.ledger, topic, 0, 0, "replay it", kafka=kafka, force=True) \
            == f"{topic}@reset-1"
    assert recorded_ids(pipeline) == {topic_id(servers, topic)}
