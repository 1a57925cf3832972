"""Copies of the demo pipeline that the benchmarks run, each on a topic, ledger name and
schemas of its own, created fresh and removed afterwards (a 5 M run leaves gigabytes)."""

from __future__ import annotations

import time
from contextlib import closing

import psycopg2
from confluent_kafka.admin import AdminClient, NewTopic
from psycopg2 import sql

from exactly_once.config import PipelineConfig
from exactly_once.ledger.tables import contributions_table, staging_table
from exactly_once.sqlfiles import named
from exactly_once_demo.prepare import create_tables

Q = named("benchmarks.sql")


def execute(db_url: str, statement: str, params: dict | None = None, **identifiers) -> list[tuple]:
    """One statement of sql/benchmarks.sql, its {identifiers} filled in, in its own transaction."""
    with closing(psycopg2.connect(db_url)) as conn, conn, conn.cursor() as cur:
        cur.execute(sql.SQL(statement).format(**identifiers), params)
        return cur.fetchall() if cur.description else []


def delete_topic(servers: str, topic: str) -> None:
    admin = AdminClient({"bootstrap.servers": servers})
    if topic in admin.list_topics(timeout=30).topics:
        admin.delete_topics([topic])[topic].result(timeout=60)
        while topic in admin.list_topics(timeout=30).topics:
            time.sleep(0.2)


def create_topic(servers: str, topic: str, partitions: int) -> None:
    """A new topic of `partitions` partitions (the demo's producer would make one of 3), once
    the broker's metadata shows it, each partition with its leader (a client asking sooner
    may not see it yet, and try to create it again)."""
    admin = AdminClient({"bootstrap.servers": servers})
    admin.create_topics([NewTopic(topic, partitions, 1)])[topic].result(timeout=60)
    deadline = time.monotonic() + 60
    while True:
        shown = admin.list_topics(timeout=30).topics.get(topic)
        if shown is not None and shown.error is None and len(shown.partitions) == partitions \
                and all(p.leader >= 0 for p in shown.partitions.values()):
            return
        if time.monotonic() > deadline:
            raise TimeoutError(f"topic {topic!r}: not in the broker's metadata with {partitions} partitions after 60 s")
        time.sleep(0.2)


def remove(servers: str, db_url: str, config: PipelineConfig, schemas: list[str]) -> None:
    """The pipeline's topics, and what `forget` removes."""
    for topic in config.source.topics:
        delete_topic(servers, topic)
    forget(db_url, config, schemas)


def forget(db_url: str, config: PipelineConfig, schemas: list[str]) -> None:
    """The pipeline's ledger rows, staging and contributions tables, and the schemas."""
    execute(db_url, Q["forget_pipeline"], {"pipeline": config.name})
    for sink in config.sinks:
        execute(db_url, Q["drop_table"], table=staging_table(config, sink.name))
        execute(db_url, Q["drop_table"], table=contributions_table(config, sink))
    for schema in schemas:
        execute(db_url, Q["drop_schema"], schema=sql.Identifier(schema))


def create_demo_tables(db_url: str, schema: str) -> None:
    with closing(psycopg2.connect(db_url)) as conn:
        create_tables(conn, schema)
