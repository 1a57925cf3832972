"""Registering a pipeline: its configuration (and configuration version) in the ledger, a
staging table per sink, a contributions table per keyed sink, and a check of each final
table against the catalog (it exists, has the columns and the unique index its sink mode
merges on).

Each registration (every begin, under the pipeline's lock) brings a sink's staging and
contributions tables to its final table's shape, column by column and by name (what writes
to them and reads from them names its columns): a column the final table gained (with its
default for the rows already there), lost, or whose type or NOT NULL changed. Rows already
there stay, a pre-committed checkpoint's among them; where they refuse a change (a narrower
type, NOT NULL where one has no value), the column stays as it is for now: the commit then
refuses those rows as the final table does, and the checkpoint runs again.

An upsert sink's staging and contributions tables also have `kafka_tombstone` (its rows'
mark, `upsert.ledger_marks`), added to the tables of a sink registered before it was; where
the sink takes tombstones, its staging table lets in nulls in the columns a tombstone leaves
empty (`upsert.tombstone_nulls`), and its contributions table has an index of them.
"""

from __future__ import annotations

import logging
from collections.abc import Set as AbstractSet
from dataclasses import dataclass

import psycopg2
from psycopg2 import sql

from exactly_once import ddl
from exactly_once.catalog import ColumnType, column_types
from exactly_once.config import PipelineConfig, Sink
from exactly_once.errors import Permanent
from exactly_once.ledger.rows import LedgerRows, Q
from exactly_once.ledger.tables import (LEDGER_SCHEMA, contributions_indexes, contributions_table, earlier_tables,
                                        final_table, staging_index, staging_table, tombstones_index)
from exactly_once.problems import Problem
from exactly_once.sinks.upsert import ledger_marks, tombstone_nulls

log = logging.getLogger(__name__)

STAGING_OWN = ("checkpoint_id", "attempt", "writer_task")  # a staging table's columns besides its final table's
CONTRIBUTIONS_OWN = ("checkpoint_id",)


class SinkTableError(Permanent, ValueError):
    """A sink's final table is missing or cannot take order-independent merges."""


@dataclass(frozen=True)
class Shape:
    """A column as a staging or contributions table copies it (`column_shapes` in sql/ledger.sql)."""

    type: str
    not_null: bool
    default: str | None  # the expression, as the catalog shows it


def register(rows: LedgerRows) -> None:
    """Idempotent; call with the pipeline locked."""
    config = rows.config
    problems = order_problems(rows.cur, config)
    if problems:
        raise SinkTableError("; ".join(str(p) for p in problems))
    rows.run("register_pipeline", pipeline=config.name, config=config.model_dump_json())
    rows.record_version()
    for sink in config.sinks:
        final_columns = check_final_table(rows, sink)
        final = column_shapes(rows, final_table(sink))
        staging = staging_table(config, sink.name)
        earlier_staging, earlier_contributions = earlier_tables(config, sink)
        _move_from_earlier_table(rows, earlier_staging, staging)
        if not _ready(rows, "staging_ready", table=staging, index=staging_index(config, sink)):
            rows.cur.execute(sql.SQL(Q["create_staging"]).format(
                staging=staging, final=final_table(sink), staging_index=staging_index(config, sink)))
        _let_the_job_role_resolve(rows, sink)
        _add_writer_task(rows, staging)
        marks = ledger_marks(sink)
        _add_marks(rows, staging, marks)
        _follow(rows, staging, final, final_columns, (*STAGING_OWN, *marks), nullability=True,
                nullable=tombstone_nulls(sink, final_columns, config.source))
        kept = sink.strategy.contribution_columns(sink, final_columns)
        if kept is not None:
            _move_from_earlier_table(rows, earlier_contributions, contributions_table(config, sink))
            _create_contributions(rows, sink, kept, final, marks)


def _let_the_job_role_resolve(rows: LedgerRows, sink: Sink) -> None:
    """USAGE on the final table's schema for the job role, which reads the table's shape from
    the catalog (`final_columns`, `LedgerRows.may_refuse`), where the commit role owns the
    schema; otherwise the preflight names the grant (exactly_once.operate.privileges)."""
    schema = sink.schema_and_table[0]
    rows.run("job_needs_schema_usage", schema=schema)
    needs = rows.cur.fetchone()
    if needs is not None and needs[0]:
        rows.cur.execute(sql.SQL(Q["grant_schema_usage"]).format(schema=sql.Identifier(schema)))


