"""An attempt's staging rows from one Spark job (issue 63): every sink's rows written from the
checked rows the write's first pass computed into a cache, each record parsed, transformed and
checked once (exactly_once.spark.kept_rows), by `copy_writer.write_tables` (an append's rows as
they come, a keyed sink's folded per key in each task, which its commit folds again), then the
dead letters. The table-by-table write of exactly_once.spark.staging makes the same rows in
several jobs: the refusals, then each table's (what the pass saves: the docs' Performance page).

A record with one row a sink table would refuse reaches no sink. The pass leaves such rows out
and counts them; where it left rows out, the refused records' dead letters are written from the
cached checked rows (with every other dead letter: one job's rows are what a staging table keeps
of the tag). A transform may make several rows of
one record: when a refused record has rows the pass wrote, the attempt is written again the
other way (Staging), which leaves out its every row. So it is when the pass fails: the other
way's isolation finds the records at fault. Nor does the pass serve a pipeline whose records
delete (their deletes are rows of the parsed records, not of the transform's), whose policy is `fail`
(which names the bad records before anything is written), or with a sink whose rows only
Spark's fold across tasks makes (a kafka sink's measures: its commit publishes each staged
row; an aggregate's min or max of text, which the commit's SQL would fold in the column's
collation where Spark compares bytes) or whose keys Spark groups otherwise than by their bytes.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from pyspark.sql import DataFrame, Observation
from pyspark.sql import functions as F
from pyspark.sql.types import DataType, DoubleType, FloatType

from exactly_once.catalog import ColumnType
from exactly_once.config import PipelineConfig
from exactly_once.ledger.tables import qualified, staging_table
from exactly_once.spark.copy_writer import TableCopy
from exactly_once.spark.frames import COORDINATES, NOTED, REFUSED, cache_level, every_letter, refused_records


@dataclass(frozen=True)
class OnePass:
    rows: DataFrame                   # column i: the fields of sink i's row of each accepted row
    tables: dict[str, TableCopy]      # each sink's staging table, in the columns' order
    refused: Observation              # how many rows the pass left out: a sink table would refuse them
    records: DataFrame                # the parsed records the pass reads
    checked: DataFrame                # their checked rows, cached by the write's first pass
    config: PipelineConfig
    held: list[DataFrame] = field(default_factory=list)  # what the pass cached: `release` them

    def refused_rows(self) -> int:
        return self.refused.get["rows"]

    def every_letter(self) -> DataFrame | None:
        """Every dead letter, the refused records' too (their raw key and value, which no
        checked row carries); None when a refused record has rows the pass wrote (a transform
        that makes several rows of a record), which it must not have. From the cached
        checked rows: the transform does not run again."""
        # Cached until `release`: read by the test below and by the dead letters' job.
        refused = refused_records(self.checked).persist(cache_level(self.checked.sparkSession))
        self.held.append(refused)
        accepted = self.checked.where(F.col(REFUSED).isNull()).select(*COORDINATES)
        # One job over every partition: take(1) scans them in rounds, a job each, when none has a row.
        if accepted.join(F.broadcast(refused.select(*COORDINATES)), list(COORDINATES), "left_semi").limit(1).count():
            return None
        return every_letter(self.records, refused, self.config)

    def release(self) -> None:
        for frame in self.held:
            frame.unpersist()

    def staged(self) -> dict[str, DataFrame]:
        """Each sink's staged rows as Spark's fold would make them (never computed: their types)."""
        return {name: table.staged for name, table in self.tables.items()}


def plan(records: DataFrame, checked: DataFrame, config: PipelineConfig, columns: Mapping[str, list[ColumnType]],
         targets: Mapping[str, Mapping[str, str]]) -> OnePass | None:
    """The pass over the parsed `records` (those set aside marked) and their `checked` rows,
    cached by the write's first pass (exactly_once.spark.kept_rows), or None where it does not
    serve the pipeline; `targets`: what each staging table's columns take, by sink."""
    if config.source.deletes or config.on_bad_record == "fail":
        return None
    accepted = checked.where(F.col(REFUSED).isNull()).drop(REFUSED, NOTED)
    fields, tables = [], {}
    for sink in config.sinks:
        names = [c.name for c in columns[sink.name]]
        made = sink.strategy.rows_in_tasks(accepted, sink, names)
        if made is None or not all(_grouped_by_bytes(accepted.schema[k].dataType) for k in sink.keys):
            return None
        row, roles = made
        fields.append(F.struct(*row).alias(f"t{len(fields)}"))
        tables[sink.name] = TableCopy(qualified(staging_table(config, sink.name)), targets[sink.name], roles,
                                      sink.strategy.staging_rows(accepted, sink, names))
    refused = Observation("rows a sink table would refuse")
    counted = checked.observe(refused, F.count_if(F.col(REFUSED).isNotNull()).alias("rows"))
    return OnePass(counted.where(F.col(REFUSED).isNull()).select(*fields), tables, refused, records, checked, config)


def _grouped_by_bytes(key: DataType) -> bool:
    """Whether Spark groups a key's values as a hash map of their bytes does (Folds, Newest in
    jvm/): not a float or double (-0.0 and 0.0 are one group, every NaN another), nor a
    string of a collation that compares otherwise."""
    return not isinstance(key, (FloatType, DoubleType)) and getattr(key, "collation", "UTF8_BINARY") == "UTF8_BINARY"
