"""Sink modes: found by name, each checks its own configuration, and their promote
statements quote every identifier that comes from configuration."""

import psycopg2
import pytest
from psycopg2 import sql

from exactly_once.config import Sink, load_config
from exactly_once.errors import ConfigError
from exactly_once.sinks import SinkTables, mode_of

STAGING = sql.Identifier("exactly_once", "stg_p_events")
CONTRIBUTIONS = sql.Identifier("exactly_once", "ctb_p_events")


def tables(sink: Sink, columns: list[str]) -> SinkTables:
    return SinkTables(sql.Identifier(*sink.schema_and_table), STAGING, CONTRIBUTIONS, columns)


@pytest.fixture(scope="module")
def cursor(pipeline_db_url):
    with psycopg2.connect(pipeline_db_url) as conn, conn.cursor() as cur:
        yield cur


def test_every_mode_is_a_module_of_the_sinks_package():
    with pytest.raises(ValueError,
                       match="unknown sink mode 'merge': the sink modes are aggregate, append, kafka, upsert"):
        mode_of("merge")


def test_a_sink_with_an_unknown_mode_is_refused_naming_the_field():
    with pytest.raises(ConfigError, match=r"sinks\.0\.mode: unknown sink mode 'replace'"):
        load_config({"name": "p", "source": {"topics": ["t"], "value_schema": {"a": "int"}},
                     "sinks": [{"name": "s", "table": "t", "mode": "replace"}]})


@pytest.mark.parametrize("sink, message", [
    ({"mode": "append", "keys": ["a"]}, "append sinks are keyed by"),
    ({"mode": "upsert"}, "upsert sinks need keys"),
    ({"mode": "upsert", "keys": ["a"], "measures": {"a": "sum"}}, "upsert sinks take no measures"),
    ({"mode": "aggregate", "keys": ["a"]}, "aggregate sinks need measures"),
    ({"mode": "kafka", "keys": ["a"]}, "kafka sinks need the topic they publish to"),
    ({"mode": "kafka", "topic": "out"}, "kafka sinks need keys"),
    ({"mode": "append", "topic": "out"}, "topic: for kafka sinks, not append sinks"),
    ({"mode": "upsert", "keys": ["a"], "on_reprocess": "republish"}, "on_reprocess: for kafka sinks, not upsert"),
])
def test_each_mode_checks_its_keys_and_measures(sink, message):
    with pytest.raises(ValueError, match=message):
        Sink(name="s", table="t", **sink)


def test_append_quotes_table_and_columns(cursor):
    sink = Sink(name="events", table="Odd.Table", mode="append")
    text = sink.strategy.promote(sink, tables(sink, ["select", "kafka_offset"])).as_string(cursor)
    assert 'INSERT INTO "Odd"."Table" ("select", "kafka_offset")' in text
    assert 'FROM "exactly_once"."stg_p_events"' in text


def test_upsert_updates_only_non_key_columns_and_only_from_higher_offsets(cursor):
    sink = Sink(name="last", table="s.t", mode="upsert", keys=("k",))
    text = sink.strategy.promote(sink, tables(sink, ["k", "v", "kafka_partition", "kafka_offset"])).as_string(cursor)
    assert 'ON CONFLICT ("k") DO UPDATE SET "v" = EXCLUDED."v", "kafka_partition"' in text
    assert '"k" = EXCLUDED."k"' not in text
    assert "WHERE (f.kafka_offset, f.kafka_partition) < (EXCLUDED.kafka_offset, EXCLUDED.kafka_partition)" in text


def test_aggregate_merges_each_measure_by_its_kind(cursor):
    sink = Sink(name="agg", table="s.t", mode="aggregate", keys=("k",),
                measures={"c": "count", "s": "sum", "lo": "min", "hi": "max"})
    text = sink.strategy.promote(sink, tables(sink, ["k", "c", "s", "lo", "hi"])).as_string(cursor)
    assert 'SELECT "k", sum("c") AS "c", sum("s") AS "s", min("lo") AS "lo", max("hi") AS "hi"' in text
    assert '"c" = COALESCE(f."c" + EXCLUDED."c", f."c", EXCLUDED."c")' in text
    assert '"lo" = LEAST(f."lo", EXCLUDED."lo"), "hi" = GREATEST(f."hi", EXCLUDED."hi")' in text


def test_a_reprocessing_recomputes_the_keys_it_touches_from_every_contribution_unconditionally(cursor):
    sink = Sink(name="last", table="s.t", mode="upsert", keys=("k",))
    forget, put = (s.as_string(cursor) for s in sink.strategy.replace(sink, tables(sink, ["k", "v", "kafka_partition",
                                                                                         "kafka_offset"])))
    assert 'DELETE FROM "exactly_once"."ctb_p_events" WHERE checkpoint_id = %(slot)s' in forget
    assert 'FROM "exactly_once"."ctb_p_events"\nWHERE ("k") IN (SELECT "k" FROM affected_keys)' in put
    assert put.rstrip().endswith('AND NOT EXISTS (SELECT FROM "exactly_once"."ctb_p_events" c WHERE c."k" = f."k")')
    assert "(f.kafka_offset, f.kafka_partition) <" not in put  # the newest of all contributions, whatever is there


def test_an_append_reprocessing_takes_back_the_rows_of_the_replayed_ranges(cursor):
    sink = Sink(name="events", table="Odd.Table", mode="append")
    forget, put = (s.as_string(cursor) for s in sink.strategy.replace(sink, tables(sink, ["kafka_offset"])))
    assert 'DELETE FROM "Odd"."Table" f\nUSING exactly_once.checkpoint_ranges r' in forget
    assert put == sink.strategy.promote(sink, tables(sink, ["kafka_offset"])).as_string(cursor)


def test_kafka_promotes_into_the_outbox_naming_pipeline_and_sink_as_literals(cursor):
    sink = Sink(name="events", table="s.t", mode="kafka", keys=("sku",), topic="out")
    text = sink.strategy.promote(sink, SinkTables(sql.Identifier("s", "t"), STAGING, CONTRIBUTIONS, ["sku"],
                                                  pipeline="p'1")).as_string(cursor)
    assert "INSERT INTO exactly_once.outbox" in text
    assert "SELECT 'p''1', 'events', %(checkpoint_id)s" in text
    assert 'ORDER BY "s"."kafka_topic", "s"."kafka_partition", "s"."kafka_offset"' in text
    assert 'jsonb_build_array("s"."sku")' in text