def _create_contributions(rows: LedgerRows, sink: Sink, columns: list[str], final: dict[str, Shape],
                          marks: tuple[str, ...]) -> None:
    """The sink's contributions table, shaped like the final table's `columns`, and its
    `marks`. It keeps no NOT NULL: it holds what was merged, which the final table checked."""
    table = contributions_table(rows.config, sink)
    by_checkpoint, by_keys = contributions_indexes(rows.config, sink)
    keys = sql.SQL(", ").join(map(sql.Identifier, sink.keys))
    if not _ready(rows, "contributions_ready", table=table, by_checkpoint=by_checkpoint, by_keys=by_keys):
        rows.cur.execute(sql.SQL(Q["create_contributions"]).format(
            contributions=table, final=final_table(sink), columns=sql.SQL(", ").join(map(sql.Identifier, columns)),
            by_checkpoint=by_checkpoint, by_keys=by_keys, keys=keys))
    _add_marks(rows, table, marks)
    _follow(rows, table, final, columns, (*CONTRIBUTIONS_OWN, *marks), nullability=False)
    if marks and not _ready(rows, "index_ready", index=tombstones_index(rows.config, sink)):
        rows.cur.execute(sql.SQL(Q["create_tombstones_index"]).format(
            contributions=table, index=tombstones_index(rows.config, sink), keys=keys))


def _add_writer_task(rows: LedgerRows, staging: sql.Identifier) -> None:
    """The column of the Spark task attempt that wrote a row, for a staging table created
    without it (by an earlier library beside this one: sql/migrations/0015_staging_writer_tasks.sql
    added it to the tables there were)."""
    if "writer_task" not in column_shapes(rows, staging):
        rows.cur.execute(sql.SQL(Q["add_writer_task"]).format(staging=staging))


def _add_marks(rows: LedgerRows, table: sql.Identifier, marks: tuple[str, ...]) -> None:
    """The marks the ledger table lacks (every mark is kafka_tombstone, so far), false for the
    rows already there, and their default where it went (a table copied without defaults:
    `create_like_earlier_table`)."""
    current = column_shapes(rows, table)
    for mark in marks:
        if mark not in current:
            rows.cur.execute(sql.SQL(Q["add_tombstone_mark"]).format(table=table, column=sql.Identifier(mark)))
        elif current[mark].default is None:
            rows.cur.execute(sql.SQL(Q["tombstone_mark_default"]).format(table=table, column=sql.Identifier(mark)))


def _ready(rows: LedgerRows, question: str, **relations: sql.Identifier) -> bool:
    """Whether a ledger table has every index and trigger it needs, asked of the catalog: DDL
    that would change nothing (CREATE INDEX IF NOT EXISTS) still waits for the table's
    writers. Its tables and indexes are all in the ledger's schema."""
    rows.run(question, **{name: sql.Identifier(LEDGER_SCHEMA, relation.strings[-1]).as_string(rows.cur)
                          for name, relation in relations.items()})
    return rows.cur.fetchone()[0]


def _move_from_earlier_table(rows: LedgerRows, earlier: sql.Identifier, table: sql.Identifier) -> None:
    """The pipeline's rows (a pre-committed checkpoint's staged rows, committed checkpoints'
    contributions) out of its table under the earlier naming rule (no length prefix:
    `tables.earlier_tables`), which another pipeline may share, into `table` (created like
    it if need be). The earlier table is dropped once no pipeline's rows are left in it."""
    earlier_columns = rows.columns(earlier)
    if not earlier_columns:
        return
    rows.cur.execute(sql.SQL(Q["create_like_earlier_table"]).format(earlier=earlier, table=table))
    present = set(rows.columns(table))
    columns = sql.SQL(", ").join(sql.Identifier(c) for c in earlier_columns if c in present)
    rows.cur.execute(sql.SQL(Q["move_from_earlier_table"]).format(earlier=earlier, table=table, columns=columns),
                     {"pipeline": rows.config.name})
    rows.cur.execute(sql.SQL(Q["drop_table_if_empty"]).format(table=earlier))
    log.info("pipeline %r: its rows moved from %s to %s", rows.config.name, earlier.as_string(rows.cur),
             table.as_string(rows.cur))


def column_shapes(rows: LedgerRows, table: sql.Identifier) -> dict[str, Shape]:
    """The table's columns by name, in table order; empty if it does not exist."""
    rows.run("column_shapes", table=table.as_string(rows.cur))
    return {name: Shape(type_, not_null, default) for name, type_, not_null, default in rows.cur.fetchall()}


