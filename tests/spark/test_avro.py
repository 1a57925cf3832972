"""Avro values through the stack's schema registry, keys and headers as columns, and
tombstones, through the pipeline's run path with the Spark job in this process: the final
tables and dead letters equal what the records say (tests/spark/avro_orders.py), to the row."""

from __future__ import annotations

import struct

import pytest

from exactly_once.errors import AttemptFailed
from exactly_once.ledger.refusals import Stalled
from exactly_once.orchestration import tasks
from exactly_once.schema_registry import SchemaRegistry
from tests.spark.avro_orders import AvroOrders
from tests.spark.conftest import connect_runner

TOMBSTONE_DEAD_LETTER = "value is null (a tombstone: source.tombstones is dead_letter)"


@pytest.fixture
def orders(ledger_db, kafka_servers, topic) -> AvroOrders:
    return AvroOrders(ledger_db, kafka_servers, topic, tombstones="dead_letter")


def produce_three_writers_and_hostile_records(orders: AvroOrders,
                                              tombstone_reason: str | None = TOMBSTONE_DEAD_LETTER) -> None:
    """Records of the three writer schemas, with keys and headers, among hostile ones; a
    tombstone, a dead letter with `tombstone_reason` (None: the pipeline deletes or skips it)."""
    ids = {version: orders.schema_id(version) for version in (1, 2, 3)}  # registered in order, each reading the last
    v1, v2, v3 = ({"id": "a1", "n": 1}, {"id": "b1", "n": 2, "note": "second"},
                  {"id": "c1", "n": 2**40, "note": "wide"})
    good = orders.encoded(3, {"id": "c2", "n": 7, "note": "hello"})
    unknown_id = 2**31 - 7
    orders.produce([
        ("ann", orders.encoded(1, v1), v1, None, "web"),
        ("bob", orders.encoded(2, v2), v2, None, None),
        ("cid", orders.encoded(3, v3), v3, None, "shop"),
        ("ann", orders.encoded(2, {**v2, "id": "a2"}), {**v2, "id": "a2"}, None, None),
        ("bob", orders.encoded(1, {**v1, "id": "b2"}), {**v1, "id": "b2"}, None, None),
        ("dan", b"\x01" + good[1:], None,
         "value is not in the schema registry's wire format (magic byte 0 and a 4-byte schema id, then the Avro "
         "payload)", None),
        ("dan", b"\x00" + struct.pack(">I", unknown_id) + good[5:], None,
         f"value: schema id {unknown_id} is unknown to the schema registry", None),
        ("dan", good[:-2], None,
         f"value does not decode with its writer schema (id {ids[3]}) into the reader schema", None),
        ("dan", b'{"id": "j1", "n": 1, "note": ""}', None,
         "value is not in the schema registry's wire format (magic byte 0 and a 4-byte schema id, then the Avro "
         "payload)", None),
        (b"\xff\xfe", orders.encoded(3, v3), None, "key is not valid UTF-8", None),
        ("eve", None, None, tombstone_reason, None),
    ])
    assert len(set(ids.values())) == 3


# In CI; tests/dags/test_avro_pipeline.py (a variant) runs the same records through `airflow dags test`.
def test_three_writer_schemas_in_one_checkpoint_read_into_the_reader_schema_and_hostile_records_named(spark,
                                                                                                      orders):
    produce_three_writers_and_hostile_records(orders)
    assert orders.run(spark) is not None
    orders.assert_exact()
    assert orders.run(spark) is None  # nothing more to read: no record counted twice


def test_a_registry_that_does_not_answer_fails_the_attempt_for_a_retry_and_judges_no_record(spark, ledger_db,
                                                                                            kafka_servers, topic):
    orders = AvroOrders(ledger_db, kafka_servers, topic, tombstones="skip")
    order = {"id": "c1", "n": 5, "note": "x"}
    orders.produce([("ann", orders.encoded(3, order), order, None, None), ("ann", None, None, None, None)])
    checkpoint_id = orders.begin()
    silent = SchemaRegistry(orders.registry.connection, "https://127.0.0.1:9/apis/ccompat/v7",
                            orders.registry.login, orders.registry.tls_settings)
    with pytest.raises(AttemptFailed, match="the schema registry does not answer") as failed:
        orders.increment(spark, checkpoint_id, silent)
    assert failed.value.retryable

    orders.increment(spark, checkpoint_id)  # the task's retry, the registry back
    orders.commit(checkpoint_id)
    expected = orders.assert_exact()
    assert expected["latest"] and not expected["dead_letters"]  # a skipped tombstone deletes nothing


