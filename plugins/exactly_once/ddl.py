"""The final tables a pipeline expects, as PostgreSQL DDL: which column types hold the values
the library writes, and the statements the preflight suggests and `new` scaffolds. Pure.

A sink's rows carry the record's fields (the `key_schema`'s and the `value_schema`'s), whatever the transform adds,
and four columns the library fills from each record's Kafka metadata: kafka_topic,
kafka_partition, kafka_offset and kafka_timestamp. Without running the transform only the
library's columns and, in a pipeline without a transform, the record's fields have types
known in advance.
"""

from __future__ import annotations

from exactly_once import debezium
from exactly_once.config import PipelineConfig, Sink
from exactly_once.kafka_columns import KAFKA_OFFSET, KAFKA_PARTITION, KAFKA_TIMESTAMP, KAFKA_TOPIC
from exactly_once.spark_types import SparkType, parse

# The library's columns and their Spark types; the PostgreSQL base types (pg_type.typname) that
# hold every partition number and offset Kafka can give (an offset is a 63-bit number).
LIBRARY_COLUMNS = {KAFKA_TOPIC: "string", KAFKA_PARTITION: "int", KAFKA_OFFSET: "bigint",
                   KAFKA_TIMESTAMP: "timestamp"}
HOLDS_KAFKA = {KAFKA_PARTITION: {"int4", "int8", "numeric"}, KAFKA_OFFSET: {"int8", "numeric"}}

# Spark type -> the column type `new` writes and the preflight suggests.
_COLUMN_TYPE = {"boolean": "boolean", "tinyint": "smallint", "smallint": "smallint", "int": "integer",
                "bigint": "bigint", "float": "real", "double": "double precision", "date": "date",
                "timestamp": "timestamptz", "timestamp_ntz": "timestamp", "string": "text", "binary": "bytea"}
# Spark type -> the type of the parameter Spark's JDBC writer binds (pgjdbc: setString binds varchar;
# setInt int4 for tinyint and smallint too; a timestamp as an instant). A column takes the values
# when PostgreSQL has an assignment cast from it (the preflight asks PostgreSQL).
_BOUND_TYPE = {**_COLUMN_TYPE, "tinyint": "int4", "smallint": "int4", "int": "int4", "bigint": "int8",
               "float": "float4", "double": "float8", "string": "varchar", "timestamp": "timestamptz",
               "timestamp_ntz": "timestamp"}


def column_type(spark_type: str) -> str | None:
    """The PostgreSQL column type for values of a Spark type; None when Spark's JDBC writer
    cannot write it (maps, structs, arrays of them)."""
    return _postgres(parse(spark_type), _COLUMN_TYPE)


def bound_type(spark_type: str) -> str | None:
    """The type of the parameter the JDBC writer binds for a Spark type; None as column_type."""
    return _postgres(parse(spark_type), _BOUND_TYPE)


def _postgres(t: SparkType, names: dict[str, str]) -> str | None:
    if t.name == "decimal":
        return "numeric({},{})".format(*t.parameters)
    if t.name == "array":
        element = _postgres(t.elements[0], names)
        return None if element is None or element.endswith("]") else f"{element}[]"
    return names.get(t.name)


def summed(spark_type: str) -> str:
    """The type of Spark's sum of a column of the type (an aggregate's sum measure)."""
    t = parse(spark_type)
    if t.name in ("tinyint", "smallint", "int", "bigint"):
        return "bigint"
    if t.name == "decimal":
        precision, scale = t.parameters
        return f"decimal({min(38, precision + 10)},{scale})"
    return "double" if t.name == "float" else str(t)


def record_fields(config: PipelineConfig) -> dict[str, str]:
    """The decoded key's fields, then the value's: column -> Spark type (they share no name);
    of a change feed, the row image's columns and the envelope's (exactly_once.debezium)."""
    envelope = {debezium.OP: "string", debezium.POSITION: debezium.POSITION_TYPE} \
        if config.source.envelope == "debezium" else {}
    return {**config.source.key_schema, **config.source.value_schema, **envelope}


