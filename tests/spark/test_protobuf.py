"""Protobuf values through the stack's schema registry (`value_format: protobuf`), decoded in the
JVM by the project's jar, through the pipeline's run path: the final tables and dead letters
equal what the records say, as for their Avro twins (tests/spark/protobuf_orders.py); and each
kind of Protobuf field as the columns it becomes."""

from __future__ import annotations

import struct
from decimal import Decimal

import pytest
from google.protobuf import message_factory
from pyspark.sql import functions as F

from exactly_once import connections
from exactly_once.config import load_config
from exactly_once.spark.frames import parse
from tests.spark.avro_orders import REGISTRY
from tests.spark.conftest import connect_runner
from tests.spark.protobuf_orders import (PACKAGE, ProtobufOrders, apicurio_framed, framed, message_class, proto,
                                        registered)

NOT_FRAMED = ("value is not in the schema registry's Protobuf wire format (magic byte 0, a 4-byte schema id and the "
              "message indexes, then the Protobuf payload)")


@pytest.fixture
def orders(ledger_db, kafka_servers, topic) -> ProtobufOrders:
    return ProtobufOrders(ledger_db, kafka_servers, topic, tombstones="dead_letter")


def produce_three_versions_and_hostile_records(orders: ProtobufOrders) -> None:
    """Records of the three versions, with keys and headers, among hostile ones: not framed, an
    unknown id, a payload cut short, indexes naming no message, another message's schema."""
    ids = {version: orders.schema_id(version) for version in (1, 2, 3)}  # registered in order: versions 1, 2, 3
    v1, v2, v3 = ({"id": "a1", "n": 1}, {"id": "b1", "n": 2, "note": "second"},
                  {"id": "c1", "n": 2**31 - 1, "note": "wide"})
    good = orders.encoded(3, {"id": "c2", "n": 7, "note": "hello"})
    unknown_id = 2**31 - 7
    other_text = proto("message Other { string id = 1; }")
    other_id = registered(f"{orders.topic}-other", other_text)
    another = framed(other_id, message_class(other_text, "Other")(id="o1"))
    orders.produce([
        ("ann", orders.encoded(1, v1), {**v1, "note": ""}, None, "web"),
        ("bob", orders.encoded(2, v2), v2, None, None),
        ("cid", orders.encoded(3, v3), v3, None, "shop"),
        ("ann", orders.encoded(2, {**v2, "id": "a2"}), {**v2, "id": "a2"}, None, None),
        ("bob", orders.encoded(1, {**v1, "id": "b2"}), {**v1, "id": "b2", "note": ""}, None, None),
        ("dan", b"\x01" + good[1:], None, NOT_FRAMED, None),
        ("dan", b"\x00" + struct.pack(">I", unknown_id) + good[5:], None,
         f"value: schema id {unknown_id} is unknown to the schema registry", None),
        ("dan", good[:-2], None,
         f"value payload does not decode as {PACKAGE}.Order (schema id {ids[3]}): While parsing a protocol message, "
         "the input ended unexpectedly in the middle of a field.  This could mean either that the input has been "
         "truncated or that an embedded message misreported its own length.", None),
        ("dan", good[:5] + b"\x02\x02" + good[6:], None,
         f"value message indexes [1] name none of schema id {ids[3]}'s messages", None),
        ("dan", another, None,
         f"value schema id {other_id}'s message [0] is {PACKAGE}.Other, not the reader's {PACKAGE}.Order", None),
        ("dan", b'{"id": "j1", "n": 1, "note": ""}', None, NOT_FRAMED, None),
        (b"\xff\xfe", good, None, "key is not valid UTF-8", None),
        ("eve", None, None, "value is null (a tombstone: source.tombstones is dead_letter)", None),
    ])
    assert len(set(ids.values())) == 3


