"""Promise 9 against real Kafka, Spark and PostgreSQL: a checkpoint that fails for a
reason no record isolation fixes, or whose dead letters exceed the budget, stalls; every
later run fails naming it; the status says so and exits non-zero; the operator's ways out (a cleared task, a dead-lettered
range) are recorded and end with every record counted exactly once."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from contextlib import closing

import psycopg2
import pytest

from exactly_once.ledger.checkpoints import Outcome, State
from exactly_once.ledger.invariants import violations
from exactly_once.ledger.refusals import PromotionRefused, Stalled
from exactly_once.orchestration import tasks
from exactly_once.orchestration.outcomes import TaskOutcome, after_error
from tests.spark.poison import Orders, order, valid_orders


@pytest.fixture
def orders(ledger_db, kafka_servers, topic) -> Orders:
    return Orders(ledger_db, kafka_servers, topic)


def sql(orders: Orders, statement: str, *params) -> list[tuple]:
    with closing(psycopg2.connect(orders.db_url)) as conn, conn, conn.cursor() as cur:
        cur.execute(statement, params)
        return cur.fetchall() if cur.description else []


def cli(module: str, *arguments: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", module, *arguments], env=os.environ, capture_output=True,
                          text=True, timeout=120)


def test_a_dropped_sink_table_stalls_later_runs_fail_naming_it_and_a_cleared_task_commits_it(spark, orders):
    orders.produce(valid_orders(0, 12))
    checkpoint_id = orders.begin()
    table = orders.config.sink("per_sku").table
    sql(orders, f"ALTER TABLE {table} RENAME TO gone")  # the table vanishes after its run began

    with pytest.raises(Stalled, match=rf"checkpoint {checkpoint_id} .*ranges {orders.topic}\[0\]@0\.\.\d+.*"
                                      r"last error: SinkTableError: .*do not exist") as stalled:
        orders.increment(spark, checkpoint_id)
    checkpoint = orders.ledger.checkpoint(checkpoint_id)
    assert checkpoint.state is State.STALLED and "do not exist" in checkpoint.reason

    orders.produce(valid_orders(100, 3))
    with pytest.raises(Stalled) as later:  # a later run fails naming it, never "nothing to read"
        orders.begin()
    assert str(later.value) == str(stalled.value)
    status = cli("exactly_once.operate.status", "--pipeline", orders.config.name)
    assert status.returncode == 2, status.stderr
    first = status.stdout.splitlines()
    assert first[0] == f"pipeline {orders.config.name} — STALLED"
    assert first[1].startswith(f"STALLED: checkpoint {checkpoint_id} (DAG run run1) since ")
    assert "last error: SinkTableError:" in first[2]

    sql(orders, f"ALTER TABLE {table.split('.')[0]}.gone RENAME TO per_sku")  # the operator restores it...
    orders.increment(spark, checkpoint_id, cleared=True)  # ...and clears the failed increment task
    tasks.commit_checkpoint(orders.ledger, checkpoint_id, 1)
    assert orders.run(spark) is not None  # the pipeline moves on
    orders.assert_exact()
    assert cli("exactly_once.operate.status", "--pipeline", orders.config.name).returncode == 0
    assert sql(orders, "SELECT action, checkpoint_id FROM exactly_once.operator_actions WHERE pipeline = %s",
               orders.config.name) == [("resume", checkpoint_id)]


def test_an_operator_dead_letters_a_range_isolation_cannot_and_the_pipeline_moves_on(spark, ledger_db,
                                                                                      kafka_servers, topic):
    # Two records with one order id break a unique index only together: no single record
    # fails on its own, so isolation cannot single one out.
    orders = Orders(ledger_db, kafka_servers, topic, extra_ddl="CREATE UNIQUE INDEX ON {s}.orders (id);")
    orders.produce([*valid_orders(0, 6), (1, b"t", order("twin")), (1, b"t", order("twin", qty=2))])
    checkpoint_id = orders.begin()
    with pytest.raises(Stalled, match="no record fails on its own"):
        orders.increment(spark, checkpoint_id)
    twin = max((r for r in orders.records if b'"twin"' in r.value), key=lambda r: r.offset)  # the later one
    bad = f"{topic}[{twin.partition}]@{twin.offset}..{twin.offset + 1}"

    done = cli("exactly_once.operate.stalls", "dead-letter", orders.config.name, bad, "--reason", "duplicate order id")
    assert done.returncode == 0, done.stderr
    assert f"released to the next run: checkpoint {checkpoint_id}" in done.stdout
    assert orders.ledger.checkpoint(checkpoint_id).state is State.ABORTED

    orders.bad = {twin.value}
    assert orders.run(spark) is not None
    orders.assert_exact()
    reason = orders.dead_letter_reasons()[(twin.partition, twin.offset)]
    assert reason.startswith("dead-lettered by an operator at ") and reason.endswith(": duplicate order id")
    (action, acted_range, why), = sql(
        orders, "SELECT action, format('%%s[%%s]@%%s..%%s', topic, partition, from_offset, to_offset), reason "
                "FROM exactly_once.operator_actions WHERE pipeline = %s", orders.config.name)
    assert (action, acted_range, why) == ("dead_letter", bad, "duplicate order id")
    again = cli("exactly_once.operate.stalls", "dead-letter", orders.config.name, bad, "--reason", "again")
    assert again.returncode != 0 and "committed" in again.stderr


def test_a_sum_beyond_its_column_refused_at_commit_is_tried_again_and_stalls_instead_of_looping(spark, ledger_db,
                                                                                                kafka_servers, topic):
    # per_sku has no constraint, so no attempt promotes it on trial; plum's sum crosses int's limit at commit.
    orders = Orders(ledger_db, kafka_servers, topic, extra_ddl="ALTER TABLE {s}.per_sku ALTER quantity TYPE int; "
                                                              "INSERT INTO {s}.per_sku VALUES ('plum', 1, 2147483640);")
    orders.produce(valid_orders(0, 12))  # plum: orders 2, 5, 8, 11 with quantities 2, 5, 1, 4
    first = orders.begin()
    orders.increment(spark, first)
    with pytest.raises(PromotionRefused, match="sink per_sku: integer out of range"):
        tasks.commit_checkpoint(orders.ledger, first, 1)

    second = orders.begin()  # recovery releases its ranges; this run plans them again
    assert second != first and orders.ledger.checkpoint(first).state is State.ABORTED
    with pytest.raises(Stalled, match="sink per_sku: integer out of range; no record fails on its own"):
        orders.increment(spark, second)  # every sink on trial now: no single plum order overflows
    assert orders.ledger.checkpoint(second).state is State.STALLED

    sql(orders, f"ALTER TABLE {orders.config.sink('per_sku').table} ALTER quantity TYPE bigint")
    orders.increment(spark, second, cleared=True)  # the operator widened the column and cleared the task
    assert tasks.commit_checkpoint(orders.ledger, second, 1) is Outcome.COMMITTED
    assert sql(orders, f"SELECT orders, quantity FROM {orders.config.sink('per_sku').table} WHERE sku = 'plum'") == \
        [(5, 2147483652)]
    with closing(psycopg2.connect(ledger_db)) as conn:
        assert violations(conn, orders.config) == []


def test_a_column_that_does_not_take_its_values_type_stalls_the_checkpoint_naming_it(spark, ledger_db,
                                                                                     kafka_servers, topic):
    # The pipeline has a transform, so the preflight leaves its columns' types to the job; `note`
    # is a string in every record, which an int column takes only from a cast Spark's JDBC writer
    # never made: no record is at fault, and nothing is dead-lettered.
    orders = Orders(ledger_db, kafka_servers, topic, extra_ddl="ALTER TABLE {s}.orders ALTER note TYPE int USING 0;")
    orders.produce(valid_orders(0, 12))
    checkpoint_id = orders.begin()
    with pytest.raises(Stalled, match="ConfigError: sink orders: column note gets Spark string values: PostgreSQL "
                                      "says 'column \"note\" is of type integer but expression is of type "
                                      "character varying'"):
        orders.increment(spark, checkpoint_id)
    assert orders.ledger.checkpoint(checkpoint_id).state is State.STALLED
    assert orders.dead_letter_reasons() == {}


def test_a_producer_switching_to_a_schema_the_pipeline_cannot_read_stalls_on_the_dead_letter_budget(spark, orders):
    renamed = [(i % 3, f"k{i}".encode(), json.dumps({"orderId": f"n{i}", "item": "apple", "cost": 1}).encode())
               for i in range(30)]  # a producer's new schema: no field the pipeline reads
    orders.produce([*renamed, *valid_orders(0, 3)])
    orders.bad = {value for _, _, value in renamed}
    checkpoint_id = orders.begin()
    orders.increment(spark, checkpoint_id)  # pre-committed: 30 dead letters among 33 records

    with pytest.raises(Stalled, match=rf"checkpoint {checkpoint_id} .*dead-letter budget exceeded: 30 of the 33 "
                                      r"records it read are dead letters \(90\.9%\), more than "
                                      r"dead_letter_budget\.ratio 0\.5") as stalled:
        tasks.commit_checkpoint(orders.ledger, checkpoint_id, 1)
    assert after_error(stalled.value) is TaskOutcome.FAIL
    assert orders.ledger.checkpoint(checkpoint_id).state is State.STALLED
    assert sql(orders, "SELECT count(*) FROM exactly_once.dead_letters WHERE pipeline = %s",
               orders.config.name) == [(0,)]  # nothing of it is committed
    assert sql(orders, f"SELECT count(*) FROM {orders.config.sink('orders').table}") == [(0,)]
    status = cli("exactly_once.operate.status", "--pipeline", orders.config.name)
    assert status.returncode == 2 and "dead-letter budget exceeded" in status.stdout, status.stdout
    with pytest.raises(Stalled):
        orders.begin()  # later runs fail naming it

    # The operator looked at the dead letters and clears the commit task: it commits as it is, once.
    assert tasks.commit_checkpoint(orders.ledger, checkpoint_id, 2, orders.ledger.now()) is Outcome.COMMITTED
    assert tasks.commit_checkpoint(orders.ledger, checkpoint_id, 3) is Outcome.ALREADY_COMMITTED
    orders.assert_exact()
    assert sql(orders, "SELECT action FROM exactly_once.operator_actions WHERE checkpoint_id = %s",
               checkpoint_id) == [("resume",)]
