"""A real source table in the stack's `source` database, captured by a Debezium connector of
its own in the stack's Kafka Connect worker (exactly_once_stack.connect), and a writer that
changes its rows from another thread (inserts, updates, deletes, key updates, transactions of
many rows) while the connector takes its snapshot and streams."""

from __future__ import annotations

import json
import random
import threading
import time
import uuid
from contextlib import closing

import psycopg2
from psycopg2 import sql

from exactly_once_stack import connect, postgres
from exactly_once_stack.settings import db_url
from tests.kafka_records import Consumed, committed_records

COLUMNS = "id int PRIMARY KEY, name varchar(20) NOT NULL, qty int NOT NULL"


class CapturedTable:
    """Schema cdc_<id> of `source` with table `items`, its publication, and a connector (with its
    slot) writing its change events to topic `<connector>.<schema>.items`."""

    def __init__(self, rows: int, servers: str):
        self.servers = servers
        self.name = f"cdc_{uuid.uuid4().hex[:10]}"
        self.table = sql.Identifier(self.name, "items")
        self.topic = f"{self.name}.{self.name}.items"
        self.connector = connect.connector_config(self.name, tables=rf"{self.name}\.items", publication=self.name,
                                                  slot=self.name, topic_prefix=self.name)
        with closing(psycopg2.connect(db_url("source"))) as conn, conn, conn.cursor() as cur:
            cur.execute(sql.SQL("CREATE SCHEMA {s}; GRANT USAGE ON SCHEMA {s} TO {capture}; "
                                "CREATE TABLE {t} (" + COLUMNS + "); GRANT SELECT ON {t} TO {capture}; "
                                "INSERT INTO {t} SELECT i, 'item ' || i, i FROM generate_series(1, %s) i")
                        .format(s=sql.Identifier(self.name), t=self.table,
                                capture=sql.Identifier(postgres.CAPTURE_ROLE)), (rows,))
        with closing(postgres.connect_admin("source")) as conn, conn, conn.cursor() as cur:
            cur.execute(sql.SQL("CREATE PUBLICATION {} FOR TABLE {}").format(sql.Identifier(self.name), self.table))
        self.next_id = rows + 1

    def rows(self) -> set[tuple]:
        with closing(psycopg2.connect(db_url("source"))) as conn, conn.cursor() as cur:
            cur.execute(sql.SQL("SELECT id, name, qty FROM {}").format(self.table))
            return set(cur.fetchall())

    def execute(self, statement: str, *args) -> None:
        with closing(psycopg2.connect(db_url("source"))) as conn, conn, conn.cursor() as cur:
            cur.execute(sql.SQL(statement).format(t=self.table), args or None)

    def records(self) -> list[Consumed]:
        return committed_records(self.servers, self.topic)

    def wait_for(self, found, timeout: float = 120) -> list[Consumed]:
        """The topic's records once `found(events)` holds of the decoded change events."""
        deadline = time.monotonic() + timeout
        while True:
            try:
                records = self.records()
                if found([json.loads(r.value) for r in records if r.value]):
                    return records
            except KeyError:  # the connector has not made the topic yet
                pass
            if time.monotonic() > deadline:
                raise TimeoutError(f"{self.topic}: the change events awaited did not come in {timeout:.0f} s")
            time.sleep(1)

    def mark(self, id: int) -> list[Consumed]:
        """Inserts row `id` and waits until its event is in the topic: every change committed
        before it is there too (Debezium streams in commit order)."""
        self.execute("INSERT INTO {t} VALUES (%s, 'mark', 0)", id)
        return self.wait_for(lambda events: any(e["op"] == "c" and e["after"]["id"] == id for e in events))

    def drop(self) -> None:
        """The connector, its slot, the publication and the schema: each tried whatever the one
        before did (a killed worker cannot remove its connector; the slot goes all the same)."""
        try:
            connect.remove_connector(self.name, self.name)
        finally:
            with closing(postgres.connect_admin("source")) as conn, conn, conn.cursor() as cur:
                cur.execute("SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots "
                            "WHERE slot_name = %s AND NOT active", (self.name,))
                cur.execute(sql.SQL("DROP PUBLICATION IF EXISTS {p}; DROP SCHEMA {s} CASCADE").format(
                    p=sql.Identifier(self.name), s=sql.Identifier(self.name)))


class Writer(threading.Thread):
    """Changes the table's rows in small transactions until stopped: updates, inserts,
    deletes, key updates and now and then a transaction of 30 changes; `commits` holds the
    time of each commit (epoch milliseconds, as Debezium's `ts_ms`)."""

    def __init__(self, table: CapturedTable, ids: range, seed: int = 3):
        super().__init__(daemon=True)
        self.table, self.ids, self.random = table, set(ids), random.Random(seed)
        self.commits: list[float] = []
        self.stopping = threading.Event()
        self.error: BaseException | None = None

    def _change(self, cur) -> None:
        roll, t = self.random.random(), self.table.table
        if roll < 0.15 or len(self.ids) < 100:
            new = self.table.next_id
            self.table.next_id += 1
            cur.execute(sql.SQL("INSERT INTO {} VALUES (%s, %s, %s)").format(t), (new, f"new {new}", new % 13))
            self.ids.add(new)
            return
        id = self.random.choice(sorted(self.ids))
        if roll < 0.25:
            cur.execute(sql.SQL("DELETE FROM {} WHERE id = %s").format(t), (id,))
            self.ids.discard(id)
        elif roll < 0.3:
            new = self.table.next_id
            self.table.next_id += 1
            cur.execute(sql.SQL("UPDATE {} SET id = %s WHERE id = %s").format(t), (new, id))
            self.ids.discard(id)
            self.ids.add(new)
        else:
            cur.execute(sql.SQL("UPDATE {} SET qty = qty + 1, name = %s WHERE id = %s").format(t),
                        (f"changed {self.random.randrange(10**6)}", id))

    def run(self) -> None:
        try:
            with closing(psycopg2.connect(db_url("source"))) as conn, conn.cursor() as cur:
                while not self.stopping.is_set():
                    for _ in range(30 if self.random.random() < 0.05 else 1):
                        self._change(cur)
                    conn.commit()
                    self.commits.append(time.time() * 1000)
                    time.sleep(0.01)
        except BaseException as error:  # noqa: BLE001 - re-raised by stop() in the test's thread
            self.error = error

    def stop(self) -> None:
        """Stops it (also after a failure elsewhere: the test's `finally`); its error, if any, raised."""
        self.stopping.set()
        self.join(60)
        if self.error is not None:
            raise self.error
        assert not self.is_alive()

    def commits_between(self, start: float, end: float) -> int:
        return sum(start <= c <= end for c in self.commits)
