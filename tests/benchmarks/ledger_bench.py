"""What the ledger benchmarks (`./dev bench-ledger`: ledger_growth.py, staging_bloat.py)
share: a database of their own on the local PostgreSQL (so that a table's size on disk is
this pipeline's alone), the three-sink pipeline of the protocol's tests (an append, an
upsert and an aggregate sink: tests/ledger/harness.py), a clock the benchmark sets, offsets
as Kafka would give them, and one checkpoint through the protocol's own steps — begin,
start_attempt, synthetic staged rows, pre_commit, commit — with no Spark and no Kafka.

Checkpoint g covers offsets [g·R, (g+1)·R) of each of the topic's 3 partitions (R: per
partition), its interval ends at ORIGIN + (g+1)·EVERY; its staged rows are VALUES of g and
of the row's number j (j = 0 is its one dead letter), its keys 10 of KEYS.
"""

from __future__ import annotations

import os
from contextlib import closing, contextmanager
from datetime import datetime, timedelta, timezone

import psycopg2
from psycopg2 import sql

from exactly_once.ledger.checkpoints import Outcome
from exactly_once.ledger.migrate import migrate
from exactly_once.ledger.planning import PartitionOffsets
from exactly_once.ledger.protocol import Ledger
from exactly_once.ledger.tables import staging_table
from exactly_once.sqlfiles import named
from exactly_once_stack.postgres import SOCKETS, connect_admin
from exactly_once_stack.settings import ports
from tests.benchmarks.stopwatch import Stopwatch
from tests.ledger.harness import make_pipeline

Q = named("benchmarks.sql")
ORIGIN = datetime(2025, 1, 1, tzinfo=timezone.utc)
EVERY = timedelta(minutes=5)  # one checkpoint every 5 minutes: 100,000 of them take 347 days
TOPIC = "bench_orders"
PARTITIONS = 3
KEYS = 1000
KEYS_PER_CHECKPOINT = 10
VALUES = {  # a synthetic row's value per column of the sinks' tables
    "id": "'o' || g || '-' || j",
    "k": f"'k' || mod(g * {KEYS_PER_CHECKPOINT} + mod(j, {KEYS_PER_CHECKPOINT}), {KEYS})",
    "n": "j", "kafka_topic": "%(topic)s", "kafka_partition": "mod(j, 3)::int",
    "kafka_offset": "g * %(per_partition)s + j / 3", "records": "1", "total": "j", "smallest": "j",
    "largest": "j", "kafka_tombstone": "false",
}


def dsn(database: str) -> str:
    """The superuser over the server's Unix socket (the stack's admin path): the TLS rules of
    the TCP port admit the stack's own databases only."""
    return f"host={SOCKETS} port={ports()['postgres']} user=postgres dbname={database}"


@contextmanager
def database(kind: str):
    """A new database with the ledger migrated, dropped afterwards; its DSN. Named by kind
    and process, so that two runs never share one."""
    name = f"bench_ledger_{kind}_{os.getpid()}"
    def run(statement: str) -> None:
        with closing(connect_admin()) as admin:
            admin.autocommit = True
            with admin.cursor() as cur:
                cur.execute(sql.SQL(statement).format(sql.Identifier(name)))
    run("DROP DATABASE IF EXISTS {} WITH (FORCE)")
    run("CREATE DATABASE {}")
    try:
        with closing(psycopg2.connect(dsn(name))) as conn:
            migrate(conn)
        yield dsn(name)
    finally:
        run("DROP DATABASE IF EXISTS {} WITH (FORCE)")


def vacuum(ledger: Ledger) -> None:
    """A plain VACUUM (ANALYZE) of the benchmark's database: what autovacuum would have done
    over the simulated time that bulk writes compress into seconds (naptime 60 s: 1,440
    chances a day). It makes dead rows' space reusable; it returns none to the system."""
    with closing(ledger.connect()) as conn:
        conn.autocommit = True
        with conn.cursor() as cur:
            cur.execute("VACUUM (ANALYZE)")


class Clock:
    """What `Ledger.now()` says: set by the benchmark."""

    def __init__(self, at: datetime = ORIGIN):
        self.at = at

    def __call__(self) -> datetime:
        return self.at


