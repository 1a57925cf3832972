"""Debezium change events (`source.envelope: debezium`) replicated through the pipeline's run
path, against real Kafka and PostgreSQL: after a snapshot, inserts, updates, key updates,
deletes with their tombstones, a source transaction of many rows, hostile events, events
re-sent as by a restarted Connect worker, a Spark job that fails after staging one sink, a
commit replayed and a reprocessing, the replicated table equals the source table, to the row
(tests/spark/change_feed.py), whatever partition or checkpoint brought each change."""

from __future__ import annotations

import json
from decimal import Decimal

import pytest
from pyspark.sql import functions as F

from exactly_once.config import load_config
from exactly_once.debezium import NO_POSITION, POSITION
from exactly_once.ledger.checkpoints import Outcome
from exactly_once.orchestration import tasks
from exactly_once.spark.frames import parse
from tests.spark.change_feed import ChangeFeed, Run, failed_once_and_retried
from tests.spark.conftest import connect_runner


def produce_history(feed: ChangeFeed, after_part=lambda part: None) -> None:
    """Produces the source's history in three parts, calling `after_part` after the first two."""
    source = feed.source
    source.preexisting(range(1, 31))
    feed.produce(source.initial_snapshot(11, qty=111)
                 + [e for i in range(31, 41) for e in source.insert(i, f"new {i}", i)])
    feed.produce(source.update(3, qty=33) + source.delete(4))
    first = feed.sent[:]
    after_part(1)
    feed.produce(source.update(5, name="five") + source.rekey(6, 106) + source.delete(7)
                 + source.transaction(*(lambda i=i: source.insert(i, f"bulk {i}", i % 7) for i in range(200, 400)))
                 + feed.hostile(8) + source.update(8, qty=0)
                 # a Connect worker restarted re-sends what it sent since its last offset commit
                 + [e for e in first[-12:]])
    after_part(2)
    # late and older than what the replica holds: the first inserts of keys changed since, again
    feed.produce(source.update(9, qty=99) + source.delete(106) + [e for e in first[2:12]] + source.insert(4, "back", 4)
                 + source.update(200, name="bulk two hundred"))


def changes_in_three_checkpoints(feed: ChangeFeed, run, monkeypatch) -> int:
    """The history with a checkpoint after each part, the second failing once; the second."""
    second = []

    def checkpoint(part: int) -> None:
        if part == 1:
            run()
        else:
            second.append(failed_once_and_retried(feed, run, monkeypatch))

    produce_history(feed, checkpoint)
    run()
    return second[0]


def test_a_replicated_table_equals_its_source_table_through_faults_and_a_reprocessing(spark, ledger_db,
                                                                                     kafka_servers, topic,
                                                                                     monkeypatch):
    feed = ChangeFeed(ledger_db, kafka_servers, topic)
    second = changes_in_three_checkpoints(feed, Run(feed, spark), monkeypatch)
    feed.assert_exact()
    actual = feed.actual()
    assert len(actual["dead_letters"]) == 13 and len(actual["items"]) > 200 and (8,) in {r[:1] for r in actual["items"]}
    assert len({e.partition for e in feed.sent if e.op and e.row["id"] == 3}) > 1  # a key's changes spread
    assert (11, "item 11", 111) in {r[:3] for r in actual["items"]}  # the change in flight at the snapshot won

    reprocessing = tasks.reprocess_checkpoint(feed.ledger, second, "test").checkpoint.id
    feed.increment(spark, reprocessing)
    assert feed.commit(reprocessing) is Outcome.COMMITTED
    feed.assert_exact()


def test_a_truncate_empties_the_replica_of_older_changes_whatever_checkpoint_brings_them(spark, ledger_db,
                                                                                        kafka_servers, topic,
                                                                                        monkeypatch):
    """`on_truncate: truncate`: the source table truncated, then refilled; the truncate event
    comes a checkpoint late, after changes made since, and beside re-sent changes older than
    it; its checkpoint's Spark job fails once after staging. The replica is the source table
    after each. Reprocessed once the pipeline leaves truncates unapplied, the truncate's
    checkpoint brings back the rows it removed (every key recomputed); reprocessed applying them
    again, they go again. Then two checkpoints with a truncate each commit in the reverse order:
    the older truncate's rows stay out."""
    feed = ChangeFeed(ledger_db, kafka_servers, topic, truncates=True)
    source, run = feed.source, Run(feed, spark)
    source.preexisting(range(1, 31))
    feed.produce(source.initial_snapshot(11, qty=111)
                 + [e for i in range(31, 41) for e in source.insert(i, f"new {i}", i)])
    first = feed.sent[:]
    run()
    truncate = source.update(5, name="five") + source.delete(7) + source.truncate()
    feed.produce(truncate[:-1] + [e for i in range(500, 520) for e in source.insert(i, f"refill {i}", i)]
                 + source.rekey(505, 605) + feed.hostile(8) + first[-12:])  # re-sent by a restarted worker
    run()
    # the truncate not yet read (the source model is past it): the rows before it are all there
    assert {r[:2] for r in feed.actual()["items"]} >= {(5, "five"), (1, "item 1"), (505 + 100, "refill 505")}
    assert {r[0] for r in feed.actual()["items"]} == {*range(1, 41), *range(500, 520), 605} - {7, 505}

    feed.produce(truncate[-1:] + first[2:12] + source.update(501, qty=5) + source.delete(502)
                 + source.insert(7, "seven again", 7))
    truncated = failed_once_and_retried(feed, run, monkeypatch)
    feed.assert_exact()
    ids = {r[0] for r in feed.actual()["items"]}
    assert ids == {*range(500, 520), 605, 7} - {505, 502}

    for apply in (False, True):
        feed.apply_truncates(apply)
        reprocessing = tasks.reprocess_checkpoint(feed.ledger, truncated, "test").checkpoint.id
        feed.increment(spark, reprocessing)
        assert feed.commit(reprocessing) is Outcome.COMMITTED
        feed.assert_exact()
        back = set(range(13, 41)) & {r[0] for r in feed.actual()["items"]}  # keys that checkpoint's events lack
        assert back == (set() if apply else set(range(13, 41)))

    # two checkpoints, each with a truncate, committed in the reverse order (both planned before
    # either runs: a run's begin would commit a checkpoint pre-committed before it)
    checkpoints = []
    for i in (700, 800):
        feed.produce(source.insert(i, "before", 1) + source.truncate() + source.insert(i + 1, "after", 2))
        checkpoints.append(feed.begin())
    for checkpoint in checkpoints:
        feed.increment(spark, checkpoint)
    for checkpoint in reversed(checkpoints):
        assert feed.commit(checkpoint) is Outcome.COMMITTED
    feed.assert_exact()
    assert {r[0] for r in feed.actual()["items"]} == {801}


