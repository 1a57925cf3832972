"""Applies sql/migrations/*.sql in order, each once, recorded in exactly_once.schema_migrations.

    python -m exactly_once.ledger.migrate      (the database of the Airflow connection pipeline_db)
"""

from __future__ import annotations

from contextlib import closing

from exactly_once import connections
from exactly_once.sqlfiles import SQL_DIR, text


def migrate(connection) -> list[str]:
    """Applies pending migrations in one transaction; returns the versions applied."""
    applied_now = []
    with connection, connection.cursor() as cur:
        # Concurrent migrators (parallel DAG runs) wait here instead of racing.
        cur.execute("SELECT pg_catalog.pg_advisory_xact_lock(pg_catalog.hashtextextended('exactly_once:migrate', 0))")
        cur.execute("CREATE SCHEMA IF NOT EXISTS exactly_once")
        cur.execute("CREATE TABLE IF NOT EXISTS exactly_once.schema_migrations "
                    "(version text PRIMARY KEY, applied_at timestamptz NOT NULL DEFAULT now())")
        cur.execute("SELECT version FROM exactly_once.schema_migrations")
        done = {row[0] for row in cur.fetchall()}
        for path in sorted((SQL_DIR / "migrations").glob("*.sql")):
            if path.stem not in done:
                cur.execute(text(f"migrations/{path.name}"))
                cur.execute("INSERT INTO exactly_once.schema_migrations (version) VALUES (%s)", (path.stem,))
                applied_now.append(path.stem)
    return applied_now


def migrate_through(connect) -> list[str]:
    """`migrate` on a connection of its own: what every task and operator command runs first,
    so that a step of an upgraded library never meets a ledger shaped by the release before."""
    with closing(connect()) as connection:
        return migrate(connection)


def pending(connection) -> list[str]:
    """The migrations not applied yet (all of them for a database never migrated)."""
    with connection.cursor() as cur:
        cur.execute("SELECT to_regclass('exactly_once.schema_migrations') IS NOT NULL")
        [ledger_exists] = cur.fetchone()
        done = set()
        if ledger_exists:
            cur.execute("SELECT version FROM exactly_once.schema_migrations")
            done = {row[0] for row in cur.fetchall()}
    connection.rollback()
    return [path.stem for path in sorted((SQL_DIR / "migrations").glob("*.sql")) if path.stem not in done]


def main() -> None:
    with closing(connections.for_command_line(connections.connector)()) as connection:
        applied = migrate(connection)
    print("applied: " + (", ".join(applied) if applied else "nothing (up to date)"))


if __name__ == "__main__":
    main()