def test_three_versions_of_a_message_read_as_the_reader_s_and_hostile_records_named(spark, orders):
    produce_three_versions_and_hostile_records(orders)
    assert orders.run(spark) is not None  # its first attempt fails for the unknown id, its retry dead-letters it
    orders.assert_exact()
    assert orders.run(spark) is None  # nothing more to read: no record counted twice


@pytest.mark.variant
def test_the_same_over_spark_connect_as_the_airflow_task_runs_it(connect_server, orders, monkeypatch):
    runner = connect_runner(orders.config, orders.servers, orders.registry, connect_server, monkeypatch)
    produce_three_versions_and_hostile_records(orders)
    assert orders.run(None, runner) is not None
    orders.assert_exact()


@pytest.mark.parametrize("wire_format", ["apicurio", "apicurio_8_byte_ids"])
def test_apicurio_s_framing_reads_alike_its_ref_naming_the_message(spark, ledger_db, kafka_servers, topic,
                                                                  wire_format):
    """Values as Apicurio's serializer frames them (its 4-byte content id, or 8-byte ids, then
    its Ref naming a top-level message): the three versions read as their Confluent-framed
    twins do; a Ref naming no message of the schema, or another message than the reader's, a
    Ref cut short and a Confluent-framed value are dead letters saying so."""
    orders = ProtobufOrders(ledger_db, kafka_servers, topic, tombstones="dead_letter", wire_format=wire_format)
    ids = {version: orders.schema_id(version) for version in (1, 2, 3)}
    v1, v3 = {"id": "a1", "n": 1}, {"id": "c1", "n": 9, "note": "wide"}
    payload = orders.classes[3](id="c2", n=7).SerializeToString()
    other_text = proto("message Other { string id = 1; }")
    other_id = registered(f"{orders.topic}-other", other_text)
    id_bytes, layout = (8, "an 8-byte") if wire_format == "apicurio_8_byte_ids" else (4, "a 4-byte")
    not_framed = (f"value is not in the schema registry's Protobuf wire format (magic byte 0, {layout} schema id and "
                  "Apicurio's Ref, then the Protobuf payload)")
    cut_ref = apicurio_framed(ids[3], "Order", payload, wire_format)[:1 + id_bytes + 4]
    orders.produce([
        ("ann", orders.encoded(1, v1), {**v1, "note": ""}, None, "web"),
        ("bob", orders.encoded(2, {**v1, "id": "b1", "note": "second"}), {**v1, "id": "b1", "note": "second"},
         None, None),
        ("cid", orders.encoded(3, v3), v3, None, "shop"),
        ("dan", apicurio_framed(ids[3], "Missing", payload, wire_format), None,
         f"value Apicurio's Ref Missing names none of schema id {ids[3]}'s top-level messages", None),
        ("dan", apicurio_framed(other_id, "Other", payload, wire_format), None,
         f"value schema id {other_id}'s message Other is {PACKAGE}.Other, not the reader's {PACKAGE}.Order", None),
        ("dan", cut_ref, None, not_framed, None),
        *([("dan", b"\x00\x80" + apicurio_framed(ids[3], "Order", payload, wire_format)[2:], None, not_framed, None)]
          if id_bytes == 8 else []),  # an 8-byte id beyond a bigint
        # Confluent's framing: its indexes [0] (one 0 byte) read as a Ref of no bytes (with 8-byte ids, its
        # payload's first bytes would be read as the id's)
        *([("dan", framed(ids[3], orders.classes[3](id="c3", n=1)), None, not_framed, None)]
          if wire_format == "apicurio" else []),
    ])
    assert orders.run(spark) is not None
    orders.assert_exact()


READING = proto("""
enum Unit { UNKNOWN = 0; CELSIUS = 1; KELVIN = 2; }
message Reading {
  message Place { string site = 1; sint32 floor = 2; }
  string sensor = 1;
  double value = 2;
  Unit unit = 3;
  Place place = 4;
  repeated float samples = 5;
  map<string, int64> labels = 6;
  oneof source { string device = 7; bool manual = 8; }
  google.protobuf.Timestamp at = 9;
  google.protobuf.Int32Value battery = 10;
  uint64 count = 11;
  bytes raw = 12;
  string amount = 13;
  optional int32 level = 14;
  uint32 hits = 15;
  repeated Place visits = 16;
}""", imports=("google/protobuf/timestamp.proto", "google/protobuf/wrappers.proto"))


