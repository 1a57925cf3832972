"""Registering a pipeline: its configuration (and configuration version) in the ledger, a
staging table per sink, a contributions table per keyed sink, and a check of each final
table against the catalog (it exists, has the columns and the unique index its sink mode
merges on)."""

from __future__ import annotations

from psycopg2 import sql

from exactly_once import ddl
from exactly_once.config import PipelineConfig, Sink
from exactly_once.errors import Permanent
from exactly_once.problems import Problem
from exactly_once.ledger_rows import Q, LedgerRows
from exactly_once.row_checks import ColumnType, column_types
from exactly_once.tables import contributions_indexes, contributions_table, final_table, staging_index, staging_table


class SinkTableError(Permanent, ValueError):
    """A sink's final table is missing or cannot take order-independent merges."""


def register(rows: LedgerRows) -> None:
    """Idempotent; call with the pipeline locked."""
    config = rows.config
    rows.run("register_pipeline", pipeline=config.name, config=config.model_dump_json())
    rows.record_version()
    for sink in config.sinks:
        final_columns = check_final_table(rows, sink)
        staging = staging_table(config, sink.name)
        rows.cur.execute(sql.SQL(Q["create_staging"]).format(
            staging=staging, final=final_table(sink), staging_index=staging_index(config, sink)))
        if rows.columns(staging) != [*final_columns, "checkpoint_id", "attempt"]:
            raise SinkTableError(f"sink {sink.name!r}: staging table {staging.as_string(rows.cur)} no longer "
                                 f"matches final table {sink.table}; drop it while no checkpoint is open")
        kept = sink.strategy.contribution_columns(sink, final_columns)
        if kept is not None:
            _create_contributions(rows, sink, kept)


def _create_contributions(rows: LedgerRows, sink: Sink, columns: list[str]) -> None:
    """The sink's contributions table, with a column for each the final table gained since."""
    table = contributions_table(rows.config, sink)
    by_checkpoint, by_keys = contributions_indexes(rows.config, sink)
    rows.cur.execute(sql.SQL(Q["create_contributions"]).format(
        contributions=table, final=final_table(sink), columns=sql.SQL(", ").join(map(sql.Identifier, columns)),
        by_checkpoint=by_checkpoint, by_keys=by_keys, keys=sql.SQL(", ").join(map(sql.Identifier, sink.keys))))
    for column in sorted(set(columns) - set(rows.columns(table))):
        rows.run("column_type", table=final_table(sink).as_string(rows.cur), column=column)
        rows.cur.execute(sql.SQL(Q["add_contribution_column"]).format(
            contributions=table, column=sql.Identifier(column), type=sql.SQL(rows.cur.fetchone()[0])))


def check_final_table(rows: LedgerRows, sink: Sink) -> list[str]:
    """The final table's columns, once it is found fit for the sink's mode."""
    columns = column_types(rows.cur, final_table(sink))
    problems = structure_problems(rows.config, sink, columns, unique_column_sets(rows.cur, sink))
    if problems:
        raise SinkTableError("; ".join(f"{p.subject}: {p.message}" for p in problems))
    return [c.name for c in columns]


def unique_column_sets(cur, sink: Sink) -> set[frozenset[str]]:
    """The column sets of the final table's unique indexes (what ON CONFLICT can use)."""
    cur.execute(Q["unique_indexes"], {"table": final_table(sink).as_string(cur)})
    return {frozenset(row[0]) for row in cur.fetchall()}


def table_subject(sink: Sink) -> str:
    return f"sink {sink.name!r}: table {sink.table}"


def structure_problems(config: PipelineConfig, sink: Sink, columns: list[ColumnType],
                       unique: set[frozenset[str]]) -> list[Problem]:
    """What keeps the sink's final table (its columns, and the column sets of its unique
    indexes) from taking its mode's merges: it is missing, lacks a column the mode needs, or is
    not unique on what the mode merges on; each with its fix."""
    if not columns:
        return [Problem(table_subject(sink), "does not exist", ddl.create_table(config, sink))]
    mode = sink.strategy
    problems = [Problem(f"{table_subject(sink)}: column {c}", f"is missing: the {sink.mode} mode needs it",
                        ddl.add_column(config, sink, c))
                for c in sorted(mode.required_columns(sink) - {c.name for c in columns})]
    if mode.unique_columns(sink) not in unique:
        problems.append(Problem(table_subject(sink), f"has no unique index or constraint on exactly "
                                                     f"{sorted(mode.unique_columns(sink))}, which the {sink.mode} "
                                                     "mode merges on", ddl.add_unique(sink)))
    return problems


def final_columns(rows: LedgerRows) -> dict[str, list[ColumnType]]:
    """Each sink's final table columns with their types, in table order (what its staging
    rows carry, and what the row checks check). SinkTableError if a table is gone."""
    found = {sink.name: column_types(rows.cur, final_table(sink)) for sink in rows.config.sinks}
    missing = [sink.table for sink in rows.config.sinks if not found[sink.name]]
    if missing:
        raise SinkTableError(f"pipeline {rows.config.name!r}: final table(s) {missing} do not exist")
    return found
