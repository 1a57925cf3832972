"""The statements that promote a sink's staging rows into its final table.

Pure builders: they take the sink's configuration and the final table's
columns and return psycopg2 `sql.Composed`, identifiers quoted. The templates
are sql/merge/*.sql.
"""

from __future__ import annotations

from collections.abc import Sequence

from psycopg2 import sql

from exactly_once.config import KAFKA_OFFSET, KAFKA_PARTITION, KAFKA_TOPIC, Sink
from exactly_once.sqlfiles import text

LEDGER_SCHEMA = "exactly_once"
DEAD_LETTER_STAGING = sql.Identifier(LEDGER_SCHEMA, "staging_dead_letters")
DEAD_LETTER_STAGING_NAME = ".".join(DEAD_LETTER_STAGING.strings)
DEAD_LETTERS = "_dead_letters"  # key of the dead letters among a checkpoint's staged sinks

# How one checkpoint's staged rows of a group fold together, and how they merge into the final row.
_STAGED = {"sum": "sum({c})", "count": "sum({c})", "min": "min({c})", "max": "max({c})"}
_MERGED = {
    "sum": "{c} = COALESCE(f.{c} + EXCLUDED.{c}, f.{c}, EXCLUDED.{c})",
    "count": "{c} = COALESCE(f.{c} + EXCLUDED.{c}, f.{c}, EXCLUDED.{c})",
    "min": "{c} = LEAST(f.{c}, EXCLUDED.{c})",
    "max": "{c} = GREATEST(f.{c}, EXCLUDED.{c})",
}


def staging_table(pipeline: str, sink: str) -> sql.Identifier:
    return sql.Identifier(LEDGER_SCHEMA, f"stg_{pipeline}_{sink}")


def staging_table_name(pipeline: str, sink: str) -> str:
    """The same table as a plain qualified name (for Spark's JDBC writer); config names
    are lower-case identifiers, so it needs no quoting."""
    return ".".join(staging_table(pipeline, sink).strings)


def final_table(sink: Sink) -> sql.Identifier:
    return sql.Identifier(*sink.schema_and_table)


def unique_columns(sink: Sink) -> frozenset[str]:
    """The columns the final table must be unique on for the merge to be order-independent."""
    if sink.mode == "append":
        return frozenset((KAFKA_TOPIC, KAFKA_PARTITION, KAFKA_OFFSET))
    return frozenset(sink.keys)


def required_columns(sink: Sink) -> frozenset[str]:
    if sink.mode == "upsert":
        return frozenset((*sink.keys, KAFKA_PARTITION, KAFKA_OFFSET))
    return unique_columns(sink) | frozenset(sink.measures)


def _names(columns: Sequence[str]) -> sql.Composed:
    return sql.SQL(", ").join(map(sql.Identifier, columns))


def _each(template: str, columns: Sequence[str], how: dict[str, str] | None = None) -> sql.Composed:
    return sql.SQL(", ").join(
        sql.SQL(template if how is None else how[c]).format(c=sql.Identifier(c)) for c in columns)


def merge_statement(pipeline: str, sink: Sink, columns: Sequence[str]) -> sql.Composed:
    """INSERT … SELECT from the staging rows of %(checkpoint_id)s/%(attempt)s into the final table."""
    tables = {"final": final_table(sink), "staging": staging_table(pipeline, sink.name)}
    if sink.mode == "append":
        return sql.SQL(text("merge/append.sql")).format(columns=_names(columns), **tables)
    if sink.mode == "upsert":
        values = [c for c in columns if c not in sink.keys]
        return sql.SQL(text("merge/upsert.sql")).format(
            columns=_names(columns), keys=_names(sink.keys),
            take_new=_each("{c} = EXCLUDED.{c}", values), **tables)
    measures = list(sink.measures)
    return sql.SQL(text("merge/aggregate.sql")).format(
        keys=_names(sink.keys), measures=_names(measures),
        staged_measures=sql.SQL(", ").join(
            sql.SQL(_STAGED[sink.measures[m]] + " AS {c}").format(c=sql.Identifier(m)) for m in measures),
        merged_measures=_each("", measures, {m: _MERGED[sink.measures[m]] for m in measures}),
        **tables)
