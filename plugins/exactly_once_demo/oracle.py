"""The demo pipeline's oracle: what its three tables and its dead letters must hold,
computed from the committed records of its topic, and the comparison with what
they hold, to the row, counting lost, duplicated and wrong rows apart. The
DAG tests use it on the demo itself; the fault matrix on copies of the demo
(their own pipeline name, topic and schema)."""

from __future__ import annotations

import json
import time
from collections import Counter, defaultdict
from collections.abc import Callable
from contextlib import closing
from dataclasses import dataclass, field
from datetime import datetime
from decimal import Decimal

import psycopg2
from confluent_kafka import Consumer, KafkaException, TopicPartition
from psycopg2 import sql

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
        orders.add((*row, m.topic(), m.partition(), m.offset()))
        group = totals[(row[4].replace(second=0, microsecond=0), row[1])]
        group[0] += 1
        group[1] += row[2]
        group[2] += row[2] * row[3]
        if row[1] not in last or (m.offset(), m.partition()) > last[row[1]][3:]:
            last[row[1]] = (row[1], row[3], row[4], m.offset(), m.partition())
    return {"orders": orders, "totals": {(*k, *v) for k, v in totals.items()},
            "last": {(s, p, t) for s, p, t, _, _ in last.values()}, "dead": dead}


_READINGS = {
    "orders": "SELECT order_id, sku, qty, price, ts, kafka_topic, kafka_partition, kafka_offset FROM {schema}.orders",
    "totals": "SELECT minute, sku, orders, qty, revenue FROM {schema}.sku_minute_totals",
    "last": "SELECT sku, price, ts FROM {schema}.sku_last_price",
    "dead": 'SELECT partition, "offset" FROM exactly_once.dead_letters WHERE pipeline = %(pipeline)s',
}


def rows(db_url: str, schema: str = "demo", pipeline: str = "orders") -> dict[str, list]:
    """Every row of each table, duplicates kept."""
    with closing(psycopg2.connect(db_url)) as conn, conn.cursor() as cur:
        out = {}
        for name, query in _READINGS.items():
            cur.execute(sql.SQL(query).format(schema=sql.Identifier(schema)), {"pipeline": pipeline})
            out[name] = cur.fetchall()
    return out


def tables(db_url: str, schema: str = "demo", pipeline: str = "orders") -> dict[str, set]:
    return {name: set(found) for name, found in rows(db_url, schema, pipeline).items()}


# Each table's key: one row per key is expected. `totals` counts records in its `orders` column.
_KEYS = {"orders": lambda r: r[5:8], "totals": lambda r: r[:2], "last": lambda r: r[0], "dead": lambda r: r}


@dataclass
class Comparison:
    """Per table: lost (expected, absent or short), duplicated (counted more than once)
    and wrong (present but different, or not expected at all). Rows for the tables with a
    row per record or per key; records for `totals`, whose `orders` column counts them."""

    lost: Counter = field(default_factory=Counter)
    duplicated: Counter = field(default_factory=Counter)
    wrong: Counter = field(default_factory=Counter)
    examples: list[str] = field(default_factory=list)

    @property
    def exact(self) -> bool:
        return not (+self.lost or +self.duplicated or +self.wrong)

    def _note(self, kind: Counter, table: str, n: int, example: str) -> None:
        kind[table] += n
        if len(self.examples) < 5:
            self.examples.append(f"{table}: {example}")


def compare(expected: dict[str, set], actual: dict[str, list]) -> Comparison:
    result = Comparison()
    for table, key in _KEYS.items():
        wanted = {key(r): r for r in expected[table]}
        found = defaultdict(list)
        for r in actual[table]:
            found[key(r)].append(r)
        for k in wanted.keys() | found.keys():
            want, got = wanted.get(k), found.get(k, [])
            if table == "totals" and want and got:  # an aggregate: more records counted is duplication
                counted = got[0][2]
                if counted > want[2]:
                    result._note(result.duplicated, table, counted - want[2], f"{k} counts {counted} of {want[2]}")
                elif counted < want[2]:
                    result._note(result.lost, table, want[2] - counted, f"{k} counts {counted} of {want[2]}")
                elif got[0] != want:
                    result._note(result.wrong, table, 1, f"{got[0]} instead of {want}")
            elif want is None:
                result._note(result.wrong, table, len(got), f"unexpected {got[0]}")
            elif not got:
                result._note(result.lost, table, want[2] if table == "totals" else 1, f"missing {want}")
            elif got[0] != want:
                result._note(result.wrong, table, 1, f"{got[0]} instead of {want}")
            if len(got) > 1:
                result._note(result.duplicated, table, len(got) - 1, f"{k} {len(got)} times")
    return result


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


def assert_tables_equal_the_oracle(db_url: str, servers: str) -> dict[str, set]:
    """Returns the demo's tables, once they equal what the topic's committed records say."""
    found = rows(db_url)
    comparison = compare(oracle(committed_orders(servers)), found)
    assert comparison.exact, (f"lost {dict(comparison.lost)}, duplicated {dict(comparison.duplicated)}, "
                              f"wrong {dict(comparison.wrong)}: {comparison.examples}")
    return {name: set(r) for name, r in found.items()}
