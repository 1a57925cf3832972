"""What a source's record formats accept when the configuration loads: an Avro reader schema
checked against the columns (by the Spark types `from_avro` gives its fields), a decoded key
beside the value, and the rule for tombstones — each refusal naming the field."""

from __future__ import annotations

import json

import pytest

from exactly_once.config import load_config
from exactly_once.errors import ConfigError
from exactly_once.formats._avro_types import mismatches, record_fields

ORDER = {"type": "record", "name": "Order", "fields": [
    {"name": "id", "type": "string"},
    {"name": "n", "type": "long"},
    {"name": "note", "type": ["null", "string"], "default": None},
    {"name": "price", "type": {"type": "bytes", "logicalType": "decimal", "precision": 10, "scale": 2}},
    {"name": "at", "type": {"type": "long", "logicalType": "timestamp-micros"}},
    {"name": "day", "type": {"type": "int", "logicalType": "date"}},
    {"name": "lines", "type": {"type": "array", "items": {"type": "record", "name": "Line", "fields": [
        {"name": "sku", "type": "string"}, {"name": "qty", "type": "int"}]}}},
    {"name": "tags", "type": {"type": "map", "values": "string"}},
    {"name": "kind", "type": {"type": "enum", "name": "Kind", "symbols": ["A", "B"]}},
]}


def test_avro_fields_get_the_spark_types_from_avro_gives_them():
    assert record_fields(json.dumps(ORDER)) == {
        "id": "string", "n": "bigint", "note": "string", "price": "decimal(10,2)", "at": "timestamp", "day": "date",
        "lines": "array<struct<`sku`: string, `qty`: int>>", "tags": "map<string, string>", "kind": "string"}
    assert mismatches(json.dumps(ORDER), {"id": "string", "n": "int", "gone": "string"}) == [
        "n: the Avro schema makes it bigint, the configuration says int",
        "gone: not a field of the Avro schema (its fields: id, n, note, price, at, day, lines, tags, kind)"]
    with pytest.raises(ValueError, match=r"the Avro union \[\"int\", \"string\"\] is not \[\"null\", T\]"):
        record_fields(json.dumps({**ORDER, "fields": [{"name": "x", "type": ["int", "string"]}]}))


def config(**source) -> dict:
    return {"name": "p", "source": {"topics": ["t"], "value_schema": {"id": "string", "n": "bigint"}, **source},
            "sinks": [{"name": "latest", "table": "latest", "mode": "upsert", "keys": ["customer"]}]}


@pytest.mark.parametrize("source, refusal", [
    ({"value_format": "avro"}, "source: value_format 'avro' needs schema_registry (the connection) and "
                               "value_reader_schema (what records are read into)"),
    ({"value_format": "avro", "schema_registry": "r", "value_reader_schema": json.dumps(ORDER),
      "value_schema": {"id": "string", "n": "int"}},
     "source: value_reader_schema does not give value_schema's columns: n: the Avro schema makes it bigint, the "
     "configuration says int"),
    ({"value_reader_schema": json.dumps(ORDER)}, "source: value_reader_schema is for registry formats (avro), not "
                                                 "'json'"),
    ({"key_format": "string", "key_schema": {"customer": "bigint"}},
     "source: key_format 'string' gives one string column: key_schema must be {'<name>': 'string'}, got "
     "{'customer': 'bigint'}"),
    ({"key_format": "json", "key_schema": {"id": "string"}},
     "source: key_schema and value_schema both have ['id']: a column is one or the other"),
    ({"key_schema": {"customer": "string"}}, "source: key_schema and key_reader_schema are for a decoded key: set "
                                             "key_format"),
    ({"key_format": "csv"}, "source.key_format: unknown record format 'csv'"),
    ({"value_format": "protobuf", "schema_registry": "registry", "value_reader_schema": '{"type": "record"}'},
     "source: value_reader_schema of 'protobuf' is {subject, version} of the schema registry"),
    ({"tombstones": "delete"}, "source: tombstones 'delete' needs the key decoded (key_format)"),
])
def test_a_source_whose_formats_cannot_read_its_records_is_refused_naming_the_field(source, refusal):
    with pytest.raises(ConfigError) as refused:
        load_config(config(**source))
    assert refusal in str(refused.value)


def test_tombstones_delete_rows_of_upsert_sinks_ordered_by_offset_and_keyed_by_the_key():
    keyed = {"key_format": "string", "key_schema": {"customer": "string"}, "tombstones": "delete"}
    assert load_config(config(**keyed)).source.tombstones == "delete"
    ordered = config(**keyed)
    ordered["sinks"][0].update(order_by="n")
    with pytest.raises(ConfigError, match=r"upsert sinks \['latest'\] are ordered by order_by, a value's field"):
        load_config(ordered)
    by_value = config(**keyed)
    by_value["sinks"][0].update(keys=["id"])
    with pytest.raises(ConfigError, match=r"sinks \['latest'\] are keyed otherwise"):
        load_config(by_value)


