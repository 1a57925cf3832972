"""Test harness for the protocol: a pipeline with one sink of each mode on real
PostgreSQL, records produced to real Kafka, and its model in Python (`row_of`), from
which the one oracle (tests/oracle.py) says what the final tables must hold.

`Driver` plays the Spark job's part (reading the frozen ranges read_committed
and writing staging rows) with a plain consumer and psycopg2, so the protocol
is tested on its own; a run goes through the pipeline's own run path
(`exactly_once.orchestration.tasks`) with the driver as the job. The Spark job (exactly_once.spark.job) has its own tests
against the same oracle.
"""

from __future__ import annotations

import json
import time
import uuid
from contextlib import closing
from datetime import datetime

import psycopg2
from confluent_kafka import Consumer, TopicPartition
from psycopg2 import sql
from psycopg2.extras import execute_values

from exactly_once.config import PipelineConfig, load_config
from exactly_once.kafka_client import KafkaClient
from exactly_once.ledger.checkpoints import Committable, Outcome
from exactly_once.ledger.kafka_offsets import KafkaOffsets
from exactly_once.ledger.planning import OffsetRange, Reach, layers
from exactly_once.ledger.protocol import Ledger
from exactly_once.ledger.tables import DEAD_LETTER_STAGING, DEAD_LETTERS, qualified, staging_table
from exactly_once.orchestration import tasks
from exactly_once.orchestration.outcomes import TaskOutcome, after_begin
from exactly_once.spark.report import AttemptReport
from tests import oracle
from tests.kafka_records import Produced, produce_transactions
from tests.oracle import Record

FINAL_TABLES = """
CREATE SCHEMA {schema};
CREATE TABLE {schema}.events (id text NOT NULL, k text NOT NULL, n bigint NOT NULL,
    kafka_topic text NOT NULL, kafka_partition int NOT NULL, kafka_offset bigint NOT NULL,
    UNIQUE (kafka_topic, kafka_partition, kafka_offset));
CREATE TABLE {schema}.latest (k text PRIMARY KEY, n bigint NOT NULL, kafka_partition int NOT NULL,
    kafka_offset bigint NOT NULL);
CREATE TABLE {schema}.totals (k text PRIMARY KEY, records bigint NOT NULL, total bigint NOT NULL,
    smallest bigint NOT NULL, largest bigint NOT NULL);
"""


TRANSFORM = "tests.spark.transforms:measures"  # the aggregate's measures, which `row_of` folds too


def make_pipeline(db_url: str, topic: str, **overrides) -> PipelineConfig:
    name = f"p{uuid.uuid4().hex[:10]}"
    with closing(psycopg2.connect(db_url)) as conn, conn, conn.cursor() as cur:
        cur.execute(FINAL_TABLES.format(schema=name))
    return pipeline_config(name, topic, **overrides)


def pipeline_config(name: str, topic: str, more_sinks: tuple[dict, ...] = (), **overrides) -> PipelineConfig:
    """The configuration of the pipeline on FINAL_TABLES in schema `name`, and `more_sinks`."""
    return load_config({
        "name": name,
        "source": {"topics": [topic], "value_schema": {"id": "string", "k": "string", "n": "bigint"}},
        "transform": TRANSFORM,
        "sinks": [
            {"name": "events", "table": f"{name}.events", "mode": "append"},
            {"name": "latest", "table": f"{name}.latest", "mode": "upsert", "keys": ["k"]},
            {"name": "totals", "table": f"{name}.totals", "mode": "aggregate", "keys": ["k"],
             "measures": {"records": "count", "total": "sum", "smallest": "min", "largest": "max"}},
            *more_sinks,
        ],
        **overrides,
    })


def order(i: int, k: str, n: int) -> bytes:
    return json.dumps({"id": f"o{i}", "k": k, "n": n}).encode()