def test_an_unknown_schema_id_fails_the_first_attempt_for_a_retry_and_the_retry_dead_letters_it(
        spark, ledger_db, kafka_servers, topic):
    orders = AvroOrders(ledger_db, kafka_servers, topic, tombstones="skip")
    order = {"id": "c1", "n": 5, "note": "x"}
    good = orders.encoded(3, order)
    unknown_id = 2**31 - 11  # a schema a registry follower may not have yet
    orders.produce([("ann", good, order, None, None),
                    ("dan", b"\x00" + struct.pack(">I", unknown_id) + good[5:], None,
                     f"value: schema id {unknown_id} is unknown to the schema registry", None)])
    checkpoint_id = orders.begin()
    with pytest.raises(AttemptFailed, match=f"schema id {unknown_id} is unknown to the schema registry") as failed:
        orders.increment(spark, checkpoint_id)
    print(failed.value)
    assert failed.value.retryable  # (the reader schema is inline here: no subject to name)
    assert orders.actual()["dead_letters"] == set()

    orders.increment(spark, checkpoint_id)  # the task's retry asks again: still unknown, a dead letter
    orders.commit(checkpoint_id)
    assert orders.assert_exact()["dead_letters"]

def test_tombstones_delete_upsert_rows_over_three_checkpoints_and_a_reprocessing_replays_them(spark, ledger_db,
                                                                                             kafka_servers, topic):
    orders = AvroOrders(ledger_db, kafka_servers, topic)  # tombstones: delete

    def order(customer: str, i: int) -> tuple:
        value = {"id": f"{customer}{i}", "n": i, "note": f"#{i}"}
        return customer, orders.encoded(3, value), value, None, None

    def tombstone(customer: str) -> tuple:
        return customer, None, None, None, None

    orders.produce([order("ann", 1), order("bob", 1), order("cid", 1)])
    orders.run(spark)
    orders.produce([tombstone("ann"), order("bob", 2), order("dan", 1), order("cid", 2), tombstone("cid")])
    second = orders.run(spark)
    orders.produce([order("ann", 3), tombstone("bob"), tombstone("eve")])
    orders.run(spark)
    expected = orders.assert_exact()
    assert {row[0] for row in expected["latest"]} == {"ann", "dan"}  # the model deletes what the records say

    reprocessing = tasks.reprocess_checkpoint(orders.ledger, second, "test").checkpoint.id
    orders.increment(spark, reprocessing)
    orders.commit(reprocessing)
    assert orders.assert_exact() == expected


@pytest.mark.variant
def test_the_same_over_spark_connect_as_the_airflow_task_runs_it(connect_server, orders, monkeypatch):
    runner = connect_runner(orders.config, orders.servers, orders.registry, connect_server, monkeypatch)
    produce_three_writers_and_hostile_records(orders)
    assert orders.run(None, runner) is not None
    orders.assert_exact()


def test_a_registry_url_that_is_no_registry_api_fails_the_attempt_for_good_and_judges_no_record(spark, orders):
    order = {"id": "c1", "n": 5, "note": "x"}
    orders.produce([("ann", orders.encoded(3, order), order, None, None)])
    checkpoint_id = orders.begin()
    api_root_missing = SchemaRegistry(orders.registry.connection, orders.registry.url.split("/apis/")[0],
                                      orders.registry.login, orders.registry.tls_settings)
    with pytest.raises(Stalled, match="ConfigError: connection 'schema_registry_default': the schema registry "
                                      "answers HTTP 404 without a registry's error code asked for schema id"):
        orders.increment(spark, checkpoint_id, api_root_missing)  # no retry fixes it: stalled at once
    assert orders.actual()["dead_letters"] == set()
