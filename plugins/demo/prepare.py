"""Creates what the demo pipeline needs before its first run: the `orders` topic and the
tables of `sql/demo/tables.sql` (idempotent).

    python -m demo.prepare      (reads KAFKA_BOOTSTRAP_SERVERS and PIPELINE_DB_URL)
"""

from __future__ import annotations

from contextlib import closing

from psycopg2 import sql

from demo.produce import ensure_topic
from exactly_once import db
from exactly_once.kafka_offsets import bootstrap_servers
from exactly_once.sqlfiles import text


def create_tables(conn, schema: str = "demo") -> None:
    with conn, conn.cursor() as cur:
        cur.execute(sql.SQL(text("demo/tables.sql")).format(schema=sql.Identifier(schema)))


def main() -> None:
    ensure_topic(bootstrap_servers())
    with closing(db.connect()) as conn:
        create_tables(conn)
    print("demo topic and tables ready")


if __name__ == "__main__":
    main()
