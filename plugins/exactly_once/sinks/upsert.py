"""upsert: by key, the row of the record with the highest offset wins, whatever order
checkpoints commit in."""

from __future__ import annotations

from psycopg2 import sql

from exactly_once.config import KAFKA_OFFSET, KAFKA_PARTITION
from exactly_once.sinks import each, names, require_columns
from exactly_once.sqlfiles import text
from exactly_once.tables import final_table


class Upsert:
    def check(self, sink) -> None:
        if not sink.keys:
            raise ValueError("upsert sinks need keys")
        if sink.measures:
            raise ValueError(f"upsert sinks take no measures, got {dict(sink.measures)}")

    def unique_columns(self, sink) -> frozenset[str]:
        return frozenset(sink.keys)

    def required_columns(self, sink) -> frozenset[str]:
        return frozenset((*sink.keys, KAFKA_PARTITION, KAFKA_OFFSET))

    def record_columns(self, sink, columns) -> list[str]:
        return columns

    def staging_rows(self, rows, sink, columns):
        from pyspark.sql import functions as F

        require_columns(rows, sink, columns)
        # An aggregate, not a window: each task keeps its newest row per key before the shuffle.
        newest = F.max_by(F.struct(*columns), F.struct(KAFKA_OFFSET, KAFKA_PARTITION))
        return rows.groupBy(*sink.keys).agg(newest.alias("_newest")).select("_newest.*")

    def promote(self, sink, staging, columns) -> sql.Composed:
        values = [c for c in columns if c not in sink.keys]
        return sql.SQL(text("merge/upsert.sql")).format(
            final=final_table(sink), staging=staging, columns=names(columns), keys=names(sink.keys),
            take_new=each("{c} = EXCLUDED.{c}", values))


MODE = Upsert()
