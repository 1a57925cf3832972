"""Issue 60, items 3 and 8(b): an output record Kafka refuses (larger than its topic's
`max.message.bytes`), against the real broker, Spark (in this process) and PostgreSQL. The
rows before it are published, it stalls the sink's publishing loudly (status exits 2 naming
the row, the topic and Kafka's error; the metric the alert rules watch is 1), ingestion into
PostgreSQL goes on (the next run's begin publishes first and plans all the same), and the
operator's way out moves the row to the outbox's dead letters, recorded, after which every
other record is published exactly once (a read_committed consumer). Two publishers of one
sink at once never stop on a row the other pruned."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections import Counter
from contextlib import closing
from datetime import datetime, timezone

import psycopg2
import pytest
from confluent_kafka.admin import AdminClient, AlterConfigOpType, ConfigEntry, ConfigResource

from confluent_kafka import KafkaException

from exactly_once.kafka_client import KafkaClient
from exactly_once.ledger.kafka_offsets import KafkaOffsets
from exactly_once.operate import metrics
from exactly_once.orchestration import tasks
from exactly_once.orchestration.outcomes import TaskOutcome, after_begin
from exactly_once.publishing.refusals import fenced
from tests.publishing.outbox_pipeline import OutboxPipeline, orders

LIMIT = 20_000  # the events topic's max.message.bytes: far above a batch of the small orders, below the big one


def limit_message_bytes(servers: str, topic: str, limit: int) -> None:
    admin = AdminClient({"bootstrap.servers": servers})
    resource = ConfigResource("topic", topic, incremental_configs=[
        ConfigEntry("max.message.bytes", str(limit), incremental_operation=AlterConfigOpType.SET)])
    admin.incremental_alter_configs([resource])[resource].result(timeout=30)


def big_order(i: int) -> bytes:
    return json.dumps({"id": f"o{i}-" + "x" * (LIMIT + 5_000), "sku": "apple", "qty": 1}).encode()


@pytest.fixture
def pipeline(ledger_db, kafka_servers, topic) -> OutboxPipeline:
    built = OutboxPipeline(ledger_db, kafka_servers, topic)
    limit_message_bytes(kafka_servers, built.events_topic, LIMIT)
    return built


def cli(module: str, *arguments: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", module, *arguments], env=os.environ, capture_output=True,
                          text=True, timeout=120)


def begin_as_the_dag(pipeline: OutboxPipeline) -> int | None:
    """The DAG's begin: what earlier runs left is published first, then the run's checkpoint planned."""
    pipeline.runs += 1
    client = KafkaClient.at(pipeline.servers)
    with KafkaOffsets(client) as kafka:
        begun = tasks.begin_checkpoint(pipeline.ledger, kafka, f"run{pipeline.runs}", None, None,
                                       publish_with=client)
    return begun.checkpoint.id if after_begin(begun) is TaskOutcome.DONE else None


def stalled_gauge(pipeline: OutboxPipeline) -> float:
    with closing(psycopg2.connect(pipeline.db_url)) as conn:
        samples = metrics.read_samples(conn, None, datetime.now(timezone.utc), only=[pipeline.name])
    return next(s.value for s in samples if s.name == "exactly_once_stalled")


def event_ids(pipeline: OutboxPipeline) -> Counter:
    return Counter(json.loads(r.value)["id"] for r in pipeline.published(pipeline.events_topic))


def test_a_record_kafka_refuses_stalls_its_sinks_publishing_loudly_not_ingestion_and_is_dead_lettered(
        spark, pipeline):
    pipeline.produce([(1, b"big", big_order(70))] + orders(0, 70), commit=True)
    first = pipeline.run(spark)  # begin, increment, commit: the outbox holds 71 events
    with pytest.raises(Exception, match=r"MSG_SIZE_TOO_LARGE|[Mm]essage size too large") as refused:
        pipeline.publish()
    print(refused.value)
    # The rows before the refused one in the publishing order reach Kafka; it and those after it wait.
    [[checkpoint_id, position]] = pipeline.sql(
        "SELECT checkpoint_id, position FROM exactly_once.outbox WHERE pipeline = %s AND sink = 'events' "
        "AND record ->> 'id' LIKE 'o70-%%'", pipeline.name)
    assert checkpoint_id == first
    published = event_ids(pipeline)
    assert all(n == 1 for n in published.values()) and not any(i.startswith("o70-") for i in published)

    # Loud: status exits 2 naming the sink, the row, the topic and Kafka's error; the metric is 1.
    status = cli("exactly_once.operate.status", "--pipeline", pipeline.name)
    print(status.stdout, status.stderr)
    assert status.returncode == 2, status.stdout + status.stderr
    assert "sink events" in status.stdout and f"checkpoint {checkpoint_id} row {position}" in status.stdout
    assert pipeline.events_topic in status.stdout and "MSG_SIZE_TOO_LARGE" in status.stdout
    assert "dead-letter-output" in status.stdout
    assert stalled_gauge(pipeline) == 1

    # Ingestion goes on: the next run's begin publishes first (refused again), and plans all the same.
    pipeline.produce(orders(71, 65))
    second = begin_as_the_dag(pipeline)
    assert second is not None and second != first
    pipeline.increment(spark, second)
    pipeline.commit(second)
    assert pipeline.sql(f"SELECT count(*) FROM {pipeline.name}.orders")[0][0] == 136
    assert cli("exactly_once.operate.status", "--pipeline", pipeline.name).returncode == 2

    # The way out: the refused row to the outbox's dead letters, recorded; publishing goes on.
    out = cli("exactly_once.operate.stalls", "dead-letter-output", pipeline.name, "events",
              "--reason", "an order id nobody can read")
    print(out.stdout, out.stderr)
    assert out.returncode == 0, out.stderr
    [[reason, error, topic]] = pipeline.sql(
        "SELECT reason, error, topic FROM exactly_once.outbox_dead_letters WHERE pipeline = %s AND sink = 'events' "
        "AND checkpoint_id = %s AND position = %s", pipeline.name, checkpoint_id, position)
    assert reason == "an order id nobody can read" and "MSG_SIZE_TOO_LARGE" in error and topic == pipeline.events_topic
    assert pipeline.sql("SELECT action, checkpoint_id FROM exactly_once.operator_actions WHERE pipeline = %s",
                        pipeline.name) == [("dead_letter_output", checkpoint_id)]
    assert begin_as_the_dag(pipeline) is None  # publishes; nothing new to read
    assert cli("exactly_once.operate.status", "--pipeline", pipeline.name).returncode == 0
    assert stalled_gauge(pipeline) == 0
    assert pipeline.outbox_rows() == 0
    expected = {f"o{i}" for i in range(136) if i != 70}
    assert event_ids(pipeline) == Counter(expected)  # every other record once, the refused one never
    totals = [json.loads(r.value) for r in pipeline.published(pipeline.totals_topic)]
    assert sum(t["orders"] for t in totals) == 136  # the totals sink was never held up by the events sink


def test_a_publisher_that_reads_kafkas_progress_while_another_records_and_prunes_it_goes_on(
        spark, pipeline, monkeypatch):
    """P1 committed its Kafka transaction and is about to record it; P2 (fencing nobody: P1's
    transaction is over) reads Kafka's progress, then the database's, and is held there while
    P1 records and prunes the rows up to that progress. P2 must take it as published by
    someone else, never as a database that lost the row (`OutboxMismatch`)."""
    pipeline.produce(orders(0, 20))
    pipeline.run(spark)
    pipeline.publish()  # the database has a recorded progress to read
    pipeline.produce(orders(20, 20))
    pipeline.run(spark)
    first = pipeline.publish_process("publish.after_commit=sleep:4")
    while "fault injected at publish.after_commit" not in first.stderr.readline():
        assert first.poll() is None, first.stderr.read()

    from exactly_once.publishing.publisher import Publisher
    ranked, held = Publisher._ranked, []

    def held_between_the_reads(self, cur, sink, at):
        if not held:  # the first read of the database's progress: P1 records and prunes meanwhile
            held.append(at)
            import time
            time.sleep(8)
        return ranked(self, cur, sink, at)

    monkeypatch.setattr(Publisher, "_ranked", held_between_the_reads)
    try:
        pipeline.publish()  # unchanged, this stopped with OutboxMismatch
    except KafkaException as error:
        assert fenced(error), error  # P1, on to the next sink, may fence this one there: no matter
    _, stderr = first.communicate(timeout=120)
    assert held and "OutboxMismatch" not in stderr, stderr  # P1 may be fenced on the next sink: no matter
    pipeline.publish()
    assert event_ids(pipeline) == Counter(f"o{i}" for i in range(40))
    assert pipeline.outbox_rows() == 0
