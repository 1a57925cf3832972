"""A table's columns as PostgreSQL's catalog describes them (sql/catalog.sql): what staging
rows carry, what the row checks check, what registration compares a staging table with; and
whether a column takes the values of a type (what the preflight and the staging writer ask)."""

from __future__ import annotations

from dataclasses import dataclass

import psycopg2
from psycopg2 import sql

from exactly_once.sqlfiles import named


@dataclass(frozen=True)
class ColumnType:
    name: str
    type: str                  # as PostgreSQL shows it (format_type), for the reasons
    base: str                  # pg_type.typname, a domain's base type: 'varchar', 'int4', ...
    max_length: int | None     # varchar(n), char(n)
    precision: int | None      # numeric(p, s)
    scale: int | None
    not_null: bool


def column_types(cur, table: sql.Identifier) -> list[ColumnType]:
    """The table's columns in order; none when it does not exist."""
    cur.execute(named("catalog.sql")["column_types"], {"table": table.as_string(cur)})
    return [ColumnType(*row) for row in cur.fetchall()]


def refuses_type(cur, table: sql.Composable, column: str, bound: str) -> psycopg2.Error | None:
    """PostgreSQL's error if the column does not take values bound as `bound` (no assignment
    cast, no INSERT privilege, a generated column: SQLSTATE class 42), else None; nothing is
    inserted, and the transaction goes on either way (sql/preflight.sql, "takes"). Any other
    error (a lock timeout, a lost connection) is raised: it says nothing of the column."""
    cur.execute("SAVEPOINT takes")
    try:
        cur.execute(sql.SQL(named("preflight.sql")["takes"]).format(table=table, column=sql.Identifier(column),
                                                                   bound=sql.SQL(bound)))
    except psycopg2.Error as refused:
        if not (refused.pgcode or "").startswith("42"):
            raise
        cur.execute("ROLLBACK TO SAVEPOINT takes")
        return refused
    cur.execute("RELEASE SAVEPOINT takes")
    return None
