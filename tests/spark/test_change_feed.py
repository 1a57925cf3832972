"""Debezium change events (`source.envelope: debezium`) replicated through the pipeline's run
path, against real Kafka and PostgreSQL: after a snapshot, inserts, updates, key updates,
deletes with their tombstones, a source transaction of many rows, hostile events, events
re-sent as by a restarted Connect worker, a Spark job that fails after staging one sink, a
commit replayed and a reprocessing, the replicated table equals the source table, to the row
(tests/spark/change_feed.py), whatever partition or checkpoint brought each change."""

from __future__ import annotations

import json

import pytest

from exactly_once.faults import ENV as FAULTS
from exactly_once.errors import AttemptFailed
from exactly_once.kafka_client import KafkaClient
from exactly_once.ledger.checkpoints import Outcome
from exactly_once.orchestration import tasks
from exactly_once.spark.runners import ConnectRunner, job_runner
from exactly_once.spark.settings import JobSettings
from tests.job_role import job_db_url
from tests.spark.change_feed import ChangeFeed
from tests.spark.conftest import CONNECTION


def changes_in_three_checkpoints(feed: ChangeFeed, run, monkeypatch) -> int:
    """Produces the source's history and runs a checkpoint after each part; the second one's
    first Spark job fails after staging the replicated table. The second checkpoint."""
    source = feed.source
    feed.produce([e for i in range(1, 31) for e in source.insert(i, f"item {i}", i)])
    feed.produce(source.snapshot() + source.update(3, qty=33) + source.delete(4))  # writes go on after the snapshot
    first = feed.sent[:]
    run()
    feed.produce(source.update(5, name="five") + source.rekey(6, 106) + source.delete(7)
                 + source.transaction(*(lambda i=i: source.insert(i, f"bulk {i}", i % 7) for i in range(200, 400)))
                 + source.hostile(8) + source.update(8, qty=0)
                 # a Connect worker restarted re-sends what it sent since its last offset commit
                 + [e for e in first[-12:]])
    checkpoint = feed.begin()
    monkeypatch.setenv(FAULTS, "increment.wrote.items=raise")
    with pytest.raises(AttemptFailed, match="InjectedFault: fault injected at increment.wrote.items"):
        feed.increment(run.spark, checkpoint, run.runner)
    monkeypatch.delenv(FAULTS)
    feed.increment(run.spark, checkpoint, run.runner)  # the task's retry: a new attempt
    assert feed.commit(checkpoint) is Outcome.COMMITTED
    assert feed.commit(checkpoint) is Outcome.ALREADY_COMMITTED  # a commit replayed changes nothing
    # late and older than what the replica holds: the first inserts of keys changed since, again
    feed.produce(source.update(9, qty=99) + source.delete(106) + [e for e in first[2:12]] + source.insert(4, "back", 4)
                 + source.update(200, name="bulk two hundred"))
    run()
    return checkpoint


class Run:
    """A DAG run of the feed: in this process's Spark session, or by `runner`."""

    def __init__(self, feed: ChangeFeed, spark, runner=None):
        self.feed, self.spark, self.runner = feed, spark, runner

    def __call__(self) -> int:
        return self.feed.run(self.spark, self.runner)


def test_a_replicated_table_equals_its_source_table_through_faults_and_a_reprocessing(spark, ledger_db,
                                                                                     kafka_servers, topic,
                                                                                     monkeypatch):
    feed = ChangeFeed(ledger_db, kafka_servers, topic)
    second = changes_in_three_checkpoints(feed, Run(feed, spark), monkeypatch)
    expected = feed.assert_exact()
    assert {d[2] for d in expected["dead_letters"]} and len(expected["items"]) == len(feed.source.rows) > 200
    assert len({e.partition for e in feed.sent if e.op and e.row["id"] == 3}) > 1  # a key's changes spread

    reprocessing = tasks.reprocess_checkpoint(feed.ledger, second, "test").checkpoint.id
    feed.increment(spark, reprocessing)
    assert feed.commit(reprocessing) is Outcome.COMMITTED
    assert feed.assert_exact() == expected


@pytest.mark.variant
def test_the_same_over_spark_connect_as_the_airflow_task_runs_it(connect_server, ledger_db, kafka_servers, topic,
                                                                monkeypatch):
    feed = ChangeFeed(ledger_db, kafka_servers, topic)
    monkeypatch.setenv(f"AIRFLOW_CONN_{CONNECTION.upper()}", json.dumps(connect_server))
    runner = job_runner(CONNECTION, f"{feed.config.name} increment", feed.config,
                        JobSettings(job_db_url(), KafkaClient.at(kafka_servers), None))
    assert isinstance(runner, ConnectRunner)
    changes_in_three_checkpoints(feed, Run(feed, None, runner), monkeypatch)
    feed.assert_exact()
