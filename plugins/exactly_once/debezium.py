"""source.envelope debezium: each record's value is a Debezium change event of one row, as
Debezium's JSON converter writes it, with its schema part (`{"schema": …, "payload": event}`)
or without, or as its Avro converter does (value_format avro, through the schema registry, read
into a reader schema made from value_schema: `avro_reader`): `op` (c create, r snapshot read,
u update, d delete, t truncate), the row's `before` and `after` images, and `source`, where the
change is in the source database's log.

An event becomes one row: its `after` image for c, r and u, its `before` image for d (value_schema's
columns), and beside them

- debezium_op, the event's op;
- debezium_position, the change's position in the source's log, which orders a key's changes in
  an upsert sink (its order_by) whatever partition or checkpoint brought them: in commit order.
  PostgreSQL's is `source.sequence`'s first LSN (the commit of the transaction streamed before
  the event's: the same for a transaction's events, rising with each commit; null, as 0, on a
  snapshot's reads and the first transaction after it), then 1 for a streamed change or 0 for a
  snapshot's read, then `source.lsn` (the change's place in the log, rising within a
  transaction), in 18, 1 and 19 digits. An LSN alone would not do: a transaction in flight when
  the snapshot began writes below the snapshot's LSN and commits after it. MySQL's is
  `source.file`'s sequence number, `pos` and `row` (10, 18 and 10 digits); otherwise
  `source.ts_ms`. The record's Kafka coordinates break ties, as after any order_by.

An upsert sink takes c, r and u as rows and d as the delete of its key (a row marked as a
tombstone, exactly_once.sinks.upsert), so a key's newest change wins, and a delete that is
newest leaves no row; the Kafka tombstone Debezium writes after a delete changes nothing.
Append and aggregate sinks take every applied event as a row. An event that is not one (no op,
an op outside c, r, u, d, an image missing, no position) is a dead letter saying why; so is a
truncate, unless `source.on_truncate` is truncate: then its row (no image: its columns null)
empties each upsert sink of every row older than it (a tombstone of no key, sinks/upsert.py),
and append and aggregate sinks take no row of it.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, NamedTuple

if TYPE_CHECKING:
    from pyspark.sql import Column

OP, POSITION = "debezium_op", "debezium_position"
COLUMNS = (OP, POSITION)
POSITION_TYPE = "decimal(38,0)"
DELETE, TRUNCATE = "d", "t"
EVENT_BYTES = 4096  # an event of a narrow table, both images, with the JSON converter's schema part (~3 KB)
UPSERTED = ("c", "r", "u")  # an image to take: a create, a snapshot's read, an update
APPLIED = (*UPSERTED, DELETE)
# What it reads of `source`, as Spark types and as Avro's (every field optional: each source
# database's connector writes some of them).
_SOURCE_FIELDS = {"lsn": ("bigint", "long"), "sequence": ("string", "string"), "file": ("string", "string"),
                  "pos": ("bigint", "long"), "row": ("int", "int"), "ts_ms": ("bigint", "long")}
_SOURCE = "struct<" + ", ".join(f"{name}: {spark}" for name, (spark, _) in _SOURCE_FIELDS.items()) + ">"
# value_schema's types an Avro reader schema gives as Debezium's Avro converter writes them. Not
# timestamp nor decimal: Avro's resolution ignores logical types (a writer's milliseconds would be
# read as microseconds, a decimal at the reader's scale), so those come as bigint, or as string
# and double (decimal.handling.mode), and a transform makes them timestamps and decimals.
_AVRO_TYPES = {"boolean": "boolean", "int": "int", "bigint": "long", "float": "float", "double": "double",
               "string": "string", "binary": "bytes", "date": {"type": "int", "logicalType": "date"}}
# PostgreSQL's position in 38 digits: the previous transaction's commit (sequence[0], 0 when
# null), whether the event is streamed (1) or a snapshot's read (0), the change's LSN.
_POSTGRES_DIGITS = (("commit", 18), ("streamed", 1), ("lsn", 19))
# MySQL's position in 38 digits: the binlog file's sequence number, pos, row.
_MYSQL_DIGITS = (("file", 10), ("pos", 18), ("row", 10))
NO_POSITION = ("the event has no source position (source.lsn and sequence's first LSN in 19 and 18 digits; "
               "source.file, pos and row in 10, 18 and 10 digits; or source.ts_ms)")
UNAPPLIED_TRUNCATE = ("op t (a truncate of the source table) is applied to no sink: set source.on_truncate to "
                      "truncate to empty the upsert sinks, or empty them by hand")
_PARTS = ("op", "before", "after", "source")
_NOT_FITTING = "_not_fitting"  # from_json's copy of an event with a field not of its type


def event_schema(schema: Mapping[str, str]) -> dict[str, str]:
    """The change event's fields read, as Spark types: its op, images of value_schema's columns, source."""
    image = "struct<" + ", ".join(f"`{c}`: {t}" for c, t in schema.items()) + ">"
    return {"op": "string", "before": image, "after": image, "source": _SOURCE}


def avro_type(spark_type: str) -> str | dict | None:
    """The Avro type a value_schema type is read from under the Avro converter; None if none is."""
    from exactly_once.spark_types import parse as parse_spark_type

    return _AVRO_TYPES.get(str(parse_spark_type(spark_type)))


def avro_reader(schema: Mapping[str, str]) -> str:
    """The reader schema of Debezium's Avro envelope: its images of value_schema's columns, op and
    the source's position fields, every one optional. Avro's resolution reads the writer's
    records (`<topic prefix>.<schema>.<table>.Value`, `io.debezium.connector.<db>.Source`) into
    these whatever their names (a union's one record branch takes the writer's record) and
    leaves out the fields the reader does not name."""
    def optional(name: str, avro: str | dict) -> dict:
        return {"name": name, "type": ["null", avro], "default": None}

    value = {"type": "record", "name": "Value", "fields": [optional(c, avro_type(t)) for c, t in schema.items()]}
    source = {"type": "record", "name": "Source",
              "fields": [optional(name, avro) for name, (_, avro) in _SOURCE_FIELDS.items()]}
    return json.dumps({"type": "record", "name": "Envelope", "fields": [
        optional("before", value), optional("after", "Value"), optional("source", source),
        optional("op", "string")]})


class EventReader(NamedTuple):
    """How a value format reads change events: `parse`, the records' column decoded; of the
    column it is projected into, `event` (the event's fields: op, before, after, source),
    `fits` (whether the format read the value) and `why_not` (null if it did, else why not)."""

    parse: Column
    event: Callable[[Column], Column]
    fits: Callable[[Column], Column]
    why_not: Callable[[Column], Column]


def registry_events(fields: Column, why_not: Callable[[Column], Column]) -> EventReader:
    """A registry format's decoding (exactly_once.formats, read into `avro_reader`'s schema) as
    change events: the decoded fields are the event; null when the format could not read it."""
    return EventReader(fields, lambda parsed: parsed, lambda parsed: parsed.isNotNull(), why_not)


def json_events(column: str, schema: Mapping[str, str]) -> EventReader:
    """Debezium's JSON converter: the event's fields (with the schema part, its payload beside
    them); a value fits when it is JSON in UTF-8 whose fields are of their types, and why not
    names a field that is not."""
    from pyspark.sql import functions as F

    fields = event_schema(schema)
    payload = "struct<" + ", ".join(f"{name}: {t}" for name, t in fields.items()) + ">"
    text = F.col(column).cast("string")
    parse = F.from_json(text, ", ".join([*(f"{name} {t}" for name, t in fields.items()), f"payload {payload}",
                                         f"{_NOT_FITTING} string"]),
                        {"columnNameOfCorruptRecord": _NOT_FITTING})
    utf8 = F.expr(f"is_valid_utf8(CAST({column} AS STRING))")

    def fits(parsed: Column) -> Column:
        return utf8 & parsed.getField(_NOT_FITTING).isNull()

    def why_not(parsed: Column) -> Column:
        # An event without op is said to be none, whatever its other fields are.
        return (F.when(~utf8, F.lit(f"{column} is not valid UTF-8"))
                .when(F.try_parse_json(text).isNull(), F.lit(f"{column} is not valid JSON"))
                .when(_json_event(parsed).op.isNotNull() & parsed.getField(_NOT_FITTING).isNotNull(),
                      _misfits(column, text, _json_event(parsed), schema)))

    return EventReader(parse, _json_event, fits, why_not)


def decode(column: str, schema: Mapping[str, str], delete_keys: Sequence[str], read: EventReader,
           truncates: bool = False) -> tuple[Column, Callable[[Column], Column], Callable[[Column], Column]]:
    """(event, why_not, row) of the records' `column` as `read` reads it: the event's fields; of
    the column the event is projected into, null when the event is one to apply, else why not;
    and the row it makes (value_schema's columns, debezium_op, debezium_position).
    `delete_keys`: the columns a delete event's before image must hold (every upsert sink's keys);
    `truncates`: whether a truncate is applied (`source.on_truncate`), its row's columns null."""
    from pyspark.sql import functions as F

    parse, unwrap, fits, format_why_not = read

    def why_not(parsed: Column) -> Column:
        e = unwrap(parsed)
        op, before, after, position = e.op, e.before, e.after, _position(e)
        missing_keys = [F.when(before.getField(k).isNull(), F.lit(k)) for k in delete_keys]
        keyed = F.coalesce(*missing_keys, F.lit(None)).isNull()
        # Decided from the parsed fields alone: only an event that is none is looked at again, to say why.
        applicable = (fits(parsed) & position.isNotNull()
                      & ((op.isin(*UPSERTED) & after.isNotNull()) | ((op == DELETE) & before.isNotNull() & keyed)
                         | ((op == TRUNCATE) & F.lit(truncates))))
        why = (F.when(op.isNull(), F.lit(f"{column} is no Debezium change event: it has no op"))
               .when((op == TRUNCATE) & F.lit(not truncates), F.lit(UNAPPLIED_TRUNCATE))
               .when(op == TRUNCATE, F.lit(NO_POSITION))
               .when(~op.isin(*APPLIED), F.concat(F.lit("op "), op, F.lit(" is none of c, r, u, d, t")))
               .when((op != DELETE) & after.isNull(), F.concat(F.lit("op "), op, F.lit(" has no after image")))
               .when((op == DELETE) & before.isNull(), F.lit("op d has no before image"))
               .when((op == DELETE) & ~keyed,
                     F.concat(F.lit("op d: its before image lacks the key column(s) "),
                              F.concat_ws(", ", *missing_keys),
                              F.lit(" (the source table's replica identity must hold them)")))
               .otherwise(F.lit(NO_POSITION)))
        return F.when(applicable, F.lit(None).cast("string")).otherwise(F.coalesce(format_why_not(parsed), why))

    def row(parsed: Column) -> Column:
        e = unwrap(parsed)
        values = F.when(e.op == DELETE, e.before).otherwise(e.after)
        return F.struct(*(values.getField(c).alias(c) for c in schema), e.op.alias(OP),
                        _position(e).alias(POSITION))

    return parse, why_not, row