COLUMNS = {"sensor": "string", "value": "double", "unit": "string", "place": "struct<site: string, floor: int>",
           "samples": "array<float>", "labels": "map<string, bigint>", "device": "string", "manual": "boolean",
           "at": "timestamp", "battery": "int", "count": "decimal(20,0)", "raw": "binary",
           "amount": "decimal(12,2)", "level": "int", "hits": "bigint",
           "visits": "array<struct<site: string, floor: int>>"}


def test_every_kind_of_field_becomes_its_column(spark, topic):
    """Scalars, an enum (its name), a nested message (a struct), repeated (an array), a map, a
    oneof (the member set; the other null), Timestamp, a wrapper (its value; null when unset),
    uint64 beyond bigint, uint32 beyond int, a decimal's text, a proto3 `optional` (null unset),
    a repeated message; proto3 fields left unset read their defaults. A Timestamp beyond year
    9999, a decimal's text of another scale or too long, indexes naming a nested message: dead
    letters saying so. The key Protobuf too."""
    Reading = message_class(READING, "Reading")
    subject = f"{topic}-value"
    schema_id = registered(subject, READING)
    field_class = {name: message_factory.GetMessageClass(Reading.DESCRIPTOR.fields_by_name[name].message_type)
                   for name in ("at", "battery")}
    at = field_class["at"](seconds=1_780_000_000, nanos=123_456_000)
    battery = field_class["battery"](value=87)
    full = Reading(sensor="s1", value=21.5, unit=2, place=Reading.Place(site="lab", floor=-3), samples=[1.5, 2.5],
                   labels={"a": 1, "b": 2**40}, device="d7", at=at, battery=battery, count=2**64 - 1,
                   raw=b"\x00\xff", amount="12.5", level=3, hits=4_000_000_000,
                   visits=[Reading.Place(site="a", floor=1)])
    bare = Reading(manual=False, amount="0")  # a oneof member set to its default: set all the same
    unknown = Reading(unit=7, amount="1")  # a number the enum does not name (proto3 enums are open)
    inexact = Reading(amount="1.234")
    far = Reading(amount="0", at=field_class["at"](seconds=10**13))
    huge = Reading(amount="1E+600000000")
    values = [framed(schema_id, m) for m in (full, bare, unknown, inexact, far, huge)]
    nested = framed(schema_id, full)
    values.append(nested[:5] + b"\x04\x00\x00" + nested[6:])  # indexes [0, 0]: Reading.Place
    key_text = proto("message Key { string device_id = 1; }")
    key_id = registered(f"{topic}-key", key_text)
    devices = ["d7", "", "d9", "d10", "d11", "d12", "d13"]
    keys = [framed(key_id, message_class(key_text, "Key")(device_id=d)) for d in devices]
    config = load_config({"name": "p", "source": {"topics": [topic], "value_format": "protobuf",
                                                  "schema_registry": REGISTRY, "value_schema": COLUMNS,
                                                  "value_reader_schema": {"subject": subject, "version": 1},
                                                  "key_format": "protobuf", "key_schema": {"device_id": "string"},
                                                  "key_reader_schema": {"subject": f"{topic}-key", "version": 1}},
                          "sinks": [{"name": "s", "table": "s", "mode": "append"}]})
    records = spark.createDataFrame([(topic, 0, i, k, v) for i, (k, v) in enumerate(zip(keys, values))],
                                    "topic string, partition int, offset long, key binary, value binary")
    parsed = parse(records.withColumns({"timestamp": F.current_timestamp(), "headers": F.lit(None)}), config,
                   connections.schema_registry(REGISTRY))
    rows = parsed.orderBy("offset").collect()
    assert [row["parsed_key"]["device_id"] for row in rows] == devices
    assert rows[2]["reason"] is None and rows[2]["parsed"]["unit"] == "UNKNOWN_ENUM_VALUE_Unit_7"
    assert [row["reason"] for row in rows[3:]] == [
        "value field amount: '1.234' is not a decimal(12,2)",
        "value field at: Timestamp 10000000000000 s 0 ns is outside years 1 to 9999",
        "value field amount: '1E+600000000' is not a decimal(12,2)",
        f"value schema id {schema_id}'s message [0, 0] is {PACKAGE}.Reading.Place, not the reader's "
        f"{PACKAGE}.Reading"]
    rows = rows[:2]
    found = [(row["reason"], row["parsed"].asDict(recursive=True)) for row in rows]
    at_read = found[0][1].pop("at")
    assert at_read.timestamp() == 1_780_000_000.123456  # pyspark's naive local time of that instant
    assert found == [
        (None, {"sensor": "s1", "value": 21.5, "unit": "KELVIN", "place": {"site": "lab", "floor": -3},
                "samples": [1.5, 2.5], "labels": {"a": 1, "b": 2**40}, "device": "d7", "manual": None,
                "battery": 87, "count": Decimal(2**64 - 1), "raw": bytearray(b"\x00\xff"),
                "amount": Decimal("12.50"), "level": 3, "hits": 4_000_000_000,
                "visits": [{"site": "a", "floor": 1}]}),
        (None, {"sensor": "", "value": 0.0, "unit": "UNKNOWN", "place": None, "samples": [], "labels": {},
                "device": None, "manual": False, "at": None, "battery": None, "count": Decimal(0),
                "raw": bytearray(), "amount": Decimal("0.00"), "level": None, "hits": 0, "visits": []})]