def known_types(config: PipelineConfig) -> dict[str, str]:
    """Columns whose Spark type is known without running the transform: the library's, and the
    record's fields when there is no transform (one could change them)."""
    fields = {} if config.transform else record_fields(config)
    return {**fields, **LIBRARY_COLUMNS}


def likely_types(config: PipelineConfig) -> dict[str, str]:
    """For suggestions: the record's fields and the library's columns, transform or not."""
    return {**record_fields(config), **LIBRARY_COLUMNS}


def expected_columns(config: PipelineConfig, sink: Sink) -> list[str]:
    """The columns a new final table of the sink gets: the keys and measures of an aggregate
    (or kafka sink with measures); otherwise the record's fields (the key's, then the value's),
    the keys the transform adds, and the record coordinates the mode needs."""
    if sink.measures:
        return [*sink.keys, *sink.measures]
    needed = sink.strategy.required_columns(sink)
    coordinates = [c for c in (KAFKA_TOPIC, KAFKA_PARTITION, KAFKA_OFFSET) if c in needed]
    columns = [*record_fields(config), *sink.keys, *coordinates]
    return [c for i, c in enumerate(columns) if c not in columns[:i]]


def quoted(name: str) -> str:
    """A configured name as SQL, each part quoted: the library quotes them too (psycopg2.sql), so
    `Sales.orders` is the table "Sales"."orders", and a keyword (`order`, `user`) is a name."""
    return ".".join('"' + part.replace('"', '""') + '"' for part in name.split("."))


def column_definition(config: PipelineConfig, sink: Sink, column: str) -> tuple[str, str | None]:
    """(`name type NOT NULL`, None), or a text column and a note when the transform decides its type."""
    if sink.measures.get(column) == "count":
        return f"{quoted(column)} bigint NOT NULL", None
    spark_type = likely_types(config).get(column)
    if spark_type and sink.measures.get(column) == "sum":
        spark_type = summed(spark_type)
    pg_type = column_type(spark_type) if spark_type else None
    if pg_type is None and sink.measures.get(column) == "sum":
        return f"{quoted(column)} numeric NOT NULL", None  # holds Spark's sum of any numeric column
    if pg_type is None:
        return f"{quoted(column)} text NOT NULL", "made by the transform: give it the transform's type"
    return f"{quoted(column)} {pg_type} NOT NULL", None


def create_table(config: PipelineConfig, sink: Sink) -> str:
    """The CREATE TABLE of a sink's final table, unique on what its mode merges on (if it merges)."""
    columns = expected_columns(config, sink)
    unique = ", ".join(quoted(c) for c in columns if c in sink.strategy.unique_columns(sink))
    lines = [column_definition(config, sink, c) for c in columns] + ([(f"UNIQUE ({unique})", None)] if unique else [])
    body = "".join(f"\n    {line}" + ("," if i < len(lines) - 1 else "") + (f"  -- {note}" if note else "")
                   for i, (line, note) in enumerate(lines))
    return f"CREATE TABLE {quoted(sink.table)} ({body}\n);"


def add_column(config: PipelineConfig, sink: Sink, column: str) -> str:
    definition, note = column_definition(config, sink, column)
    return f"ALTER TABLE {quoted(sink.table)} ADD COLUMN {definition};" + (f"  -- {note}" if note else "")


def add_unique(sink: Sink) -> str:
    unique = ", ".join(quoted(c) for c in sorted(sink.strategy.unique_columns(sink)))
    return f"ALTER TABLE {quoted(sink.table)} ADD UNIQUE ({unique});"


def alter_type(sink: Sink, column: str, spark_type: str) -> str:
    to = column_type(spark_type)
    return (f"ALTER TABLE {quoted(sink.table)} ALTER COLUMN {quoted(column)} TYPE {to} "
            f"USING {quoted(column)}::{to};")