def _follow(rows: LedgerRows, table: sql.Identifier, final: dict[str, Shape], columns: list[str],
            own: tuple[str, ...], nullability: bool, nullable: AbstractSet[str] = frozenset()) -> None:
    """Alters the ledger table where its columns differ from the final table's `columns`
    (and, with `nullability`, their NOT NULL, but for the `nullable` ones, which take nulls
    whatever the final table's); its `own` columns stay."""
    current = column_shapes(rows, table)

    def alter(statement: str, column: str, **parts: sql.Composable) -> sql.Composed:
        return sql.SQL(Q[statement]).format(table=table, column=sql.Identifier(column), **parts)

    for column in current.keys() - {*columns, *own}:
        rows.cur.execute(alter("follow_dropped_column", column))
    for column in columns:
        wanted, found = final[column], current.get(column)
        if found is None:
            default = sql.SQL("") if wanted.default is None else sql.SQL("DEFAULT " + wanted.default)
            rows.cur.execute(alter("follow_added_column", column, type=sql.SQL(wanted.type), default=default))
            found = Shape(wanted.type, False, None)
        if found.type != wanted.type:
            _unless_rows_refuse(rows, alter("follow_type", column, type=sql.SQL(wanted.type)), table, column)
        not_null = wanted.not_null and column not in nullable
        if nullability and found.not_null != not_null:
            change = sql.SQL("SET" if not_null else "DROP")
            _unless_rows_refuse(rows, alter("follow_nullability", column, change=change), table, column)


def _unless_rows_refuse(rows: LedgerRows, change: sql.Composed, table: sql.Identifier, column: str) -> None:
    """The change, unless a value in the table refuses it (a data or integrity error): then the
    column stays looser than the final table's, which refuses those rows at commit."""
    rows.run("before_change_rows_may_refuse")
    try:
        rows.cur.execute(change)
    except (psycopg2.DataError, psycopg2.IntegrityError) as refused:
        rows.run("change_refused")
        log.warning("%s keeps column %s as it is until its rows are gone: %s", table.as_string(rows.cur), column,
                    str(refused).strip())
    else:
        rows.run("change_made")


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
    problems = [Problem(f"{table_subject(sink)}: column {c.name}", "has the name of a column the ledger adds to "
                        f"the sink's staging table ({', '.join(STAGING_OWN)}): rename it, in the table and in "
                        "what the transform writes")
                for c in columns if c.name in STAGING_OWN]
    mode = sink.strategy
    problems += [Problem(f"{table_subject(sink)}: column {c}", f"is missing: the {sink.mode} mode needs it",
                         ddl.add_column(config, sink, c))
                 for c in sorted(mode.required_columns(sink) - {c.name for c in columns})]
    if mode.unique_columns(sink) and mode.unique_columns(sink) not in unique:
        problems.append(Problem(table_subject(sink), f"has no unique index or constraint on exactly "
                                                     f"{sorted(mode.unique_columns(sink))}, which the {sink.mode} "
                                                     "mode merges on", ddl.add_unique(sink)))
    return problems


def order_problems(cur, config: PipelineConfig) -> list[Problem]:
    """A sink whose final table has a foreign key to the table of a sink listed after it: the
    commit promotes the sinks in their order (and a trial checks even a deferred key after
    each sink), so the key would not see the checkpoint's new rows there, and each record
    naming a new key would fail it (isolation would then dead-letter them all, or give up)."""
    problems = []
    for index, sink in enumerate(config.sinks):
        for later in config.sinks[index + 1:]:
            cur.execute(Q["references_table"], {"table": final_table(sink).as_string(cur),
                                                "referenced": final_table(later).as_string(cur)})
            if cur.fetchone()[0]:
                problems.append(Problem(table_subject(sink), f"has a foreign key to the table of sink {later.name!r}, "
                                                             f"which is listed after it: list {later.name!r} first "
                                                             "(the commit promotes the sinks in their order)"))
    return problems


def final_columns(rows: LedgerRows) -> dict[str, list[ColumnType]]:
    """Each sink's final table columns with their types, in table order (what its staging
    rows carry, and what the row checks check). SinkTableError if a table is gone."""
    found = {sink.name: column_types(rows.cur, final_table(sink)) for sink in rows.config.sinks}
    missing = [sink.table for sink in rows.config.sinks if not found[sink.name]]
    if missing:
        raise SinkTableError(f"pipeline {rows.config.name!r}: final table(s) {missing} do not exist")
    return found
