"""aggregate: one row per group; measures merge additively (count, sum) or by least /
greatest (min, max), so checkpoints may commit in any order. A checkpoint counted
twice would be wrong forever: the mode that proves exactly-once. A reprocessing
recomputes the groups it touches from every checkpoint's kept contribution, which is
exact for min and max too (no subtraction undoes a least or greatest)."""

from __future__ import annotations

from psycopg2 import sql

from exactly_once.sinks import names, require_columns
from exactly_once.sinks._keyed import Keyed
from exactly_once.sqlfiles import named

# How rows of a group fold together (a checkpoint's staged rows, or the contributions of
# every checkpoint: a count's contributions are counts), and how a fold merges into the final row.
_FOLDED = {"sum": "sum({c})", "count": "sum({c})", "min": "min({c})", "max": "max({c})"}
_MERGED = {
    "sum": "{c} = COALESCE(f.{c} + EXCLUDED.{c}, f.{c}, EXCLUDED.{c})",
    "count": "{c} = COALESCE(f.{c} + EXCLUDED.{c}, f.{c}, EXCLUDED.{c})",
    "min": "{c} = LEAST(f.{c}, EXCLUDED.{c})",
    "max": "{c} = GREATEST(f.{c}, EXCLUDED.{c})",
}


class Aggregate(Keyed):
    def check(self, sink) -> None:
        if not sink.keys:
            raise ValueError("aggregate sinks need keys")
        if not sink.measures:
            raise ValueError("aggregate sinks need measures")

    def required_columns(self, sink) -> frozenset[str]:
        return frozenset((*sink.keys, *sink.measures))

    def record_columns(self, sink, columns) -> list[str]:
        return [*sink.keys, *(m for m, how in sink.measures.items() if how != "count")]

    def contribution_columns(self, sink, columns) -> list[str]:
        return [*sink.keys, *sink.measures]

    def staging_rows(self, rows, sink, columns):
        """One pre-aggregated row per group: count counts rows, sum/min/max fold the column
        of the measure's name."""
        from pyspark.sql import functions as F

        folds = {"count": lambda _: F.count(F.lit(1)), "sum": F.sum, "min": F.min, "max": F.max}
        require_columns(rows, sink, self.record_columns(sink, columns))
        return rows.groupBy(*sink.keys).agg(*(folds[how](m).alias(m) for m, how in sink.measures.items()))

    def rows_in_tasks(self, rows, sink, columns):
        from pyspark.sql import functions as F
        from pyspark.sql.types import StringType

        require_columns(rows, sink, self.record_columns(sink, columns))
        if any(how in ("min", "max") and isinstance(rows.schema[m].dataType, StringType)
               for m, how in sink.measures.items()):
            return None  # Spark's fold compares text by its bytes; the commit's SQL, of several folds, by a collation
        measures = [F.lit(1) if how == "count" else F.col(m) for m, how in sink.measures.items()]
        return [*(F.col(k) for k in sink.keys), *measures], ["key"] * len(sink.keys) + list(sink.measures.values())

    def folded(self, sink, source, where, columns) -> sql.Composed:
        return sql.SQL(named("merge/aggregate.sql")["folded"]).format(
            source=source, where=where, keys=names(sink.keys), folded_measures=sql.SQL(", ").join(
                sql.SQL(_FOLDED[how] + " AS {c}").format(c=sql.Identifier(m)) for m, how in sink.measures.items()))

    def merge(self, sink, tables, folded) -> sql.Composed:
        return sql.SQL(named("merge/aggregate.sql")["merge"]).format(
            final=tables.final, folded=folded, keys=names(sink.keys), measures=names(list(sink.measures)),
            merged_measures=sql.SQL(", ").join(
                sql.SQL(_MERGED[how]).format(c=sql.Identifier(m)) for m, how in sink.measures.items()))


MODE = Aggregate()