def _json_event(parsed: Column) -> Column:
    """The event of a parsed JSON value: with the JSON converter's schema part, its payload (whole)."""
    from pyspark.sql import functions as F

    top = F.struct(*(parsed.getField(part).alias(part) for part in _PARTS))
    return F.when(parsed.getField("payload").isNotNull(), parsed.getField("payload")).otherwise(top)


def _position(e: Column) -> Column:
    """Of an event: PostgreSQL's (sequence[0], streamed, lsn) as one number, in commit
    order; else MySQL's file, pos and row as one number; either null when its parts do not fit
    their digits (never the time: the scales do not compare); else the source's time."""
    from pyspark.sql import functions as F

    source = e.source
    commit = F.from_json(source.getField("sequence"), "array<string>").getItem(0)
    postgres = {"commit": F.coalesce(commit, F.lit("0")), "streamed": F.when(e.op == "r", "0").otherwise("1"),
                "lsn": source.getField("lsn").cast("string")}
    binlog_number = F.regexp_extract(source.getField("file"), r"(\d+)$", 1)
    mysql = {"file": binlog_number, "pos": source.getField("pos").cast("string"),
             "row": F.coalesce(source.getField("row"), F.lit(0)).cast("string")}
    return (F.when(source.getField("lsn").isNotNull(), _digits(postgres, _POSTGRES_DIGITS))
            .when(source.getField("file").isNotNull(), _digits(mysql, _MYSQL_DIGITS))
            .otherwise(source.getField("ts_ms").cast(POSITION_TYPE)))


