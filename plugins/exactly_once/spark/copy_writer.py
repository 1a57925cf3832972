"""The staging writer's Python face: a frame's rows appended to a PostgreSQL table by the
`exactly_once_copy` data source (jvm/), and, into a staging table of the ledger, tagged and
settled as the attempt's; several tables' rows from one Spark job by `exactly_once_copy_tables`."""

from __future__ import annotations

import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from pyspark.sql import DataFrame, Observation
from pyspark.sql import functions as F

ROWS = "exactly_once.copy_tables.rows."  # + a write's id: the session's configuration that gets its rows per table


def write_copy(frame: DataFrame, table: str, jdbc: Mapping[str, str], targets: Mapping[str, str],
               **settled: str) -> None:
    """Appends the rows to `table` from the executors with PostgreSQL's COPY (the
    `exactly_once_copy` data source, jvm/), each Spark task in one transaction; `targets`
    gives each column's type in the table (`ColumnType.base`), which decides how a value is
    written (as Spark's JDBC writer's value would be cast: exactly_once.spark.row_checks).
    `settled` are the data source's options that keep only the rows of the task attempts
    Spark committed (`write_staging`)."""
    (frame.write.format("exactly_once_copy")
     .options(url=jdbc["url"], user=jdbc["user"], password=jdbc["password"], table=table,
              targets=_targets(table, frame.columns, targets), **settled)
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
    write_copy(tagged.observe(written, F.count(F.lit(1)).alias("rows")), table, jdbc, targets,
               **_settled(checkpoint_id, attempt, token))
    return written.get["rows"]


@dataclass(frozen=True)
class TableCopy:
    """One table of `write_tables`: where its rows go, what each of its columns takes (as
    `write_copy`'s `targets`), and how each task folds its rows per key (the roles of the
    fields of its rows, KeyedRows in jvm/; none: each row as it is) into rows of `staged`'s
    schema (a frame of the rows Spark's own fold would stage, never computed)."""
    table: str
    targets: Mapping[str, str]
    roles: Sequence[str]
    staged: DataFrame


def write_tables(frame: DataFrame, tables: Sequence[TableCopy], jdbc: Mapping[str, str], checkpoint_id: int,
                 attempt: int, token: str | None = None, max_folded_keys: int = 65536) -> list[int]:
    """Appends each table's rows, tagged (checkpoint, attempt), all from one Spark job (the
    `exactly_once_copy_tables` data source, jvm/): column i of `frame` is a struct, table i's
    fields of each row. Into staging tables of the ledger (with the attempt's `token`), each
    table is settled as `write_staging`'s. Returns how many rows each table got from the task
    attempts Spark committed, which the data source leaves in the session's configuration
    (rows folded in the tasks are counted there only). A task writes a table's folds whenever
    it holds `max_folded_keys` keys (about 20 MB of rows like the demo's upsert's), so its
    memory does not grow with its keys."""
    tag = {"checkpoint_id": F.lit(checkpoint_id), "attempt": F.lit(attempt)}
    options = {"write_id": uuid.uuid4().hex, "max_folded_keys": str(max_folded_keys),
               **_settled(checkpoint_id, attempt, token)}
    rows = []
    for i, (column, copy) in enumerate(zip(frame.columns, tables)):
        staged = copy.staged.withColumns(tag)
        rows.append(F.struct(F.col(column + ".*"), *(value.alias(name) for name, value in tag.items())).alias(column))
        options |= {f"table.{i}": copy.table, f"targets.{i}": _targets(copy.table, staged.columns, copy.targets)}
        if copy.roles:
            options |= {f"roles.{i}": ",".join([*copy.roles, *(["same"] * len(tag))]),
                        f"output.{i}": staged.schema.json()}
    (frame.select(*rows).write.format("exactly_once_copy_tables")
     .options(url=jdbc["url"], user=jdbc["user"], password=jdbc["password"], **options).mode("append").save())
    session = frame.sparkSession
    written = ROWS + options["write_id"]
    counts = session.conf.get(written)
    session.conf.unset(written)
    return [int(n) for n in counts.split(",")]


def _targets(table: str, columns: Sequence[str], targets: Mapping[str, str]) -> str:
    """The data source's `targets`: each column's type in the table, in the frame's order."""
    missing = [c for c in columns if c not in targets]
    if missing:
        raise ValueError(f"{table} has no column {', '.join(missing)}")
    return ",".join(targets[c] for c in columns)


def _settled(checkpoint_id: int, attempt: int, token: str | None) -> dict[str, str]:
    """The data source's options that settle a staging write of the ledger's (none without a token)."""
    return {} if token is None else {"task_column": "writer_task", "checkpoint_id": str(checkpoint_id),
                                     "attempt": str(attempt), "token": token}
