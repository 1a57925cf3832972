"""Registering a pipeline: its configuration in the ledger, a staging table per sink,
and a check of each final table against the catalog (it exists, has the columns and
the unique index its sink mode merges on)."""

from __future__ import annotations

from psycopg2 import sql

from exactly_once.config import Sink
from exactly_once.errors import Permanent
from exactly_once.ledger_rows import Q, LedgerRows
from exactly_once.row_checks import ColumnType, column_types
from exactly_once.tables import final_table, staging_index, staging_table


class SinkTableError(Permanent, ValueError):
    """A sink's final table is missing or cannot take order-independent merges."""


def register(rows: LedgerRows) -> None:
    """Idempotent; call with the pipeline locked."""
    config = rows.config
    rows.run("register_pipeline", pipeline=config.name, config=config.model_dump_json())
    for sink in config.sinks:
        final_columns = check_final_table(rows, sink)
        staging = staging_table(config, sink.name)
        rows.cur.execute(sql.SQL(Q["create_staging"]).format(
            staging=staging, final=final_table(sink), staging_index=staging_index(config, sink)))
        if rows.columns(staging) != [*final_columns, "checkpoint_id", "attempt"]:
            raise SinkTableError(f"sink {sink.name!r}: staging table {staging.as_string(rows.cur)} no longer "
                                 f"matches final table {sink.table}; drop it while no checkpoint is open")


def check_final_table(rows: LedgerRows, sink: Sink) -> list[str]:
    """The final table's columns, once it is found fit for the sink's mode."""
    mode = sink.strategy
    columns = rows.columns(final_table(sink))
    if not columns:
        raise SinkTableError(f"sink {sink.name!r}: final table {sink.table} does not exist")
    missing = sorted(mode.required_columns(sink) - set(columns))
    if missing:
        raise SinkTableError(f"sink {sink.name!r}: final table {sink.table} lacks columns {missing}")
    rows.run("unique_indexes", table=final_table(sink).as_string(rows.cur))
    if mode.unique_columns(sink) not in {frozenset(row[0]) for row in rows.cur.fetchall()}:
        raise SinkTableError(f"sink {sink.name!r} ({sink.mode}): final table {sink.table} needs a unique "
                             f"index or constraint on exactly {sorted(mode.unique_columns(sink))}")
    return columns


def final_columns(rows: LedgerRows) -> dict[str, list[ColumnType]]:
    """Each sink's final table columns with their types, in table order (what its staging
    rows carry, and what the row checks check). SinkTableError if a table is gone."""
    found = {sink.name: column_types(rows.cur, final_table(sink)) for sink in rows.config.sinks}
    missing = [sink.table for sink in rows.config.sinks if not found[sink.name]]
    if missing:
        raise SinkTableError(f"pipeline {rows.config.name!r}: final table(s) {missing} do not exist")
    return found
