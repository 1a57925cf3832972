"""Error texts the ledger, the logs and the view keep (issue 36, should-fix items): bounded,
and without the record values a database error quotes; the view counts dead letters per
kind of reason, the most frequent kinds only."""

from __future__ import annotations

from contextlib import closing

import psycopg2
import pytest

from exactly_once.errors import MAX_ERROR_TEXT, AttemptFailed, error_text
from exactly_once.operate import overview
from exactly_once.orchestration import tasks
from tests.ledger.harness import Pipeline, workload

PGJDBC = ("java.sql.BatchUpdateException: Batch entry 0 INSERT INTO exactly_once.stg_p_orders (\"id\",\"note\") "
          "VALUES (('o1'),('the customer's card 4111 1111 1111 1111')) was aborted: ERROR: new row for relation "
          "\"orders\" violates check constraint \"orders_qty_check\"\n  Detail: Failing row contains (o1, the "
          "customer's card 4111 1111 1111 1111).  Call getNextException to see other errors in the batch.")


def test_an_error_text_keeps_no_record_values_and_is_bounded():
    text = error_text(PGJDBC)
    assert "4111" not in text and "Batch entry 0 (statement not shown) was aborted" in text
    assert 'violates check constraint "orders_qty_check"' in text
    assert "Failing row contains (values not shown)" in text
    assert error_text('ERROR: duplicate key value violates unique constraint "k"\n  Detail: Key (sku)=(secret) '
                      "already exists.") == ('ERROR: duplicate key value violates unique constraint "k"\n  Detail: '
                                             "Key (sku)=(values not shown) already exists.")
    long = error_text("x" * 100_000)
    assert len(long) < MAX_ERROR_TEXT + 50 and long.endswith("(98000 more characters cut)")


def test_a_failed_attempt_records_its_error_bounded_and_without_values(ledger_db, kafka_servers, topic):
    pipeline = Pipeline(ledger_db, kafka_servers, topic)
    pipeline.produce(workload(0))
    checkpoint_id = pipeline.begin().checkpoint.id

    def failing(arguments: list[str]) -> None:
        raise RuntimeError("stage 3 failed:\n" + "\tat org.apache.spark.Frame.run(Frame.java:1)\n" * 5000 + PGJDBC)

    with pytest.raises(AttemptFailed) as failed:
        tasks.run_increment(pipeline.ledger, checkpoint_id, failing)
    with closing(psycopg2.connect(ledger_db)) as conn, conn.cursor() as cur:
        cur.execute("SELECT a.reason, k.reason FROM exactly_once.attempts a JOIN exactly_once.checkpoints k "
                    "ON k.id = a.checkpoint_id WHERE a.checkpoint_id = %s", (checkpoint_id,))
        [(attempt_reason, checkpoint_reason)] = cur.fetchall()
    for text in (attempt_reason, checkpoint_reason, str(failed.value)):
        assert len(text) < MAX_ERROR_TEXT + 200 and "4111" not in text


def test_the_view_counts_dead_letters_per_kind_of_reason_the_most_frequent_kinds_only(ledger_db, kafka_servers,
                                                                                     topic):
    pipeline = Pipeline(ledger_db, kafka_servers, topic)
    pipeline.produce(workload(0))
    checkpoint_id = pipeline.run_once()
    reasons = [f"sink events: column price: {n}.99 does not fit numeric(6,2)" for n in range(1000, 1030)]
    reasons += [f"transform t: ValueError: kind {chr(97 + i)}{chr(97 + i)}" for i in range(25)]
    with closing(psycopg2.connect(ledger_db)) as conn, conn, conn.cursor() as cur:
        cur.executemany('INSERT INTO exactly_once.dead_letters (pipeline, topic, partition, "offset", reason, '
                        "checkpoint_id) VALUES (%s, %s, 9, %s, %s, %s)",
                        [(pipeline.config.name, topic, 10_000 + i, reason, checkpoint_id)
                         for i, reason in enumerate(reasons)])
    dag_id = f"dag_{pipeline.config.name}"
    overview.record_dag(pipeline.ledger.connect, pipeline.config.name, dag_id)

    [shown] = overview.read_overviews(pipeline.ledger.connect, "no Kafka here", history=1, dead_letters=1,
                                      visible=lambda dag: dag == dag_id)
    kinds = dict(shown.dead_letter_reasons)
    assert len(kinds) == overview.REASON_KINDS
    assert kinds["sink events: column price: # does not fit numeric(6,2)"] == 30  # one kind: values are no kinds
