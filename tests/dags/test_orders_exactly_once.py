"""The demo DAG through `airflow dags test` on real Airflow (PostgreSQL metadata DB),
Kafka, Spark and PostgreSQL: the three demo tables equal the oracle, to the row."""

from __future__ import annotations

import json
import subprocess
import time
from collections import defaultdict
from contextlib import closing
from datetime import datetime, timezone
from decimal import Decimal
from pathlib import Path

import psycopg2
import pytest
from confluent_kafka import Consumer, TopicPartition
from confluent_kafka.admin import AdminClient

from demo.orders import CONFIG, PARTITIONS, TOPIC
from demo.produce import produce
from stack.settings import process_environment

ROOT = Path(__file__).resolve().parents[2]
LEDGER_TABLES = ("committed_ranges", "gaps", "dead_letters", "checkpoint_ranges")


@pytest.fixture
def fresh_demo(ledger_db, kafka_servers):
    """No demo topic, tables or ledger rows left from an earlier test or demo."""
    admin = AdminClient({"bootstrap.servers": kafka_servers})
    if TOPIC in admin.list_topics(timeout=30).topics:
        admin.delete_topics([TOPIC])[TOPIC].result(timeout=30)
        while TOPIC in admin.list_topics(timeout=30).topics:
            time.sleep(0.2)
    with closing(psycopg2.connect(ledger_db)) as conn, conn, conn.cursor() as cur:
        cur.execute("DROP SCHEMA IF EXISTS demo CASCADE")
        for table in LEDGER_TABLES:
            cur.execute(f"DELETE FROM exactly_once.{table} WHERE pipeline = %s", (CONFIG.name,))
        cur.execute("DELETE FROM exactly_once.attempts WHERE checkpoint_id IN "
                    "(SELECT id FROM exactly_once.checkpoints WHERE pipeline = %s)", (CONFIG.name,))
        for table in ("checkpoints", "partitions"):
            cur.execute(f"DELETE FROM exactly_once.{table} WHERE pipeline = %s", (CONFIG.name,))
        cur.execute((ROOT / "sql" / "demo" / "tables.sql").read_text())
    return ledger_db


def dags_test(logical_date: datetime, **env) -> subprocess.CompletedProcess:
    return subprocess.run(["airflow", "dags", "test", "orders_exactly_once", logical_date.isoformat()],
                          env={**process_environment(), **env}, capture_output=True, text=True, timeout=600,
                          cwd=ROOT)


def committed_orders(servers: str) -> list:
    consumer = Consumer({"bootstrap.servers": servers, "group.id": "oracle", "isolation.level": "read_committed",
                         "enable.auto.commit": False})
    ends = {p: consumer.get_watermark_offsets(TopicPartition(TOPIC, p), timeout=10)[1] for p in range(PARTITIONS)}
    consumer.assign([TopicPartition(TOPIC, p, 0) for p in range(PARTITIONS)])
    records = []
    while any(consumer.position([TopicPartition(TOPIC, p)])[0].offset < end for p, end in ends.items() if end):
        msg = consumer.poll(1)
        if msg is not None and msg.error() is None:
            records.append(msg)
    consumer.close()
    return records


def oracle(records) -> dict[str, set]:
    orders, totals, last, dead = set(), defaultdict(lambda: [0, 0, Decimal(0)]), {}, set()
    for m in records:
        try:
            v = json.loads(m.value())
            row = (v["order_id"], v["sku"], int(v["qty"]), Decimal(str(v["price"])),
                   datetime.fromisoformat(v["ts"].replace("Z", "+00:00")))
        except (ValueError, KeyError, TypeError):
            dead.add((m.partition(), m.offset()))
            continue
        orders.add((*row, TOPIC, m.partition(), m.offset()))
        group = totals[(row[4].replace(second=0, microsecond=0), row[1])]
        group[0] += 1
        group[1] += row[2]
        group[2] += row[2] * row[3]
        if row[1] not in last or (m.offset(), m.partition()) > last[row[1]][3:]:
            last[row[1]] = (row[1], row[3], row[4], m.offset(), m.partition())
    return {"orders": orders, "totals": {(*k, *v) for k, v in totals.items()},
            "last": {(s, p, t) for s, p, t, _, _ in last.values()}, "dead": dead}


def tables(db_url: str) -> dict[str, set]:
    with closing(psycopg2.connect(db_url)) as conn, conn.cursor() as cur:
        out = {}
        for name, query in (
                ("orders", "SELECT order_id, sku, qty, price, ts, kafka_topic, kafka_partition, kafka_offset "
                           "FROM demo.orders"),
                ("totals", "SELECT minute, sku, orders, qty, revenue FROM demo.sku_minute_totals"),
                ("last", "SELECT sku, price, ts FROM demo.sku_last_price"),
                ("dead", "SELECT partition, \"offset\" FROM exactly_once.dead_letters WHERE pipeline = 'orders'")):
            cur.execute(query)
            out[name] = set(cur.fetchall())
    return out


def test_consecutive_intervals_equal_the_oracle_and_the_commit_fault_is_retried(fresh_demo, kafka_servers):
    interval_ends = []
    for _ in range(3):  # each interval ends after its batch: the next run takes the next batch
        produce(kafka_servers, 500)
        time.sleep(0.01)
        interval_ends.append(datetime.now(timezone.utc))
    for i, end in enumerate(interval_ends):
        faults = {"EXACTLY_ONCE_FAULTS": "commit_task.try1=raise"} if i == 1 else {}
        run = dags_test(end, **faults)
        assert run.returncode == 0, run.stdout[-4000:] + run.stderr[-4000:]
        if faults:
            assert "fault injected at commit_task.try1" in run.stdout + run.stderr
    expected, actual = oracle(committed_orders(kafka_servers)), tables(fresh_demo)
    for name in expected:
        assert actual[name] == expected[name], f"{name}: lost {len(expected[name] - actual[name])}, " \
                                               f"unexpected {len(actual[name] - expected[name])}"
    with closing(psycopg2.connect(fresh_demo)) as conn, conn.cursor() as cur:
        cur.execute("SELECT state::text, records FROM exactly_once.checkpoints WHERE pipeline = 'orders' ORDER BY id")
        history = cur.fetchall()
    assert [state for state, _ in history] == ["committed"] * 3 and all(records for _, records in history)
