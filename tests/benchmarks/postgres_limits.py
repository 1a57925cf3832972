"""The PostgreSQL limits a checkpoint's staging write and commit are compared with, on the
server alone: binary `COPY` of the checkpoint's staged rows (saved to files between its
pre-commit and its commit) into bare tables (no index) and into tables like staging (its
index), and a bare `INSERT … SELECT` of every sink's rows from the bare tables into tables
with the final tables' indexes."""

from __future__ import annotations

from contextlib import closing
from dataclasses import dataclass
from pathlib import Path

import psycopg2
from psycopg2 import sql

from exactly_once.config import PipelineConfig
from exactly_once.ledger.protocol import Ledger
from exactly_once.ledger.tables import final_table, staging_tables
from exactly_once.sinks._keyed import Keyed
from tests.benchmarks import copies
from tests.benchmarks.copies import Q
from tests.benchmarks.stopwatch import Stopwatch


@dataclass(frozen=True)
class Limits:
    copy_bare: float            # seconds: COPY of the staged rows from files into tables without an index
    copy_like_staging: float    # the same into tables like staging
    insert_select: float        # INSERT … SELECT of every sink's rows from the bare copies


def save_staging(db_url: str, config: PipelineConfig, checkpoint_id: int, folder: Path) -> dict[str, int]:
    """Each staging table's rows of the checkpoint into a file of `folder` (between pre-commit
    and commit, untimed): what the COPY limit loads. Rows per table."""
    rows = {}
    with closing(psycopg2.connect(db_url)) as conn, conn.cursor() as cur:
        for name, table in staging_tables(config).items():
            with (folder / f"staged-{name}.copy").open("wb") as out:
                cur.copy_expert(sql.SQL(Q["copy_out"]).format(
                    staging=table, checkpoint_id=sql.Literal(checkpoint_id)).as_string(cur), out)
            rows[name] = cur.rowcount
    return rows


def measure(db_url: str, ledger: Ledger, folder: Path, schema: str) -> Limits:
    """The limits, from the files `save_staging` wrote into `folder`, in tables of `schema`."""
    config = ledger.config
    tables = staging_tables(config)
    created_by = {"bare": "create_bare_like", "like_staging": "create_like_staging"}
    seconds = dict.fromkeys(created_by, 0.0)
    for shape, create in created_by.items():
        for name, staging in tables.items():
            table = sql.Identifier(schema, f"{shape}_{name.strip('_')}")
            copies.execute(db_url, Q[create], table=table, staging=staging)
            with closing(psycopg2.connect(db_url)) as conn, conn.cursor() as cur, \
                    (folder / f"staged-{name}.copy").open("rb") as source, Stopwatch() as loaded:
                cur.copy_expert(sql.SQL(Q["copy_in"]).format(table=table).as_string(cur), source)
                conn.commit()
            seconds[shape] += loaded.seconds
    insert_select = 0.0
    columns = ledger.final_columns()
    for sink in config.sinks:
        target = sql.Identifier(schema, f"final_{sink.name}")
        copies.execute(db_url, Q["create_like_final"], table=target, final=final_table(sink))
        names = [c.name for c in columns[sink.name]]
        source = sql.Identifier(schema, f"bare_{sink.name}")
        statement = {"table": target, "columns": sql.SQL(", ").join(map(sql.Identifier, names))}
        if isinstance(sink.strategy, Keyed):
            statement |= {"folded": sink.strategy.folded(sink, source, sql.SQL("true"),
                                                         [*names, *sink.strategy.marks(sink)])}
        with Stopwatch() as inserted:
            copies.execute(db_url, Q["insert_folded" if "folded" in statement else "insert_select"],
                           source=source, **statement)
        insert_select += inserted.seconds
    return Limits(seconds["bare"], seconds["like_staging"], insert_select)
