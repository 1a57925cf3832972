"""The staging writer's Python face: a frame's rows appended to a PostgreSQL table by the
`exactly_once_copy` data source (jvm/), and, into a staging table of the ledger, tagged and
settled as the attempt's."""

from __future__ import annotations

from collections.abc import Mapping

from pyspark.sql import DataFrame, Observation
from pyspark.sql import functions as F


def write_copy(frame: DataFrame, table: str, jdbc: Mapping[str, str], targets: Mapping[str, str],
               **settled: str) -> None:
    """Appends the rows to `table` from the executors with PostgreSQL's COPY (the
    `exactly_once_copy` data source, jvm/), each Spark task in one transaction; `targets`
    gives each column's type in the table (`ColumnType.base`), which decides how a value is
    written (as Spark's JDBC writer's value would be cast: exactly_once.spark.row_checks).
    `settled` are the data source's options that keep only the rows of the task attempts
    Spark committed (`write_staging`)."""
    missing = [c for c in frame.columns if c not in targets]
    if missing:
        raise ValueError(f"{table} has no column {', '.join(missing)}")
    (frame.write.format("exactly_once_copy")
     .options(url=jdbc["url"], user=jdbc["user"], password=jdbc["password"], table=table,
              targets=",".join(targets[c] for c in frame.columns), **settled)
     .mode("append").save())


def write_staging(frame: DataFrame, table: str, jdbc: Mapping[str, str], targets: Mapping[str, str],
                  checkpoint_id: int, attempt: int, token: str | None = None) -> int:
    """Appends the rows, tagged (checkpoint, attempt), and returns how many were written:
    counted as they pass into the write (an Observation, which counts the successful attempt
    of each Spark task once), so the rows are computed once. Into a staging table of the
    ledger (with the attempt's `token`), each row names the Spark task attempt that wrote it,
    and once Spark commits the write the ledger keeps only the rows of the task attempts it
    committed (`exactly_once.settle_staged`): a task run again after it committed its COPY
    adds nothing. Pre-commit checks the count against the table (a task attempt committing
    after the settlement shows there)."""
    written = Observation(f"rows written to {table}")
    tagged = frame.withColumns({"checkpoint_id": F.lit(checkpoint_id), "attempt": F.lit(attempt)})
    settled = {} if token is None else {"task_column": "writer_task", "checkpoint_id": str(checkpoint_id),
                                        "attempt": str(attempt), "token": token}
    write_copy(tagged.observe(written, F.count(F.lit(1)).alias("rows")), table, jdbc, targets, **settled)
    return written.get["rows"]
