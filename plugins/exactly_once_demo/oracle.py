"""The demo pipeline's part of the oracle: the committed records of its topic
(`committed_orders`) and the row each becomes in Python (`order_row`). The one oracle
(tests/oracle.py) computes from them what the demo's tables and dead letters must hold
and compares, to the row; tests/exactly_once_demo/oracle.py joins the two for the DAG
tests (the demo itself), the fault matrix and the benchmarks (copies of the demo, with a
pipeline name, topic and schema of their own). The one oracle is a test utility and
plugins/ is deployed without tests/, so this module does not import it."""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from contextlib import closing
from datetime import datetime
from decimal import Decimal

import psycopg2
from confluent_kafka import Consumer, KafkaException, TopicPartition

from exactly_once_demo.pipeline import TOPIC


def committed_orders(servers: str, topic: str = TOPIC, start: dict[int, int] | None = None, timeout: float = 60,
                     clock: Callable[[], float] = time.monotonic) -> list:
    """The committed records of the topic (read_committed) in every partition the broker
    lists, from `start` per partition or the beginning, up to each partition's last
    stable offset when called. Raises TimeoutError, naming each partition's position and
    end, when they are not all read within `timeout` seconds."""
    consumer = Consumer({"bootstrap.servers": servers, "group.id": "oracle", "isolation.level": "read_committed",
                         "enable.auto.commit": False})
    try:
        start = start or {}
        metadata = consumer.list_topics(topic, timeout=10).topics[topic]
        if metadata.error is not None:
            raise KafkaException(metadata.error)
        ends = {p: consumer.get_watermark_offsets(TopicPartition(topic, p), timeout=10)[1]
                for p in sorted(metadata.partitions)}
        wanted = {p: end for p, end in ends.items() if end > start.get(p, 0)}
        consumer.assign([TopicPartition(topic, p, start.get(p, 0)) for p in wanted])
        deadline = clock() + timeout
        records = []
        while behind := _behind(consumer, topic, wanted, start):
            if clock() >= deadline:
                raise TimeoutError(f"{topic}: committed records not all read within {timeout:g} s: " + ", ".join(
                    f"partition {p} at offset {at} of {end}" for p, (at, end) in sorted(behind.items())))
            msg = consumer.poll(1)
            if msg is not None and msg.error() is None:
                records.append(msg)
        return records
    finally:
        consumer.close()


def _behind(consumer: Consumer, topic: str, ends: dict[int, int], start: dict[int, int]) -> dict[int, tuple[int, int]]:
    """Partition -> (position, end) for the partitions not read up to their end yet."""
    positions = consumer.position([TopicPartition(topic, p) for p in ends])
    at = {tp.partition: tp.offset if tp.offset >= 0 else start.get(tp.partition, 0) for tp in positions}
    return {p: (at[p], end) for p, end in ends.items() if at[p] < end}


# The JSON types that fit each field of pipeline.py's value schema (a bool is no number).
_FITS = {"order_id": (str,), "sku": (str,), "qty": (int,), "price": (int, float), "ts": (str,)}


def parsed_order(record) -> dict | None:
    """The demo's parse in Python: the order a record (`.value`, the value's bytes) holds,
    or None when it is no order (a dead letter whatever the transform): every field of the
    value schema is required and must fit its type."""
    try:
        v = json.loads(record.value)
        if not all(type(v[f]) in types for f, types in _FITS.items()):
            return None
        return {"order_id": v["order_id"], "sku": v["sku"], "qty": v["qty"], "price": Decimal(str(v["price"])),
                "ts": datetime.fromisoformat(v["ts"].replace("Z", "+00:00"))}
    except (ValueError, KeyError, TypeError, AttributeError):
        return None


def has_nul(order: dict) -> bool:
    """Whether a text of the order holds a NUL: its rows are refused (PostgreSQL text cannot hold one)."""
    return any("\x00" in value for value in order.values() if isinstance(value, str))


def order_row(record) -> dict | None:
    """The demo's parse and transform in Python, for the oracle (tests/oracle.py): the row
    a record becomes, or None for a dead letter (no order, or a NUL in its text); `prepare`
    adds the minute (ts truncated to the minute) and revenue (qty * price)."""
    row = parsed_order(record)
    if row is None or has_nul(row):
        return None
    return {**row, "minute": row["ts"].replace(second=0, microsecond=0), "revenue": row["qty"] * row["price"]}


def attempts(db_url: str, pipeline: str = "orders") -> int:
    with closing(psycopg2.connect(db_url)) as conn, conn.cursor() as cur:
        cur.execute("SELECT count(*) FROM exactly_once.attempts a JOIN exactly_once.checkpoints c "
                    "ON c.id = a.checkpoint_id WHERE c.pipeline = %s", (pipeline,))
        return cur.fetchone()[0]


def checkpoints(db_url: str, pipeline: str = "orders") -> list[tuple]:
    with closing(psycopg2.connect(db_url)) as conn, conn.cursor() as cur:
        cur.execute("SELECT id, dag_run_id, state::text, records FROM exactly_once.checkpoints "
                    "WHERE pipeline = %s ORDER BY id", (pipeline,))
        return cur.fetchall()


def reprocessings(db_url: str, pipeline: str = "orders") -> list[tuple]:
    """(checkpoint replayed, the DAG run that asked, state, configuration version of the
    reprocessing's committed attempt, that of the replayed checkpoint's) of each reprocessing."""
    with closing(psycopg2.connect(db_url)) as conn, conn.cursor() as cur:
        cur.execute("SELECT k.replays, k.dag_run_id, k.state::text, a.config_version, o.config_version "
                    "FROM exactly_once.checkpoints k JOIN exactly_once.checkpoints r ON r.id = k.replays "
                    "LEFT JOIN exactly_once.attempts a "
                    "ON a.checkpoint_id = k.id AND a.attempt = k.precommitted_attempt "
                    "LEFT JOIN exactly_once.attempts o "
                    "ON o.checkpoint_id = r.id AND o.attempt = r.precommitted_attempt "
                    "WHERE k.pipeline = %s ORDER BY k.id", (pipeline,))
        return cur.fetchall()


def reprocessed_ranges(db_url: str, pipeline: str = "orders") -> list[tuple[str, int, int, int]]:
    """(topic, partition, from, to) of every checkpoint a reprocessing committed."""
    with closing(psycopg2.connect(db_url)) as conn, conn.cursor() as cur:
        cur.execute("SELECT r.topic, r.partition, r.from_offset, r.to_offset FROM exactly_once.checkpoint_ranges r "
                    "WHERE r.checkpoint_id IN (SELECT replays FROM exactly_once.checkpoints "
                    "WHERE pipeline = %s AND state = 'committed' AND replays IS NOT NULL)", (pipeline,))
        return cur.fetchall()
