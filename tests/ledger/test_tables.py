"""Staging table names: one rule, within PostgreSQL's 63-byte identifiers, never shared."""

from contextlib import closing

import psycopg2
import pytest

from exactly_once.config import load_config
from exactly_once.ledger.protocol import Ledger
from exactly_once.ledger.tables import IDENTIFIER_LIMIT, staging_index, staging_name, staging_table, staging_tables

LONG = "p" * 40  # the longest pipeline name the configuration allows


def config(name: str, sinks: list[str], schema: str):
    return load_config({"name": name, "source": {"topics": ["t"], "value_schema": {"a": "int"}},
                        "sinks": [{"name": s, "table": f"{schema}.{s}", "mode": "append"} for s in sinks]})


def test_short_names_keep_the_plain_rule():
    assert staging_name("orders", "sku_last_price") == "stg6_orders_sku_last_price"


def test_long_names_fit_with_their_index_and_stay_apart():
    first, second = "totals_per_customer_and_region_x" + "a" * 8, "totals_per_customer_and_region_x" + "b" * 8
    names = {staging_name(LONG, first), staging_name(LONG, second)}
    assert len(names) == 2
    cfg = config(LONG, [first, second], "s")
    for sink in cfg.sinks:
        assert len(staging_index(cfg, sink).strings[-1].encode()) <= IDENTIFIER_LIMIT
    assert all(len(t.strings[-1]) <= IDENTIFIER_LIMIT for t in staging_tables(cfg).values())


def test_two_sinks_whose_names_share_63_bytes_get_staging_tables_of_their_own(ledger_db):
    """Before the rule, both names were truncated by PostgreSQL to the same table, and
    `CREATE … IF NOT EXISTS` silently reused the first sink's table for the second."""
    schema = "long_names_" + LONG[:8]
    sinks = ["customer_region_totals_" + "x" * 15 + "_a", "customer_region_totals_" + "x" * 15 + "_b"]
    with closing(psycopg2.connect(ledger_db)) as conn, conn, conn.cursor() as cur:
        cur.execute(f"DROP SCHEMA IF EXISTS {schema} CASCADE; CREATE SCHEMA {schema}")
        for i, sink in enumerate(sinks):
            cur.execute(f"CREATE TABLE {schema}.{sink} (c{i} int, kafka_topic text, kafka_partition int, "
                        "kafka_offset bigint, UNIQUE (kafka_topic, kafka_partition, kafka_offset))")
    cfg = config(LONG, sinks, schema)
    Ledger(cfg, lambda: psycopg2.connect(ledger_db)).register()
    with closing(psycopg2.connect(ledger_db)) as conn, conn.cursor() as cur:
        for i, sink in enumerate(sinks):
            table = staging_tables(cfg)[sink]
            cur.execute("SELECT to_regclass(%s) IS NOT NULL", (table.as_string(cur),))
            assert cur.fetchone() == (True,), f"{table.as_string(cur)} was not created"
            cur.execute("SELECT attname::text FROM pg_attribute WHERE attrelid = to_regclass(%s) AND attnum > 0 "
                        "AND NOT attisdropped ORDER BY attnum LIMIT 1", (table.as_string(cur),))
            assert cur.fetchone() == (f"c{i}",), f"sink {sink} stages into another sink's table"


def test_staging_table_of_a_name_that_is_no_sink_is_refused():
    with pytest.raises(KeyError, match="pipeline 'p' has no sink 'other'"):
        staging_table(config("p", ["orders"], "s"), "other")
