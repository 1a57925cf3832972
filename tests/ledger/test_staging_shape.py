"""Issue 36, item 5: a sink's staging table (and a keyed sink's contributions table) follows
its final table's shape at registration — types, nullability, columns added (the final's
default for the rows already there) and dropped — without losing a pre-committed
checkpoint's staged rows. Real Kafka and PostgreSQL, through the harness, whose driver plays
the Spark job and stages each final table's columns by name."""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable
from contextlib import closing

import psycopg2
import pytest

from exactly_once.ledger.checkpoints import Outcome
from exactly_once.ledger.registration import SinkTableError
from exactly_once.ledger.tables import contributions_table, qualified, staging_tables
from tests import oracle
from tests.ledger.harness import Pipeline, committed_records, order, row_of, workload
from tests.oracle import Record


@pytest.fixture
def pipeline(ledger_db, kafka_servers, topic) -> Pipeline:
    return Pipeline(ledger_db, kafka_servers, topic)


def alter(pipeline: Pipeline, statements: str) -> None:
    """What a user does to the pipeline's final tables ({schema} is theirs)."""
    with closing(psycopg2.connect(pipeline.db_url)) as conn, conn, conn.cursor() as cur:
        cur.execute(statements.format(schema=pipeline.config.name))


def pre_committed(pipeline: Pipeline) -> int:
    """A checkpoint of what was produced, pre-committed; its commit task has not run."""
    checkpoint_id = pipeline.begin().checkpoint.id
    pipeline.driver.run(checkpoint_id)
    return checkpoint_id


def assert_exact(pipeline: Pipeline, earlier: Iterable[int], row_of_earlier: Callable[[Record], dict | None]) -> None:
    """The tables equal the oracle: the rows of the `earlier` checkpoints' records as
    `row_of_earlier` makes them, every other record's as the driver makes it now."""
    ranges = [r for checkpoint_id in earlier for r in pipeline.ledger.checkpoint(checkpoint_id).ranges]

    def rows(record: Record) -> dict | None:
        return (row_of_earlier if oracle.in_ranges(record, ranges) else pipeline.driver.row_of)(record)

    expected = oracle.expected(pipeline.config, committed_records(pipeline.produced, pipeline.topic), rows)
    oracle.assert_exact(expected, pipeline.actual())


def test_a_widened_final_column_is_widened_in_staging_and_contributions_while_a_checkpoint_is_pre_committed(
        pipeline):
    alter(pipeline, "ALTER TABLE {schema}.events ALTER COLUMN n TYPE numeric(6,2);"
                    "ALTER TABLE {schema}.totals ALTER COLUMN total TYPE numeric(6,0)")
    pipeline.produce(workload(0))
    waiting = pre_committed(pipeline)  # registered first: staging as narrow as the final tables were
    alter(pipeline, "ALTER TABLE {schema}.events ALTER COLUMN n TYPE numeric(20,2);"  # the README's fix for a
                    "ALTER TABLE {schema}.totals ALTER COLUMN total TYPE numeric(20,0)")  # refused sum

    pipeline.ledger.register()
    assert pipeline.ledger.commit(waiting) is Outcome.COMMITTED
    pipeline.produce([(True, [(0, b"fig", order(1, "fig", 10**12))])])  # fits only the wider columns
    pipeline.run_once()
    pipeline.assert_exact()


def with_note_and_region(record: Record) -> dict | None:
    """The pipeline once its tables have a `note` and a `region`."""
    row = row_of(record)
    return row if row is None else {**row, "note": f"n={row['n']}", "region": "us"}


def before_the_columns(record: Record) -> dict | None:
    """A row staged or committed before the columns came: no note, the region's default."""
    row = row_of(record)
    return row if row is None else {**row, "note": None, "region": "eu"}


def test_columns_added_to_final_tables_while_a_checkpoint_is_pre_committed_are_added_to_staging(pipeline):
    pipeline.produce(workload(0))
    committed = pipeline.run_once()
    pipeline.produce(workload(1000))
    waiting = pre_committed(pipeline)
    for table in ("events", "latest"):  # append, and upsert with its contributions
        alter(pipeline, f"ALTER TABLE {{schema}}.{table} ADD COLUMN note text, "
                        "ADD COLUMN region text NOT NULL DEFAULT 'eu'")

    pipeline.ledger.register()
    assert pipeline.ledger.commit(waiting) is Outcome.COMMITTED
    pipeline.driver.row_of = with_note_and_region
    pipeline.produce(workload(2000))
    pipeline.run_once()
    assert_exact(pipeline, {committed, waiting}, before_the_columns)
    latest = pipeline.config.sink("latest")
    with closing(psycopg2.connect(pipeline.db_url)) as conn, conn.cursor() as cur:
        cur.execute(f"SELECT DISTINCT note, region FROM {qualified(contributions_table(pipeline.config, latest))} "
                    "WHERE checkpoint_id = %s", (committed,))
        assert cur.fetchall() == [(None, "eu")], "a contribution kept before the columns came takes their default"


def with_n_unknown_for_figs(record: Record) -> dict | None:
    row = row_of(record)
    return {**row, "n": None} if row is not None and row["k"] == "fig" else row


def test_staging_lets_in_nulls_once_the_final_column_does(pipeline):
    pipeline.produce(workload(0))
    committed = pipeline.run_once()
    alter(pipeline, "ALTER TABLE {schema}.events ALTER COLUMN n DROP NOT NULL;"
                    "ALTER TABLE {schema}.latest ALTER COLUMN n DROP NOT NULL")

    pipeline.driver.row_of = with_n_unknown_for_figs
    pipeline.produce(workload(1000))
    pipeline.run_once()
    assert_exact(pipeline, {committed}, row_of)
    assert None in {row["n"] for row in pipeline.actual()["events"]}


def test_a_staging_table_without_the_writer_task_column_gets_it_at_registration(pipeline):
    """As a library older than migration 0015, running beside it, creates staging tables."""
    pipeline.ledger.register()
    staging = qualified(staging_tables(pipeline.config)["events"])
    with closing(psycopg2.connect(pipeline.db_url)) as conn, conn, conn.cursor() as cur:
        cur.execute(f"ALTER TABLE {staging} DROP COLUMN writer_task")
    pipeline.ledger.register()
    with closing(psycopg2.connect(pipeline.db_url)) as conn, conn.cursor() as cur:
        cur.execute("SELECT format_type(atttypid, atttypmod) FROM pg_attribute "
                    "WHERE attrelid = %s::regclass AND attname = 'writer_task' AND NOT attisdropped", (staging,))
        assert cur.fetchall() == [("bigint",)]


@pytest.mark.parametrize("statement, says", [
    ("ALTER TABLE {schema}.latest ADD COLUMN writer_task bigint",
     "sink 'latest': table {schema}.latest: column writer_task: has the name of a column the ledger adds"),
    ("ALTER TABLE {schema}.events ADD FOREIGN KEY (k) REFERENCES {schema}.latest (k)",
     "sink 'events': table {schema}.events: has a foreign key to the table of sink 'latest', which is listed after it"),
])
def test_registration_refuses_final_tables_its_staging_or_its_commit_cannot_serve_naming_them(pipeline, statement,
                                                                                               says):
    """Without the preflight (which lists the same problems): a final column named like one of
    the staging table's own, and a foreign key the commit's sink order would break."""
    alter(pipeline, statement)
    with pytest.raises(SinkTableError, match=re.escape(says.format(schema=pipeline.config.name))):
        pipeline.ledger.register()
