"""A PostgreSQL table replicated through a real Debezium (Kafka Connect's worker and Debezium's
PostgreSQL connector in the local stack, `./dev up --cdc`) and the pipeline's run path: its
rows change from another thread while the connector takes its snapshot and streams; a
checkpoint runs while they do; the worker is killed and started again, so it sends again what
it sent since its last offset flush; a Spark job fails after staging the replicated table and
its task is retried; a commit is replayed; a checkpoint is reprocessed; the table is truncated
and refilled (the pipeline applies truncates: `on_truncate: truncate`). The replicated table
equals the source table, to the row; the audit table holds each change event of the topic
once; nothing is a dead letter."""

from __future__ import annotations

import json
import os
import signal
import time

import pytest

from exactly_once.ledger.checkpoints import Outcome
from exactly_once.orchestration import tasks
from exactly_once_stack import connect, process
from tests.oracle import assert_same_rows
from tests.spark.captured import CapturedTable, Writer
from tests.spark.change_feed import ChangeFeed, Run, failed_once_and_retried
from tests.spark.conftest import connect_runner

ROWS = 3000


@pytest.fixture(scope="module")
def capture(stack_env):
    """The stack's Kafka Connect worker; started if none runs, and then stopped (by PID)."""
    started = connect.start()
    yield
    if started:  # and its connector's slot, which would keep the log of the rest of the suite
        connect.stop()
        connect.forget()


def killed_and_started_again(table: CapturedTable) -> None:
    """The worker killed (no offset flush) and started again with the table's connector."""
    os.kill(connect.pid(), signal.SIGKILL)
    process.wait_until(lambda: connect.pid() is None, 30, "the killed worker's exit")
    time.sleep(1)  # the table changes while no worker runs
    connect.start()
    connect.put_connector(table.connector)


def expected_and_actual(feed: ChangeFeed, table: CapturedTable) -> tuple[dict, dict]:
    """The replica against the source table, the audit table against the topic's change events."""
    events = [(r.partition, r.offset, json.loads(r.value)) for r in table.records() if r.value]
    events = [(p, o, e) for p, o, e in events if e["op"] != "t"]  # an append sink takes no row of a truncate
    actual = feed.actual()
    return ({"items": table.rows(),
             "changes": {(e["after" if e["op"] != "d" else "before"]["id"], e["op"], p, o) for p, o, e in events},
             "dead_letters": set()},
            {"items": {row[:3] for row in actual["items"]},
             "changes": {(id, op, p, o) for id, _, _, op, _, p, o in actual["changes"]},
             "dead_letters": actual["dead_letters"]})


def snapshot_taken_while_writes_go_on(table: CapturedTable, writer: Writer) -> None:
    """The connector made, its snapshot read while the writer commits: some commit falls between
    the snapshot's first and last read, as Debezium timed them (the envelope's ts_ms)."""
    connect.put_connector(table.connector)
    records = table.wait_for(lambda events: any(e["source"]["snapshot"] == "last" for e in events))
    reads = [json.loads(r.value)["ts_ms"] for r in records if r.value and json.loads(r.value)["op"] == "r"]
    assert len(reads) > ROWS // 2  # the rows the table held when the snapshot began
    assert writer.commits_between(min(reads), max(reads)) > 0, "no write while the snapshot was read"


def replicated_through_faults(table: CapturedTable, feed: ChangeFeed, run: Run, monkeypatch) -> int:
    """The table's history and the faults; the checkpoint the Spark job failed in."""
    writer = Writer(table, range(1, ROWS + 1))
    writer.start()
    try:
        time.sleep(0.5)
        snapshot_taken_while_writes_go_on(table, writer)
        run()  # while the writes go on
        time.sleep(6)  # past the worker's offset flush (5 s): what it sent since then, it sends again
        killed_and_started_again(table)
        time.sleep(2)
    finally:
        writer.stop()
    table.mark(-1)

    checkpoint = failed_once_and_retried(feed, run, monkeypatch)

    table.execute("UPDATE {t} SET qty = qty * 2 WHERE id % 7 = 0; DELETE FROM {t} WHERE id % 11 = 0; "
                  "UPDATE {t} SET id = -id WHERE id % 13 = 0 AND id > 0")
    table.mark(-2)
    run()
    return checkpoint


def truncated_and_refilled(table: CapturedTable, feed: ChangeFeed, run: Run) -> None:
    """TRUNCATE, as Debezium writes it (no record key: any partition), then a refill, replicated."""
    table.execute("TRUNCATE {t}; INSERT INTO {t} SELECT i, 'refill ' || i, i FROM generate_series(1, 50) i")
    records = table.mark(-3)
    assert any(json.loads(r.value)["op"] == "t" for r in records if r.value)
    run()
    assert_replicated(feed, table, rows=50)


def assert_replicated(feed: ChangeFeed, table: CapturedTable, rows: int = ROWS // 2) -> None:
    expected, actual = expected_and_actual(feed, table)
    assert_same_rows(expected, actual)
    sent = [(r.partition, json.loads(r.value)["source"]["lsn"], r.key) for r in table.records() if r.value]
    assert len(sent) > len(set(sent)), "the restarted worker sent nothing again"
    assert len(expected["items"]) > rows


@pytest.mark.heavy  # Kafka Connect and Debezium for real; CI: Debezium's events modelled (test_change_feed.py)
def test_a_table_replicated_by_debezium_equals_its_source_table_through_faults(capture, spark, ledger_db,
                                                                               kafka_servers, monkeypatch):
    table = CapturedTable(ROWS, kafka_servers)
    try:
        feed = ChangeFeed(ledger_db, kafka_servers, table.topic, truncates=True)
        second = replicated_through_faults(table, feed, Run(feed, spark), monkeypatch)
        assert_replicated(feed, table)

        reprocessing = tasks.reprocess_checkpoint(feed.ledger, second, "test").checkpoint.id
        feed.increment(spark, reprocessing)
        assert feed.commit(reprocessing) is Outcome.COMMITTED
        assert_replicated(feed, table)

        truncated_and_refilled(table, feed, Run(feed, spark))
    finally:
        table.drop()


@pytest.mark.variant
def test_the_same_over_spark_connect(capture, connect_server, ledger_db, kafka_servers, monkeypatch):
    table = CapturedTable(ROWS, kafka_servers)
    try:
        feed = ChangeFeed(ledger_db, kafka_servers, table.topic, truncates=True)
        run = Run(feed, None, connect_runner(feed.config, kafka_servers, None, connect_server, monkeypatch))
        replicated_through_faults(table, feed, run, monkeypatch)
        assert_replicated(feed, table)
        truncated_and_refilled(table, feed, run)
    finally:
        table.drop()