@pytest.mark.variant  # the registry's: CI replicates the same history as the JSON converter writes it
def test_the_avro_converter_s_events_under_two_writer_schemas_replicate_alike(spark, ledger_db, kafka_servers, topic):
    """The same history as Debezium's Avro converter writes it through the schema registry,
    under two writer schemas (the second with a column more), read into the reader schema the
    envelope makes from value_schema; hostile records are the Avro format's."""
    feed = ChangeFeed(ledger_db, kafka_servers, topic, avro=True)
    produce_history(feed)
    feed.run(spark)  # one checkpoint: the faults are the JSON test's, whatever the format
    feed.assert_exact()
    assert len(feed.actual()["dead_letters"]) == 6
    assert len({e.value[1:5] for e in feed.sent if e.op}) == 2  # both writer schemas' ids


@pytest.mark.variant
def test_the_same_over_spark_connect_as_the_airflow_task_runs_it(connect_server, ledger_db, kafka_servers, topic,
                                                                monkeypatch):
    feed = ChangeFeed(ledger_db, kafka_servers, topic)
    runner = connect_runner(feed.config, kafka_servers, None, connect_server, monkeypatch)
    changes_in_three_checkpoints(feed, Run(feed, None, runner), monkeypatch)
    feed.assert_exact()


def test_positions_order_postgresql_changes_by_commit_and_mysql_files_by_number(spark):
    """PostgreSQL's position is (sequence's first LSN, streamed, lsn): a transaction in flight at
    the snapshot (its change below the snapshot's LSN, the first streamed after it) outranks the
    snapshot's read, and a later transaction both. MySQL's file, pos and row order binlog files
    by their number (000009 before 000010). Parts beyond their digits, negative or not numbers
    make no position (a dead letter), never the time; without lsn or file, source.ts_ms."""
    config = load_config({"name": "p", "source": {"topics": ["t"], "envelope": "debezium",
                                                  "value_schema": {"id": "int"}},
                          "sinks": [{"name": "s", "table": "s", "mode": "append"}]})

    def event(op: str = "c", **source) -> bytes:
        return json.dumps({"op": op, "after": {"id": 1}, "source": source}).encode()

    values = [event("r", lsn=150, sequence='[null,"150"]'), event("u", lsn=100, sequence='[null,"100"]'),
              event("u", lsn=210, sequence='["200","210"]'), event(lsn=7, file="mysql-bin.000001", pos=1),
              event(file="mysql-bin.000009", pos=98765, row=2), event(file="mysql-bin.000010", pos=4),
              event(file="mysql-bin.000010", pos=4, row=1), event(ts_ms=1_780_000_000_000),
              event(lsn=-1), event(lsn=5, sequence='["x","5"]'), event(lsn=5, sequence=f'["{10**18}","5"]'),
              event(file="binlog", pos=4, ts_ms=1), event(file="mysql-bin.000010", pos=-4),
              event(file="mysql-bin.000010", pos=10**18)]
    records = spark.createDataFrame([("t", 0, i, None, v) for i, v in enumerate(values)],
                                    "topic string, partition int, offset long, key binary, value binary")
    parsed = parse(records.withColumns({"timestamp": F.current_timestamp(), "headers": F.lit(None)}), config)
    found = [(row["parsed"][POSITION], row["reason"]) for row in parsed.orderBy("offset").collect()]
    streamed = 10**19
    assert found == [(Decimal(150), None), (Decimal(streamed + 100), None),
                     (Decimal(200 * 10**20 + streamed + 210), None),
                     (Decimal(streamed + 7), None),
                     (Decimal("9" + "000000000000098765" + "0000000002"), None),
                     (Decimal("10" + "000000000000000004" + "0000000000"), None),
                     (Decimal("10" + "000000000000000004" + "0000000001"), None), (Decimal(1_780_000_000_000), None),
                     *[(None, NO_POSITION)] * 6]
