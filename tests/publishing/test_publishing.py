"""Kafka sinks against the real broker, Spark and PostgreSQL: what a commit decides reaches
the sink's topic exactly once, seen by a read_committed consumer, through a zombie fenced by
its successor, checkpoints committing out of order, reprocessing, and a database that no
longer holds what Kafka's progress names. A publisher killed, too slow for its transaction's
timeout or under a broker restart, and a commit rolled back, are rows t to x of the fault
matrix (tests/faults/publishing.py; CI runs t)."""

from __future__ import annotations

import os
import signal
import subprocess
import time
from collections import defaultdict
from contextlib import closing

import psycopg2
import pytest

from exactly_once.kafka_columns import KAFKA_OFFSET, KAFKA_PARTITION
from exactly_once.ledger.refusals import NotReprocessable
from exactly_once.operate.status import read_status
from exactly_once.operate.status_report import render
from exactly_once.orchestration import tasks
from exactly_once.publishing.progress import OutboxMismatch
from exactly_once.publishing.transactions import CHECKPOINT_HEADER, REPLACES_HEADER
from tests.publishing.murmur2 import java_partition
from tests.publishing.outbox_pipeline import OutboxPipeline, orders

EVENT_PARTITIONS = 4


@pytest.fixture
def pipeline(ledger_db, kafka_servers, topic) -> OutboxPipeline:
    return OutboxPipeline(ledger_db, kafka_servers, topic)


def header(record, name: str) -> str | None:
    return next((v.decode() for k, v in record.headers if k == name), None)


def backlog(pipeline: OutboxPipeline) -> dict[str, tuple]:
    with closing(psycopg2.connect(pipeline.db_url)) as conn:
        status = read_status(conn, None, pipeline.name)
    print(render(status))
    return {b.sink: (b.records, b.first_checkpoint, b.published_through, b.held_behind) for b in status.backlog}


def assert_keyed_in_order(pipeline: OutboxPipeline) -> None:
    """Every record of a key in the partition Java's murmur2 partitioner gives it; a key's
    records of one source partition in their offsets' order."""
    import json

    seen = defaultdict(list)
    for record in pipeline.published(pipeline.events_topic):
        assert record.partition == java_partition(record.key, EVENT_PARTITIONS), record
        value = json.loads(record.value)
        seen[(record.key, value[KAFKA_PARTITION])].append(value[KAFKA_OFFSET])
    assert seen and all(offsets == sorted(offsets) for offsets in seen.values()), seen


def publishing_one_checkpoint(spark, pipeline: OutboxPipeline, pause: float) -> subprocess.Popen:
    """A checkpoint of 20 orders committed, and a `publish` process that waits `pause`
    seconds inside its Kafka transaction, its records sent, returned once it waits there."""
    pipeline.produce(orders(0, 20))
    pipeline.run(spark)
    publisher = pipeline.publish_process(f"publish.before_commit=sleep:{pause}")
    while "fault injected at publish.before_commit" not in publisher.stderr.readline():
        assert publisher.poll() is None, publisher.stderr.read()
    return publisher


def test_a_zombie_publisher_is_fenced_by_its_successor_and_nothing_is_duplicated(spark, pipeline):
    zombie = publishing_one_checkpoint(spark, pipeline, pause=6)
    os.kill(zombie.pid, signal.SIGSTOP)  # paused inside its transaction, its records sent
    paused = time.monotonic()
    try:
        assert [p.records for p in pipeline.publish()] == [20, 5]  # init_transactions fenced it
    finally:
        time.sleep(max(0.0, 7 - (time.monotonic() - paused)))  # its sleep over: it commits at once
        os.kill(zombie.pid, signal.SIGCONT)
    _, stderr = zombie.communicate(timeout=120)
    assert zombie.returncode != 0 and "fenced" in stderr.lower(), stderr
    pipeline.assert_exact()


def test_publishing_follows_the_committed_frontier_and_stops_where_the_database_lacks_what_kafka_names(
        spark, pipeline):
    pipeline.produce(orders(0, 9))
    first = pipeline.begin()
    pipeline.produce(orders(9, 9))
    second = pipeline.begin()  # planned after the first, committed before it
    pipeline.increment(spark, second)
    pipeline.commit(second)
    assert [p.records for p in pipeline.publish()] == [0, 0]
    assert backlog(pipeline)["events"] == (9, second, None, first)

    pipeline.increment(spark, first)
    pipeline.commit(first)
    assert [p.records for p in pipeline.publish()] == [18, 10]
    checkpoints = [header(r, CHECKPOINT_HEADER) for r in pipeline.published(pipeline.totals_topic)]
    for partition in range(2):  # per partition (per key), the first checkpoint's records first
        order = [header(r, CHECKPOINT_HEADER) for r in pipeline.published(pipeline.totals_topic)
                 if r.partition == partition]
        assert order == sorted(order, key=int), order
    assert sorted(set(checkpoints)) == sorted({str(first), str(second)})
    pipeline.assert_exact()
    assert_keyed_in_order(pipeline)

    # The database restored from a backup taken before those publishes: it knows of no
    # publishing, and its next checkpoint's rows come at positions Kafka says are published.
    published = len(pipeline.published(pipeline.events_topic))
    pipeline.sql("DELETE FROM exactly_once.outbox_published WHERE pipeline = %s", pipeline.name)
    pipeline.produce(orders(18, 6))
    pipeline.run(spark)
    with pytest.raises(OutboxMismatch, match=r"Kafka's progress says checkpoint \d+ row \d+ .* was published, but "
                                             r"the outbox holds no such row; was the database restored"):
        pipeline.publish()
    assert len(pipeline.published(pipeline.events_topic)) == published
    assert pipeline.outbox_rows() == 11  # nothing skipped, nothing pruned


def test_a_reprocessing_is_refused_or_republishes_naming_the_checkpoint_it_replaces(spark, ledger_db,
                                                                                    kafka_servers, topic):
    refusing = OutboxPipeline(ledger_db, kafka_servers, topic)
    refusing.produce(orders(0, 6))
    committed = refusing.run(spark)
    with pytest.raises(NotReprocessable, match=r"kafka sink\(s\) events \(topic .*\), totals .*on_reprocess: "
                                               r"republish"):
        tasks.reprocess_checkpoint(refusing.ledger, committed, "test")

    republishing = OutboxPipeline(ledger_db, kafka_servers, topic, on_reprocess="republish")
    committed = republishing.run(spark)
    republishing.publish()
    reprocessing = tasks.reprocess_checkpoint(republishing.ledger, committed, "test").checkpoint.id
    republishing.increment(spark, reprocessing)
    republishing.commit(reprocessing)
    assert [p.records for p in republishing.publish()] == [6, 5]
    events = republishing.published(republishing.events_topic)
    first = sorted((r.key, r.value) for r in events if header(r, REPLACES_HEADER) is None)
    again = sorted((r.key, r.value) for r in events if header(r, REPLACES_HEADER) == str(committed))
    assert len(events) == 12 and first == again
    assert {header(r, CHECKPOINT_HEADER) for r in events if header(r, REPLACES_HEADER)} == {str(reprocessing)}
