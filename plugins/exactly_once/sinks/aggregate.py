"""aggregate: one row per group; measures merge additively (count, sum) or by least /
greatest (min, max), so checkpoints may commit in any order. A checkpoint counted
twice would be wrong forever: the mode that proves exactly-once."""

from __future__ import annotations

from psycopg2 import sql

from exactly_once.sinks import names, require_columns
from exactly_once.sqlfiles import text
from exactly_once.tables import final_table

# How one checkpoint's staged rows of a group fold together, and how they merge into the final row.
_STAGED = {"sum": "sum({c})", "count": "sum({c})", "min": "min({c})", "max": "max({c})"}
_MERGED = {
    "sum": "{c} = COALESCE(f.{c} + EXCLUDED.{c}, f.{c}, EXCLUDED.{c})",
    "count": "{c} = COALESCE(f.{c} + EXCLUDED.{c}, f.{c}, EXCLUDED.{c})",
    "min": "{c} = LEAST(f.{c}, EXCLUDED.{c})",
    "max": "{c} = GREATEST(f.{c}, EXCLUDED.{c})",
}


class Aggregate:
    def check(self, sink) -> None:
        if not sink.keys:
            raise ValueError("aggregate sinks need keys")
        if not sink.measures:
            raise ValueError("aggregate sinks need measures")

    def unique_columns(self, sink) -> frozenset[str]:
        return frozenset(sink.keys)

    def required_columns(self, sink) -> frozenset[str]:
        return frozenset((*sink.keys, *sink.measures))

    def record_columns(self, sink, columns) -> list[str]:
        return [*sink.keys, *(m for m, how in sink.measures.items() if how != "count")]

    def staging_rows(self, rows, sink, columns):
        """One pre-aggregated row per group: count counts rows, sum/min/max fold the column
        of the measure's name."""
        from pyspark.sql import functions as F

        folds = {"count": lambda _: F.count(F.lit(1)), "sum": F.sum, "min": F.min, "max": F.max}
        require_columns(rows, sink, self.record_columns(sink, columns))
        return rows.groupBy(*sink.keys).agg(*(folds[how](m).alias(m) for m, how in sink.measures.items()))

    def promote(self, sink, staging, columns) -> sql.Composed:
        measures = list(sink.measures)
        return sql.SQL(text("merge/aggregate.sql")).format(
            final=final_table(sink), staging=staging, keys=names(sink.keys), measures=names(measures),
            staged_measures=sql.SQL(", ").join(
                sql.SQL(_STAGED[sink.measures[m]] + " AS {c}").format(c=sql.Identifier(m)) for m in measures),
            merged_measures=sql.SQL(", ").join(
                sql.SQL(_MERGED[sink.measures[m]]).format(c=sql.Identifier(m)) for m in measures))


MODE = Aggregate()