def test_a_schema_importing_another_subject_s_reads_its_messages(spark, topic):
    """A schema whose import is a reference to another subject: the job fetches both and
    compiles them together; the imported message becomes a struct."""
    from confluent_kafka.schema_registry import Schema, SchemaReference

    from tests.spark.avro_orders import registry_client

    common = proto("message Money { string currency = 1; int64 units = 2; }")
    registry_client().register_schema(f"{topic}-common", Schema(common, "PROTOBUF"))
    priced = proto("message Priced { string id = 1; Money price = 2; }", imports=("common.proto",))
    subject = f"{topic}-value"
    schema_id = registry_client().register_schema(subject, Schema(priced, "PROTOBUF", [
        SchemaReference("common.proto", f"{topic}-common", 1)]))
    with_import = "\n".join(line for line in priced.splitlines() if not line.startswith("import")) + "\n" + \
        "message Money { string currency = 1; int64 units = 2; }"  # one file, the same messages, for the producer
    Priced = message_class(with_import, "Priced")
    Money = message_factory.GetMessageClass(Priced.DESCRIPTOR.fields_by_name["price"].message_type)
    value = framed(schema_id, Priced(id="p1", price=Money(currency="EUR", units=12)))
    config = load_config({"name": "p", "source": {
        "topics": [topic], "value_format": "protobuf", "schema_registry": REGISTRY,
        "value_schema": {"id": "string", "price": "struct<currency: string, units: bigint>"},
        "value_reader_schema": {"subject": subject, "version": 1}},
        "sinks": [{"name": "s", "table": "s", "mode": "append"}]})
    records = spark.createDataFrame([(topic, 0, 0, None, value)],
                                    "topic string, partition int, offset long, key binary, value binary")
    parsed = parse(records.withColumns({"timestamp": F.current_timestamp(), "headers": F.lit(None)}), config,
                   connections.schema_registry(REGISTRY))
    [row] = parsed.collect()
    assert (row["reason"], row["parsed"].asDict(recursive=True)) == (
        None, {"id": "p1", "price": {"currency": "EUR", "units": 12}})
