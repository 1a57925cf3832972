"""The Spark SQL types Spark's Avro reader (`from_avro`) gives an Avro schema's fields, as
exactly_once.spark_types spells them, so a reader schema can be checked against the
pipeline's columns before any record is read: a field of another type would reach the
sink tables as what Spark made of it, not as the configuration says."""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from exactly_once.spark_types import parse as parse_spark_type

_PRIMITIVE = {"boolean": "boolean", "int": "int", "long": "bigint", "float": "float", "double": "double",
              "string": "string", "bytes": "binary", "enum": "string", "fixed": "binary"}
_LOGICAL = {"date": "date", "timestamp-millis": "timestamp", "timestamp-micros": "timestamp",
            "local-timestamp-millis": "timestamp_ntz", "local-timestamp-micros": "timestamp_ntz"}


def record_fields(schema_text: str) -> dict[str, str]:
    """Field name -> Spark SQL type of an Avro record schema (JSON text); ValueError saying
    what is not an Avro record this library reads."""
    try:
        schema = json.loads(schema_text)
    except json.JSONDecodeError as error:
        raise ValueError(f"the Avro schema is not JSON: {error}") from None
    if not isinstance(schema, Mapping) or schema.get("type") != "record":
        raise ValueError("the Avro schema is not a record (a JSON object with \"type\": \"record\")")
    spark_type = _spark_type(schema, {})
    return {name: str(t) for name, t in parse_spark_type(spark_type).fields}


def mismatches(schema_text: str, columns: Mapping[str, str]) -> list[str]:
    """How the reader schema's fields differ from the pipeline's columns (name -> Spark SQL type),
    or why it is no Avro record this library reads."""
    try:
        fields = record_fields(schema_text)
    except ValueError as unreadable:
        return [str(unreadable)]
    found = []
    for column, wanted in columns.items():
        if column not in fields:
            found.append(f"{column}: not a field of the Avro schema (its fields: {', '.join(fields)})")
        elif fields[column] != str(parse_spark_type(wanted)):
            found.append(f"{column}: the Avro schema makes it {fields[column]}, the configuration says {wanted}")
    return found


def _spark_type(schema: Any, named: dict[str, str]) -> str:
    if isinstance(schema, str):
        if schema in named:
            return named[schema]
        if schema in _PRIMITIVE and schema not in ("enum", "fixed"):
            return _PRIMITIVE[schema]
        raise ValueError(f"Avro type {schema!r} is not one this library reads")
    if isinstance(schema, list):
        members = [m for m in schema if m != "null"]
        if len(members) != 1:
            raise ValueError(f"the Avro union {json.dumps(schema)} is not [\"null\", T]: Spark reads it as a struct")
        return _spark_type(members[0], named)
    kind, logical = schema.get("type"), schema.get("logicalType")
    if logical == "decimal":
        return f"decimal({schema['precision']},{schema.get('scale', 0)})"
    if logical in _LOGICAL:
        return _LOGICAL[logical]
    if kind == "record":
        fields = ", ".join(f"`{f['name']}`: {_spark_type(f['type'], named)}" for f in schema.get("fields", ()))
        named[schema["name"]] = made = f"struct<{fields}>"
        return made
    if kind == "array":
        return f"array<{_spark_type(schema['items'], named)}>"
    if kind == "map":
        return f"map<string, {_spark_type(schema['values'], named)}>"
    if kind in ("enum", "fixed"):
        named[schema["name"]] = _PRIMITIVE[kind]
        return _PRIMITIVE[kind]
    return _spark_type(kind, named)
