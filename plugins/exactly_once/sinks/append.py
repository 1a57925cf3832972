"""append: one final row per Kafka record, unique on the record's coordinates. The final
rows are each record's own, so a reprocessing finds a checkpoint's contribution by its
ranges and keeps nothing besides."""

from __future__ import annotations

from psycopg2 import sql

from exactly_once.kafka_columns import KAFKA_OFFSET, KAFKA_PARTITION, KAFKA_TOPIC
from exactly_once.sinks import names, require_columns
from exactly_once.sqlfiles import named

COORDINATES = frozenset((KAFKA_TOPIC, KAFKA_PARTITION, KAFKA_OFFSET))


class Append:
    def check(self, sink) -> None:
        if sink.keys or sink.measures:
            raise ValueError(f"append sinks are keyed by ({KAFKA_TOPIC}, {KAFKA_PARTITION}, {KAFKA_OFFSET}); "
                             f"keys {list(sink.keys)} and measures {dict(sink.measures)} must be empty")

    def unique_columns(self, sink) -> frozenset[str]:
        return COORDINATES

    def required_columns(self, sink) -> frozenset[str]:
        return COORDINATES

    def record_columns(self, sink, columns) -> list[str]:
        return columns

    def contribution_columns(self, sink, columns) -> None:
        return None

    def staging_rows(self, rows, sink, columns):
        require_columns(rows, sink, columns)
        return rows.select(*columns)

    def rows_in_tasks(self, rows, sink, columns):
        from pyspark.sql import functions as F

        require_columns(rows, sink, columns)
        return [F.col(c) for c in columns], []

    def promote(self, sink, tables) -> sql.Composed:
        return sql.SQL(named("merge/append.sql")["promote"]).format(
            final=tables.final, staging=tables.staging, columns=names(tables.columns))

    def replace(self, sink, tables) -> tuple[sql.Composed, sql.Composed]:
        return sql.SQL(named("merge/append.sql")["forget"]).format(final=tables.final), self.promote(sink, tables)


MODE = Append()
