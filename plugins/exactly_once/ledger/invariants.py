"""The ledger's invariants, checked in SQL (sql/invariants.sql): no offset committed
twice, committed ranges contiguous from the start, no planned offset stranded, no
pre-committed checkpoint left behind by a later run's recovery, no staging rows
left behind. Meaningful when no run is between its steps."""

from __future__ import annotations

from psycopg2 import sql

from exactly_once.config import PipelineConfig
from exactly_once.ledger.tables import staging_tables
from exactly_once.sqlfiles import named

Q = named("invariants.sql")
PER_STAGING_TABLE = "staging_left_behind"


def violations(conn, config: PipelineConfig) -> list[str]:
    """One line per violation, prefixed with the invariant's name; empty if all hold."""
    found = []
    with conn.cursor() as cur:
        for name, statement in Q.items():
            if name == PER_STAGING_TABLE:
                continue
            cur.execute(statement, {"pipeline": config.name})
            found += [f"{name}: {line}" for line, in cur.fetchall()]
        for sink, table in staging_tables(config).items():
            cur.execute(sql.SQL(Q[PER_STAGING_TABLE]).format(staging=table), {"pipeline": config.name, "sink": sink})
            found += [f"{PER_STAGING_TABLE}: {line}" for line, in cur.fetchall()]
    conn.rollback()
    return found
