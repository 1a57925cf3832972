"""The one-pass write's refusals (exactly_once.spark.one_pass), through the run path against
real Kafka, Spark and PostgreSQL, on local Spark and over Spark Connect (a client session in
this process, so that the table-by-table write can be made to fail). Rows a sink table would
refuse are left out by the pass, and their records are written as dead letters from the checked
rows' cache with the row checks' reasons, beside the records that do not parse: the table-by-table
write fails if it is called. A record the transform makes two rows of, one refused, makes the
pass give way to the table-by-table write, which leaves out its every row."""

from __future__ import annotations

import os

import pytest
from pyspark.sql import SparkSession

from exactly_once.spark import one_pass
from exactly_once.spark.staging_writes import StagingWrites
from tests.job_role import in_process
from tests.spark.poison import Orders, order, valid_orders, written_table_by_table
from tests.spark.test_poison import POISON

# The poison cases the row checks refuse (and one that does not parse): none fails a Spark job.
ROW_CHECKED = ("NUL in a string field", "NUL in an upsert/aggregate key", "number beyond the column's precision",
               "string longer than varchar(n)", "timestamp PostgreSQL cannot store", "invalid UTF-8 value")
TWIN = order("twin", sku="pear")


@pytest.fixture(params=["local", "connect"])
def session(request):
    """A local SparkSession, or a client of the stack's Spark Connect server (whose session
    leaves this process in Connect mode: the environment is put back for the next local one)."""
    if request.param == "local":
        return request.getfixturevalue("spark")
    server, saved = request.getfixturevalue("connect_server"), dict(os.environ)
    created = SparkSession.builder.remote(f"sc://{server['host']}:{server['port']}").create()

    def stopped():
        created.stop()
        os.environ.clear()
        os.environ.update(saved)
    request.addfinalizer(stopped)
    return created


@pytest.fixture
def letters(monkeypatch) -> list:
    """What each call of `OnePass.every_letter` returned (None: the pass gave way)."""
    returned, every_letter = [], one_pass.OnePass.every_letter

    def spy(self):
        returned.append(every_letter(self))
        return returned[-1]
    monkeypatch.setattr(one_pass.OnePass, "every_letter", spy)
    return returned


def test_rows_a_sink_table_would_refuse_are_left_out_by_the_pass_and_each_record_is_one_dead_letter(
        session, ledger_db, kafka_servers, topic, monkeypatch, letters):
    monkeypatch.setattr(StagingWrites, "every_table", written_table_by_table)
    cases = {case: POISON[case] for case in ROW_CHECKED}
    orders = Orders(ledger_db, kafka_servers, topic, bad=frozenset(value for value, _, _ in cases.values()),
                    transform="tests.spark.transforms:quantity")
    valid = valid_orders(0, 24)
    orders.produce(valid[:12] + [(i % 3, key, value) for i, (value, key, _) in enumerate(cases.values())] + valid[12:])

    orders.run(runner=in_process(session, orders.config.name, orders.servers))

    orders.assert_exact()
    at = {r.value: (r.partition, r.offset) for r in orders.records}
    assert orders.dead_letter_reasons() == {at[value]: reason for value, _, reason in cases.values()}
    assert len(letters) == 1 and letters[0] is not None  # the pass's letters, the refused records' among them


def test_a_refused_record_with_a_row_the_pass_wrote_is_written_again_table_by_table_and_reaches_no_sink(
        session, ledger_db, kafka_servers, topic, letters):
    orders = Orders(ledger_db, kafka_servers, topic, bad=frozenset({TWIN}),
                    transform="tests.spark.transforms:twins_one_order")
    valid = valid_orders(0, 12)
    orders.produce(valid[:6] + [(1, b"k", TWIN)] + valid[6:])

    orders.run(runner=in_process(session, orders.config.name, orders.servers))

    orders.assert_exact()
    at = {r.value: (r.partition, r.offset) for r in orders.records}
    assert orders.dead_letter_reasons() == {
        at[TWIN]: "sink latest: column sku: 15 characters, longer than character varying(8)"}
    assert letters == [None]  # the pass gave way