def change_feed(**source) -> dict:
    return {"name": "replica", "source": {"topics": ["source.public.items"], "envelope": "debezium",
                                          "value_schema": {"id": "int", "name": "string"}, **source},
            "sinks": [{"name": "items", "table": "replica.items", "mode": "upsert", "keys": ["id"],
                       "order_by": "debezium_position"},
                      {"name": "changes", "table": "replica.changes", "mode": "append"}]}


@pytest.mark.parametrize(("source", "refusal"), [
    ({"value_format": "string", "value_schema": {"text": "string"}},
     "source: envelope 'debezium' reads Debezium's JSON or Avro converter (value_format json or avro), not "
     "'string'"),
    ({"value_format": "avro", "value_schema": {"id": "int"}},
     "source: envelope 'debezium' with value_format 'avro' needs schema_registry (the connection) and no "
     "value_reader_schema"),
    ({"value_format": "avro", "schema_registry": "registry", "value_schema": {"id": "int"},
      "value_reader_schema": '{"type": "record", "name": "Value", "fields": [{"name": "id", "type": "int"}]}'},
     "no value_reader_schema: change events are read into one made from value_schema"),
    ({"value_format": "avro", "schema_registry": "registry",
      "value_schema": {"id": "long", "at": "timestamp", "price": "decimal(10,2)"}},
     "reads value_schema's columns as boolean, int, bigint, float, double, string, binary or date, not "
     "{'at': 'timestamp', 'price': 'decimal(10,2)'}"),
    ({"key_format": "json", "key_schema": {"key_id": "int"}},
     "source: envelope 'debezium' takes a row's key from its images: leave key_format unset"),
    ({"tombstones": "delete"}, "source: envelope 'debezium': a delete event deletes, and the tombstone after it "
                               "changes nothing (it is skipped); leave tombstones unset"),
    ({"value_schema": {"id": "int", "debezium_op": "string"}},
     "source: envelope 'debezium' adds the columns ['debezium_op', 'debezium_position']: value_schema may not have "
     "['debezium_op']"),
])
def test_a_change_feed_the_envelope_cannot_read_is_refused_naming_the_field(source, refusal):
    with pytest.raises(ConfigError) as refused:
        load_config(change_feed(**source))
    assert refusal in str(refused.value)


def test_a_change_feed_upserts_by_the_source_position_keyed_by_the_row_image():
    config = load_config(change_feed())
    assert config.source.deletes and load_config(json.loads(config.model_dump_json())) == config  # read back alike
    by_offset = change_feed()
    del by_offset["sinks"][0]["order_by"]
    with pytest.raises(ConfigError, match=r"upsert sinks \['items'\] must be ordered by the source's position, "
                                          r"order_by: debezium_position"):
        load_config(by_offset)
    by_key_field = change_feed()
    by_key_field["sinks"][0].update(keys=["id", "region"])
    with pytest.raises(ConfigError, match=r"upsert sinks \['items'\] must be keyed by value_schema columns"):
        load_config(by_key_field)


def test_truncates_are_applied_only_when_asked_and_only_from_a_change_feed():
    assert not load_config(change_feed()).source.truncates
    assert load_config(change_feed(on_truncate="truncate")).source.truncates
    plain = change_feed(on_truncate="truncate", envelope="none", value_format="json")
    with pytest.raises(ConfigError, match="on_truncate applies to a change feed's truncate events: it needs envelope "
                                          "'debezium'"):
        load_config(plain)
    with pytest.raises(ConfigError, match="empties the upsert sinks of one source table, whose topic is the "
                                          "pipeline's only one: it reads 2"):
        load_config(change_feed(on_truncate="truncate", topics=["source.public.items", "source.public.more"]))


def test_a_wire_format_frames_protobuf_only():
    protobuf = {"value_format": "protobuf", "schema_registry": "registry",
                "value_reader_schema": {"subject": "s", "version": 1}}
    config = {"name": "p", "source": {"topics": ["t"], "value_schema": {"id": "string"}, **protobuf,
                                      "wire_format": "apicurio"},
              "sinks": [{"name": "s", "table": "s", "mode": "append"}]}
    assert load_config(config).source.encoded("value").wire_format == "apicurio"
    with pytest.raises(ConfigError, match="wire_format 'apicurio' frames protobuf values and keys: neither "
                                          "value_format nor key_format is protobuf"):
        load_config({**config, "source": {**config["source"], "value_format": "json", "schema_registry": None,
                                          "value_reader_schema": None}})
