"""Creates what the demo pipeline needs before its first run: the `orders` topic, the
`sku_minute_deltas` topic it publishes to, and the tables of tables.sql beside this file (idempotent).

    python -m exactly_once_demo.prepare      (with the Airflow connections kafka_default and pipeline_db)
"""

from __future__ import annotations

from contextlib import closing
from pathlib import Path

from psycopg2 import sql

from exactly_once import connections
from exactly_once_demo.pipeline import DELTAS_TOPIC
from exactly_once_demo.produce import ensure_topic

TABLES = Path(__file__).with_name("tables.sql")


def create_tables(conn, schema: str = "demo") -> None:
    with conn, conn.cursor() as cur:
        cur.execute(sql.SQL(TABLES.read_text()).format(schema=sql.Identifier(schema)))


def main() -> None:
    kafka = connections.for_command_line(connections.kafka_client)
    ensure_topic(kafka)
    ensure_topic(kafka, DELTAS_TOPIC)
    with closing(connections.for_command_line(connections.connector)()) as conn:
        create_tables(conn)
    print("demo topic and tables ready")


if __name__ == "__main__":
    main()
