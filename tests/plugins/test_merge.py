"""The merge statements quote every identifier that comes from configuration."""

import psycopg2
import pytest

from exactly_once.config import Sink
from exactly_once.merge import merge_statement


@pytest.fixture(scope="module")
def cursor(pipeline_db_url):
    with psycopg2.connect(pipeline_db_url) as conn, conn.cursor() as cur:
        yield cur


def test_append_quotes_table_and_columns(cursor):
    sink = Sink(name="events", table="Odd.Table", mode="append")
    text = merge_statement("p", sink, ["select", "kafka_offset"]).as_string(cursor)
    assert 'INSERT INTO "Odd"."Table" ("select", "kafka_offset")' in text
    assert 'FROM "exactly_once"."stg_p_events"' in text


def test_upsert_updates_only_non_key_columns_and_only_from_higher_offsets(cursor):
    sink = Sink(name="last", table="s.t", mode="upsert", keys=("k",))
    text = merge_statement("p", sink, ["k", "v", "kafka_partition", "kafka_offset"]).as_string(cursor)
    assert 'ON CONFLICT ("k") DO UPDATE SET "v" = EXCLUDED."v", "kafka_partition"' in text
    assert '"k" = EXCLUDED."k"' not in text
    assert "WHERE (f.kafka_offset, f.kafka_partition) < (EXCLUDED.kafka_offset, EXCLUDED.kafka_partition)" in text


def test_aggregate_merges_each_measure_by_its_kind(cursor):
    sink = Sink(name="agg", table="s.t", mode="aggregate", keys=("k",),
                measures={"c": "count", "s": "sum", "lo": "min", "hi": "max"})
    text = merge_statement("p", sink, []).as_string(cursor)
    assert 'SELECT "k", sum("c") AS "c", sum("s") AS "s", min("lo") AS "lo", max("hi") AS "hi"' in text
    assert '"c" = COALESCE(f."c" + EXCLUDED."c", f."c", EXCLUDED."c")' in text
    assert '"lo" = LEAST(f."lo", EXCLUDED."lo"), "hi" = GREATEST(f."hi", EXCLUDED."hi")' in text