def row_of(record: Record) -> dict | None:
    """The pipeline's parse and transform in Python: a JSON object with a string `id` and
    `k` and an integer `n`, the aggregate's measures folded from `n` (as
    tests/spark/transforms.py adds them); None for a bad record."""
    try:
        v = json.loads(record.value)
    except (TypeError, ValueError):
        return None
    fits = isinstance(v, dict) and type(v.get("id")) is str and type(v.get("k")) is str and type(v.get("n")) is int
    if not fits:
        return None
    return {"id": v["id"], "k": v["k"], "n": v["n"], "total": v["n"], "smallest": v["n"], "largest": v["n"]}


def query(db_url: str, statement: str, *params) -> list[tuple]:
    """One statement on the pipeline database, committed; its rows, if it returns any."""
    with closing(psycopg2.connect(db_url)) as conn, conn, conn.cursor() as cur:
        cur.execute(statement, params)
        return cur.fetchall() if cur.description else []


def committed_records(produced: list[Produced], topic: str) -> list[Record]:
    return [Record(topic, p.partition, p.offset, p.key, p.value) for p in produced if p.committed]


def committed_ranges(db_url: str, pipeline: str) -> list[tuple]:
    with closing(psycopg2.connect(db_url)) as conn, conn.cursor() as cur:
        cur.execute("SELECT topic, partition, from_offset, to_offset FROM exactly_once.committed_ranges "
                    "WHERE pipeline = %s ORDER BY topic, partition, from_offset", (pipeline,))
        return cur.fetchall()


class Driver:
    """Stands in for the Spark job: one attempt of one checkpoint."""

    def __init__(self, ledger: Ledger, servers: str, db_url: str):
        self.ledger, self.servers, self.db_url = ledger, servers, db_url
        self.row_of = row_of  # the transform it plays, in Python

    def execute(self, arguments: list[str]) -> AttemptReport:
        """Runs as the job does, from the job's command-line arguments (tasks.job_arguments):
        stages the rows and reports them, for its task to pre-commit."""
        given = dict(zip(arguments[::2], arguments[1::2]))
        checkpoint_id, attempt = int(given["--checkpoint-id"]), int(given["--attempt"])
        rows = self.write_staging(checkpoint_id, attempt, self.read(self.ledger.current(checkpoint_id, attempt).ranges))
        return AttemptReport(records=sum(rows.values()), rows=rows)

    def run(self, checkpoint_id: int) -> Committable:
        checkpoint = self.ledger.start_attempt(checkpoint_id)
        rows = self.write_staging(checkpoint_id, checkpoint.attempt, self.read(checkpoint.ranges))
        return self.ledger.pre_commit(checkpoint_id, checkpoint.attempt, rows, records=sum(rows.values()))

    def read(self, ranges: tuple[OffsetRange, ...]) -> list[Record]:
        """The committed records of the ranges, a layer (one range per partition) at a time."""
        return [record for layer in layers(ranges) for record in self._read(layer)]

    def _read(self, wanted: tuple[OffsetRange, ...]) -> list[Record]:
        consumer = Consumer({"bootstrap.servers": self.servers, "group.id": "driver",
                             "isolation.level": "read_committed", "enable.auto.commit": False})
        consumer.assign([TopicPartition(r.topic, r.partition, r.start) for r in wanted])
        ends = {(r.topic, r.partition): r.end for r in wanted}
        out, deadline = [], time.monotonic() + 60
        try:
            while any(consumer.position([TopicPartition(t, p)])[0].offset < end for (t, p), end in ends.items()):
                if time.monotonic() > deadline:
                    raise TimeoutError(f"ranges {wanted} not read within 60 s")
                msg = consumer.poll(0.5)
                if msg is not None and msg.error() is None and msg.offset() < ends[(msg.topic(), msg.partition())]:
                    out.append(Record.of(msg))
        finally:
            consumer.close()
        return out

    def write_staging(self, checkpoint_id: int, attempt: int, records: list[Record]) -> dict[str, int]:
        """Stages what the oracle says the records make, as the job would (the final
        tables' columns per sink, the bad records as dead letters)."""
        config = self.ledger.config
        expected = oracle.expected(config, records, self.row_of)
        tag = (checkpoint_id, attempt)
        staged = {}
        with closing(psycopg2.connect(self.db_url)) as conn, conn, conn.cursor() as cur:
            for sink in config.sinks:
                columns = oracle.table_columns(cur, sink)
                rows = expected.values(sink.name, columns)
                statement = sql.SQL("INSERT INTO {} ({}, checkpoint_id, attempt) VALUES %s").format(
                    staging_table(config, sink.name), sql.SQL(", ").join(map(sql.Identifier, columns)))
                execute_values(cur, statement.as_string(cur), [(*row, *tag) for row in rows])
                staged[sink.name] = len(rows)
            dead = expected.values(DEAD_LETTERS, oracle.DEAD_LETTER_COLUMNS)
            execute_values(cur, f"INSERT INTO {qualified(DEAD_LETTER_STAGING)} (topic, partition, \"offset\", key, "
                                "value, reason, pipeline, checkpoint_id, attempt) VALUES %s",
                           [(*row, "not an order", config.name, *tag) for row in dead])
            staged[DEAD_LETTERS] = len(dead)
        return staged


