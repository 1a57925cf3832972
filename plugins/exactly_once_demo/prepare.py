"""Creates what the demo pipeline needs before its first run: the `orders` topic and the
tables of tables.sql beside this file (idempotent).

    python -m exactly_once_demo.prepare      (reads KAFKA_BOOTSTRAP_SERVERS and PIPELINE_DB_URL)
"""

from __future__ import annotations

from contextlib import closing
from pathlib import Path

from psycopg2 import sql

from exactly_once import db
from exactly_once.kafka_offsets import bootstrap_servers
from exactly_once_demo.produce import ensure_topic

TABLES = Path(__file__).with_name("tables.sql")


def create_tables(conn, schema: str = "demo") -> None:
    with conn, conn.cursor() as cur:
        cur.execute(sql.SQL(TABLES.read_text()).format(schema=sql.Identifier(schema)))


def main() -> None:
    ensure_topic(bootstrap_servers())
    with closing(db.connect()) as conn:
        create_tables(conn)
    print("demo topic and tables ready")


if __name__ == "__main__":
    main()