class Offsets:
    """Kafka's answer to planning: every partition's stable end at `end`."""

    end = 0

    def offsets(self, topic, partition, interval_start=None, interval_end=None, start_time=None) -> PartitionOffsets:
        return PartitionOffsets(log_start=0, last_stable=self.end)

    def topic_offsets(self, topic, interval_start=None, interval_end=None,
                      start_time=None) -> dict[int, PartitionOffsets]:
        return {p: self.offsets(topic, p) for p in range(PARTITIONS)}


def pipeline(db: str, clock: Clock, **config) -> Ledger:
    """The three-sink pipeline, registered, its keyed sinks' final tables holding every key."""
    ledger = Ledger(make_pipeline(db, TOPIC, **config), lambda: psycopg2.connect(db), clock=clock)
    ledger.register()
    with closing(ledger.connect()) as conn, conn, conn.cursor() as cur:
        for sink in ledger.config.sinks[1:]:
            final = sql.Identifier(*sink.schema_and_table)
            cur.execute(sql.SQL(Q["fill_keys"]).format(final=final, **row_of(cur, ".".join(sink.schema_and_table))),
                        {"keys": KEYS, "topic": TOPIC, "per_partition": 1})
    return ledger


def row_of(cur, table: str) -> dict[str, sql.Composable]:
    """A table's columns (but the ledger's own) and the VALUES that fill them."""
    cur.execute(Q["table_columns"], {"table": table})
    columns = [name for name, in cur.fetchall()]
    return {"columns": sql.SQL(", ").join(map(sql.Identifier, columns)),
            "values": sql.SQL(", ").join(sql.SQL(VALUES[c]) for c in columns)}


def stage(ledger: Ledger, checkpoint_id: int, attempt: int, g: int, per_partition: int) -> dict[str, int]:
    """What the job would stage for checkpoint g: a row per record in every sink's staging
    table, but for its one dead letter; the row counts it reports."""
    config, records = ledger.config, PARTITIONS * per_partition
    params = {"checkpoint_id": checkpoint_id, "attempt": attempt, "g": g, "records": records,
              "per_partition": per_partition, "topic": TOPIC, "pipeline": config.name}
    with closing(ledger.connect()) as conn, conn, conn.cursor() as cur:
        for sink in config.sinks:
            table = staging_table(config, sink.name)
            cur.execute(sql.SQL(Q["stage_rows"]).format(staging=table, **row_of(cur, ".".join(table.strings))),
                        params)
        cur.execute(Q["stage_dead_letter"], params)
    return {**{sink.name: records - 1 for sink in config.sinks}, "_dead_letters": 1}


def checkpoint(ledger: Ledger, clock: Clock, g: int, per_partition: int) -> dict[str, float]:
    """Checkpoint g through the protocol's steps, as its tasks run them; seconds per step."""
    clock.at = ORIGIN + (g + 1) * EVERY
    offsets = Offsets()
    offsets.end = (g + 1) * per_partition
    seconds = {}
    with Stopwatch() as s:
        begun = ledger.begin(f"run:{g}", ORIGIN + g * EVERY, clock.at, offsets)
    seconds["plan"] = s.seconds
    checkpoint_id = begun.checkpoint.id
    assert begun.new and all(r.end - r.start == per_partition for r in begun.checkpoint.ranges), begun
    with Stopwatch() as s:
        attempt = ledger.start_attempt(checkpoint_id).attempt
    seconds["start_attempt"] = s.seconds
    rows = stage(ledger, checkpoint_id, attempt, g, per_partition)
    with Stopwatch() as s:
        ledger.pre_commit(checkpoint_id, attempt, rows, records=PARTITIONS * per_partition)
    seconds["pre_commit"] = s.seconds
    with Stopwatch() as s:
        outcome = ledger.commit(checkpoint_id)
    seconds["commit"] = s.seconds
    if outcome is not Outcome.COMMITTED:
        raise AssertionError(f"checkpoint {checkpoint_id} (g = {g}): {outcome}")
    return seconds


def table(header: list[str], rows: list[list[str]]) -> str:
    """A Markdown table, the first column left-aligned, the others right."""
    return "\n".join([f"| {' | '.join(header)} |", "|---|" + "---:|" * (len(header) - 1),
                      *(f"| {' | '.join(map(str, row))} |" for row in rows)])
