"""The demo pipeline's oracle (what its three tables must hold, computed from the
committed records of the topic) and the ledger and table readings the DAG tests compare."""

from __future__ import annotations

import json
from collections import defaultdict
from contextlib import closing
from datetime import datetime
from decimal import Decimal

import psycopg2
from confluent_kafka import Consumer, TopicPartition

from demo.orders import PARTITIONS, TOPIC


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


def attempts(db_url: str) -> int:
    with closing(psycopg2.connect(db_url)) as conn, conn.cursor() as cur:
        cur.execute("SELECT count(*) FROM exactly_once.attempts a JOIN exactly_once.checkpoints c "
                    "ON c.id = a.checkpoint_id WHERE c.pipeline = 'orders'")
        return cur.fetchone()[0]


def checkpoints(db_url: str) -> list[tuple]:
    with closing(psycopg2.connect(db_url)) as conn, conn.cursor() as cur:
        cur.execute("SELECT id, dag_run_id, state::text, records FROM exactly_once.checkpoints "
                    "WHERE pipeline = 'orders' ORDER BY id")
        return cur.fetchall()


def assert_tables_equal_the_oracle(db_url: str, servers: str) -> dict[str, set]:
    """Returns the tables, once they equal what the topic's committed records say."""
    expected, actual = oracle(committed_orders(servers)), tables(db_url)
    for name in expected:
        assert actual[name] == expected[name], f"{name}: lost {len(expected[name] - actual[name])}, " \
                                               f"unexpected {len(actual[name] - expected[name])}"
    return actual
