"""append: one final row per Kafka record, unique on the record's coordinates."""

from __future__ import annotations

from psycopg2 import sql

from exactly_once.config import KAFKA_OFFSET, KAFKA_PARTITION, KAFKA_TOPIC
from exactly_once.sinks import names, require_columns
from exactly_once.sqlfiles import text
from exactly_once.tables import final_table

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

    def staging_rows(self, rows, sink, columns):
        require_columns(rows, sink, columns)
        return rows.select(*columns)

    def promote(self, sink, staging, columns) -> sql.Composed:
        return sql.SQL(text("merge/append.sql")).format(final=final_table(sink), staging=staging,
                                                        columns=names(columns))


MODE = Append()