KEYS = ("apple", "pear", "plum", "fig")


def workload(first: int, rounds: int = 2) -> list:
    """Committed and aborted transactions over all three partitions, keys that
    repeat (so upserts and aggregates merge), and two malformed values."""
    transactions = []
    for r in range(rounds):
        i = first + 100 * r
        records = [(p, KEYS[(i + j) % 4].encode(), order(i + j, KEYS[(i + j) % 4], i + j)) for j, p in
                   enumerate((0, 1, 2, 0, 1, 2, 0))]
        transactions.append((True, records))
        transactions.append((False, [(p, b"x", order(i + 50 + p, "apple", 10_000)) for p in (0, 1, 2)]))
    transactions.append((True, [(1, None, b"{not json"), (2, b"fig", b'{"id": "o9", "k": "fig", "n": "nine"}')]))
    return transactions


class Pipeline:
    """One pipeline on one topic, with the produced records remembered for the oracle."""

    def __init__(self, db_url: str, servers: str, topic: str, connect=None, clock=None, fault=None,
                 existing: PipelineConfig | None = None, **config):
        """A new pipeline with final tables of its own, or the `existing` one (made by another
        process: the upgrade test's previous release)."""
        self.db_url, self.servers, self.topic = db_url, servers, topic
        self.config = existing or make_pipeline(db_url, topic, **config)
        options = {k: v for k, v in (("clock", clock), ("fault", fault)) if v is not None}
        self.ledger = Ledger(self.config, connect or (lambda: psycopg2.connect(db_url)), **options)
        self.driver = Driver(self.ledger, servers, db_url)
        self.produced = []
        self._runs = 0

    def produce(self, transactions) -> None:
        self.produced += produce_transactions(self.servers, self.topic, transactions)

    def begin(self, dag_run_id: str | None = None, interval_end: datetime | None = None,
              interval_start: datetime | None = None, reach: Reach = Reach.BACKLOG):
        self._runs += 1
        with KafkaOffsets(KafkaClient.at(self.servers)) as kafka:
            return self.ledger.begin(dag_run_id or f"run{self._runs}", interval_start, interval_end, kafka, reach)

    def run_once(self, start: datetime | None = None, end: datetime | None = None, reach: Reach = Reach.BACKLOG
                 ) -> int:
        """A DAG run (of the interval [start, end), if given) that goes well, through the run
        path: begin, one attempt, commit."""
        self._runs += 1
        with KafkaOffsets(KafkaClient.at(self.servers)) as kafka:
            begun = tasks.begin_checkpoint(self.ledger, kafka, f"run{self._runs}", start, end, reach)
        if after_begin(begun) is TaskOutcome.DONE:
            tasks.run_increment(self.ledger, begun.checkpoint.id, self.driver.execute)
            assert tasks.commit_checkpoint(self.ledger, begun.checkpoint.id, 1) is Outcome.COMMITTED
        return begun.checkpoint.id

    def expected(self) -> oracle.Expected:
        return oracle.expected(self.config, committed_records(self.produced, self.topic), row_of)

    def actual(self) -> oracle.Tables:
        return oracle.actual(self.db_url, self.config)

    def assert_exact(self) -> None:
        oracle.assert_exact(self.expected(), self.actual())
