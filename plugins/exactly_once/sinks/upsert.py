"""upsert: by key, the row of the record with the highest offset wins, whatever order
checkpoints commit in."""

from __future__ import annotations

from psycopg2 import sql

from exactly_once.config import KAFKA_OFFSET, KAFKA_PARTITION
from exactly_once.sinks import each, names, require_columns
from exactly_once.sinks._keyed import Keyed
from exactly_once.sqlfiles import named


class Upsert(Keyed):
    def check(self, sink) -> None:
        if not sink.keys:
            raise ValueError("upsert sinks need keys")
        if sink.measures:
            raise ValueError(f"upsert sinks take no measures, got {dict(sink.measures)}")

    def required_columns(self, sink) -> frozenset[str]:
        return frozenset((*sink.keys, KAFKA_PARTITION, KAFKA_OFFSET))

    def record_columns(self, sink, columns) -> list[str]:
        return columns

    def contribution_columns(self, sink, columns) -> list[str]:
        return list(columns)

    def staging_rows(self, rows, sink, columns):
        from pyspark.sql import functions as F

        require_columns(rows, sink, columns)
        # An aggregate, not a window: each task keeps its newest row per key before the shuffle.
        newest = F.max_by(F.struct(*columns), F.struct(KAFKA_OFFSET, KAFKA_PARTITION))
        return rows.groupBy(*sink.keys).agg(newest.alias("_newest")).select("_newest.*")

    def folded(self, sink, source, where, columns) -> sql.Composed:
        return sql.SQL(named("merge/upsert.sql")["newest"]).format(
            source=source, where=where, keys=names(sink.keys), columns=names(columns))

    def merge(self, sink, tables, folded) -> sql.Composed:
        return sql.SQL(named("merge/upsert.sql")["merge"]).format(
            final=tables.final, newest=folded, columns=names(tables.columns), keys=names(sink.keys),
            take_new=each("{c} = EXCLUDED.{c}", [c for c in tables.columns if c not in sink.keys]))


MODE = Upsert()