def _digits(parts: Mapping[str, Column], digits: Sequence[tuple[str, int]]) -> Column:
    """The parts (decimal texts), each padded to its digits, as one number; null when one is not
    all digits or has more."""
    from pyspark.sql import functions as F

    fits = F.lit(True)
    for name, width in digits:
        fits = fits & parts[name].rlike(f"^[0-9]{{1,{width}}}$")
    return F.when(fits, F.concat(*(F.lpad(parts[name], width, "0") for name, width in digits)).cast(POSITION_TYPE))


def _misfits(column: str, text: Column, e: Column, schema: Mapping[str, str]) -> Column:
    """Why an event (`_json_event`) with a field not of its type does not fit: the image columns
    whose JSON value is not null but was not read (computed only for such an event)."""
    from pyspark.sql import functions as F

    parsed = F.try_parse_json(text)
    found = []
    for image in ("before", "after"):
        for c, t in schema.items():
            json_value = F.coalesce(*(F.call_function("variant_get", parsed, F.lit(f"$.{prefix}{image}.{c}"))
                                      for prefix in ("payload.", "")))
            read = e.getField(image).getField(c)
            not_read = read.isNull() & json_value.isNotNull() & ~F.call_function("is_variant_null", json_value)
            found.append(F.when(not_read, F.lit(f"{image}.{c}: not {t}")))
    named = F.concat_ws("; ", *found)
    return F.concat(F.lit(f"{column} does not fit the change event's schema: "),
                    F.when(named != "", named).otherwise(F.lit("its op or source fields are not Debezium's types")))
