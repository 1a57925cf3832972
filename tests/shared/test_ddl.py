"""The DDL the preflight suggests and `new` writes, per sink mode, and the scaffold's schema
argument (pure)."""

from __future__ import annotations

import pytest

from exactly_once import ddl
from exactly_once.config import load_config
from exactly_once.errors import ConfigError
from exactly_once.operate.scaffold import parse_schema

CONFIG = load_config({
    "name": "shop",
    "source": {"topics": ["t"], "value_schema": {"sku": "string", "qty": "int", "price": "decimal(12,2)",
                                                 "tags": "array<string>", "At": "timestamp"}},
    "transform": "shop.transform:prepare",
    "sinks": [
        {"name": "orders", "table": "Sales.orders", "mode": "append"},
        {"name": "latest", "table": "latest", "mode": "upsert", "keys": ["sku"]},
        {"name": "totals", "table": "totals", "mode": "aggregate", "keys": ["sku", "day"],
         "measures": {"n": "count", "qty": "sum", "price": "max", "revenue": "sum"}},
    ],
})


def test_an_append_table_has_the_values_fields_and_is_unique_on_the_coordinates():
    # Every name is quoted, as the library quotes it: "Sales" keeps its case, `user` would be a name.
    assert ddl.create_table(CONFIG, CONFIG.sink("orders")) == """CREATE TABLE "Sales"."orders" (
    "sku" text NOT NULL,
    "qty" integer NOT NULL,
    "price" numeric(12,2) NOT NULL,
    "tags" text[] NOT NULL,
    "At" timestamptz NOT NULL,
    "kafka_topic" text NOT NULL,
    "kafka_partition" integer NOT NULL,
    "kafka_offset" bigint NOT NULL,
    UNIQUE ("kafka_topic", "kafka_partition", "kafka_offset")
);"""


def test_an_upsert_table_keeps_the_winning_records_partition_and_offset_and_is_unique_on_its_keys():
    assert ddl.create_table(CONFIG, CONFIG.sink("latest")).endswith(
        '    "kafka_partition" integer NOT NULL,\n    "kafka_offset" bigint NOT NULL,\n    UNIQUE ("sku")\n);')
    assert '"kafka_topic"' not in ddl.create_table(CONFIG, CONFIG.sink("latest"))


def test_an_aggregate_table_has_its_keys_and_measures_at_the_types_their_folds_give():
    assert ddl.create_table(CONFIG, CONFIG.sink("totals")) == """CREATE TABLE "totals" (
    "sku" text NOT NULL,
    "day" text NOT NULL,  -- made by the transform: give it the transform's type
    "n" bigint NOT NULL,
    "qty" bigint NOT NULL,
    "price" numeric(12,2) NOT NULL,
    "revenue" numeric NOT NULL,
    UNIQUE ("sku", "day")
);"""


def test_fixes_name_the_table_and_column():
    assert ddl.add_column(CONFIG, CONFIG.sink("orders"), "kafka_offset") == \
        'ALTER TABLE "Sales"."orders" ADD COLUMN "kafka_offset" bigint NOT NULL;'
    assert ddl.add_unique(CONFIG.sink("totals")) == 'ALTER TABLE "totals" ADD UNIQUE ("day", "sku");'
    assert ddl.alter_type(CONFIG.sink("orders"), "At", "timestamp") == \
        'ALTER TABLE "Sales"."orders" ALTER COLUMN "At" TYPE timestamptz USING "At"::timestamptz;'


def test_types_spark_cannot_write_through_jdbc_have_no_column_type():
    assert ddl.column_type("map<string, int>") is None and ddl.column_type("array<array<int>>") is None
    assert ddl.column_type("struct<a: int>") is None


def test_the_schema_argument_keeps_commas_inside_types_and_names_a_bad_entry():
    assert parse_schema("a:decimal(12,2), b:map<string,int>,c : string") == {
        "a": "decimal(12,2)", "b": "map<string,int>", "c": "string"}
    with pytest.raises(ConfigError, match=r"--schema: 'b' is not 'field:type'"):
        parse_schema("a:int,b")
