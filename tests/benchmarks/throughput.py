"""Exactly-once checkpoints over N demo orders, measured phase by phase, beside the
limits they are compared with and the jobs a user would otherwise run. The orders are
produced once; each repetition then reads all of them anew, as a pipeline of its own,
and runs its Spark jobs in an order rotated from the repetition before (interleaved), so
that no job always runs first on a cold machine; the PostgreSQL limits follow them:

- the checkpoint as the pipeline's tasks run it (`exactly_once.orchestration.tasks`): plan, a new attempt,
  `spark-submit jobs/increment.py` (its phases from the job's report, its driver's peak
  memory), commit (the transaction, then the staging clean-up after it);
- limits, on the PostgreSQL server: binary `COPY` of the checkpoint's staged rows from files into
  bare tables (no index) and into tables like staging (its index), and a bare
  `INSERT … SELECT` of every sink's rows from the bare copies into tables with the final
  tables' indexes; Spark's Kafka read of the ranges into the noop sink;
- peers (tests/benchmarks/peers.py): an at-least-once job (with the same COPY writer) and
  Structured Streaming, once with Spark's JDBC writer (as users write it) and once with the
  COPY writer, each writing final tables of its own, which must equal the checkpoint's, row
  for row.

The pipelines are copies of the demo (tests/benchmarks/copies.py).
"""

from __future__ import annotations

import json
import shutil
import statistics
import time
from collections.abc import Callable
from contextlib import AbstractContextManager, closing, nullcontext
from dataclasses import dataclass
from datetime import datetime, timezone
from functools import partial
from pathlib import Path

import psycopg2
from psycopg2 import sql
from psycopg2.extensions import parse_dsn

from exactly_once import faults
from exactly_once.connections import PIPELINE_DB_JOB, pipeline_db_url
from exactly_once.kafka_client import KafkaClient
from exactly_once.ledger.checkpoints import Outcome
from exactly_once.ledger.kafka_offsets import KafkaOffsets
from exactly_once.ledger.protocol import Ledger
from exactly_once.ledger.tables import DEAD_LETTERS, final_table, staging_tables
from exactly_once.orchestration import tasks
from exactly_once.spark.report import AttemptReport
from exactly_once.spark.settings import JobSettings
from exactly_once_demo.pipeline import config as demo_config
from exactly_once_demo.produce import produce
from exactly_once_stack.settings import ROOT
from tests.benchmarks import copies, profiling
from tests.benchmarks.copies import Q
from tests.benchmarks.spark_app import SparkRun, increment_job, submit

JOB = ROOT / "jobs" / "increment.py"
PEERS = Path(__file__).with_name("peers.py")
PER_TRANSACTION = 50_000  # orders per Kafka transaction (every 7th aborted, as in the demo)
# exactly-once, at-least-once, Structured Streaming (JDBC, COPY): a schema of final tables each
VARIANTS = ("eo", "alo", "ss", "ssc")
JOBS = ("exactly-once", "at-least-once", "streaming", "streaming-copy", "kafka-read")  # a repetition's, rotated
EVERY_ROW = sql.SQL("true")


@dataclass(frozen=True)
class Repetition:
    records: int                # committed records the checkpoint read (bad ones included)
    plan: float                 # seconds
    start_attempt: float        # and the attempt's token, around the job
    pre_commit: float           # the task's pre-commit of what the job reported
    job: SparkRun               # its report: records, rows per sink, seconds per phase
    commit: float               # the commit's transaction
    clean_up: float             # the staging clean-up after it
    staged_rows: int            # every sink's staging rows and the dead letters
    copy_bare: float            # COPY of the staged rows from files into tables without an index
    copy_like_staging: float    # the same into tables like staging
    insert_select: float        # INSERT … SELECT of every sink's rows from the bare copies
    kafka_read: SparkRun
    at_least_once: SparkRun
    streaming: SparkRun
    streaming_copy: SparkRun

    @property
    def end_to_end(self) -> float:
        return self.plan + self.start_attempt + self.job.seconds + self.pre_commit + self.commit + self.clean_up

    def phase(self, name: str) -> float:
        return self.job.report["seconds"][name]

    @property
    def sink_rows(self) -> int:
        """The staged rows of the sinks, without the dead letters: what the commit promotes into final tables."""
        return self.staged_rows - self.job.report["rows"][DEAD_LETTERS]

    @property
    def spark_start_stop(self) -> float:
        """The job's time outside its measured phases: JVM and session start, reading the ledger, stop."""
        return self.job.seconds - sum(self.job.report["seconds"].values())


@dataclass(frozen=True)
class Throughput:
    """The repetitions of one size."""

    orders: int                 # produced, aborted transactions included
    produce: float              # seconds, once for all repetitions
    repetitions: list[Repetition]

    @property
    def records(self) -> int:
        return self.repetitions[0].records

    def median(self, value: Callable[[Repetition], float]) -> float:
        return statistics.median(value(r) for r in self.repetitions)


def rotated(repetition: int) -> tuple[str, ...]:
    """The jobs of a repetition, the first of the one before now last."""
    shift = repetition % len(JOBS)
    return JOBS[shift:] + JOBS[:shift]


class Bench:
    """One repetition's pipeline over the size's topic: names, tables, and what it runs."""

    def __init__(self, orders: int, repetition: int, servers: str, db_url: str, folder: Path, profile: bool = False):
        self.orders, self.repetition, self.servers, self.db_url = orders, repetition, servers, db_url
        self.profile = profile  # its Spark event log and PostgreSQL statements (tests/benchmarks/profiling.py)
        self.topic = f"bench_{orders}"
        self.name = f"bench_{orders}_{repetition}"
        self.folder = folder / self.name
        self.folder.mkdir(parents=True, exist_ok=True)
        self.schemas = {v: f"{self.name}_{v}" for v in VARIANTS}
        self.limits_schema = f"{self.name}_limits"
        self.config = demo_config(self.name, self.topic, self.schemas["eo"])
        self.marks = {}
        self.ledger = Ledger(self.config, lambda: psycopg2.connect(db_url), fault=self.mark)

    def mark(self, point: str) -> None:
        """The ledger's fault points, timed (when the commit's transaction ended)."""
        self.marks[point] = time.perf_counter()
        faults.point(point)

    def execute(self, statement: str, params: dict | None = None, **identifiers) -> list[tuple]:
        return copies.execute(self.db_url, statement, params, **identifiers)

    def remove(self) -> None:
        """Everything of this pipeline but its topic, logs and reports."""
        copies.forget(self.db_url, self.config, [*self.schemas.values(), self.limits_schema])
        for staged in self.folder.glob("staged-*.copy"):
            staged.unlink()
        for peer in ("streaming", "streaming-copy"):
            shutil.rmtree(self.streaming_checkpoint(peer), ignore_errors=True)

    def streaming_checkpoint(self, peer: str) -> Path:
        return self.folder / f"{peer}-checkpoint"

    def prepare(self) -> None:
        self.remove()
        for variant, schema in self.schemas.items():
            copies.create_demo_tables(self.db_url, schema)
            if variant != "eo":
                self.execute(Q["create_peer_dead_letters"], schema=sql.Identifier(schema))
        self.execute(Q["create_schema"], schema=sql.Identifier(self.limits_schema))
        self.ledger.register()

    # -- one repetition ---------------------------------------------------------------------

    def run(self) -> Repetition:
        self.prepare()
        # The pipeline's own run path (exactly_once.orchestration.tasks), each task timed.
        with KafkaOffsets(KafkaClient.at(self.servers)) as kafka, Stopwatch() as plan:
            checkpoint = tasks.begin_checkpoint(self.ledger, kafka, "benchmark", None,
                                                datetime.now(timezone.utc)).checkpoint
        ranges = json.dumps([[r.topic, r.partition, r.start, r.end] for r in checkpoint.ranges if r.size])
        peer = ["--pipeline", self.name, "--topic", self.topic]
        runs = {
            "exactly-once": lambda: self.checkpoint(checkpoint.id),
            "kafka-read": lambda: submit(PEERS, ["kafka-read", ranges], self.folder / "kafka-read.log"),
            "at-least-once": lambda: submit(PEERS, ["at-least-once", ranges, *peer, "--schema", self.schemas["alo"]],
                                            self.folder / "at-least-once.log"),
            **{name: partial(self.streaming, name, ranges, self.schemas[variant])
               for name, variant in (("streaming", "ss"), ("streaming-copy", "ssc"))},
        }
        done = {name: runs[name]() for name in rotated(self.repetition)}
        self.check_peers_equal()
        job, start_attempt, pre_commit, commit, clean_up, staged = done["exactly-once"]
        copy_bare, copy_like_staging, insert_select = self.postgres_limits(staged)
        return Repetition(job.report["records"], plan.seconds, start_attempt, pre_commit, job, commit, clean_up,
                          sum(staged.values()), copy_bare, copy_like_staging, insert_select, done["kafka-read"],
                          done["at-least-once"], done["streaming"], done["streaming-copy"])

    def streaming(self, peer: str, ranges: str, schema: str) -> SparkRun:
        return submit(PEERS, [peer, ranges, "--pipeline", self.name, "--topic", self.topic, "--schema", schema,
                              "--checkpoint-dir", str(self.streaming_checkpoint(peer))], self.folder / f"{peer}.log")

    def checkpoint(self, checkpoint_id: int) -> tuple[SparkRun, float, float, float, float, dict[str, int]]:
        """The checkpoint's increment and commit: (its job, the time around the job but the
        pre-commit, the pre-commit, the commit's transaction, the clean-up after it, the staged
        rows per table)."""
        jobs = []
        # As IncrementOperator hands them over: the job role's database connection.
        settings = JobSettings(pipeline_db_url(PIPELINE_DB_JOB), KafkaClient.at(self.servers))
        event_logs, statements = self.folder / "event-logs", {}
        conf = profiling.event_log_conf(event_logs) if self.profile else None
        with self.profiling(statements, "the increment task"), Stopwatch() as increment, \
                settings.written() as settings_file:
            submitted = increment_job(JOB, settings_file, self.folder / "increment.log", jobs, conf)

            def job_then_mark(arguments: list[str]) -> AttemptReport:
                report = submitted(arguments)
                self.marks["job_ended"] = time.perf_counter()
                return report
            tasks.run_increment(self.ledger, checkpoint_id, job_then_mark)
        pre_commit = self.marks["pre_commit.before_commit"] - self.marks["job_ended"]
        staged = self.save_staging(checkpoint_id)
        with self.profiling(statements, "the commit task"), Stopwatch() as commit:
            outcome = tasks.commit_checkpoint(self.ledger, checkpoint_id, try_number=1)
        if self.profile:
            profiling.write_profile(self.folder / "profile.md", event_logs, statements)
        if outcome is not Outcome.COMMITTED:
            raise AssertionError(f"{self.name}: checkpoint {checkpoint_id} {outcome}")
        transaction = self.marks["commit.before_clean_up"] - commit.started
        return (jobs[0], increment.seconds - jobs[0].seconds - pre_commit, pre_commit, transaction,
                commit.seconds - transaction, staged)

    def profiling(self, into: dict[str, str], part: str) -> AbstractContextManager:
        return profiling.statements(parse_dsn(self.db_url)["dbname"], into, part) if self.profile else nullcontext()

    def save_staging(self, checkpoint_id: int) -> dict[str, int]:
        """Each staging table's rows of the checkpoint into a file (between pre-commit and
        commit, untimed): what the COPY limit loads. Rows per table."""
        rows = {}
        with closing(psycopg2.connect(self.db_url)) as conn, conn.cursor() as cur:
            for name, table in staging_tables(self.config).items():
                with (self.folder / f"staged-{name}.copy").open("wb") as out:
                    cur.copy_expert(sql.SQL(Q["copy_out"]).format(
                        staging=table, checkpoint_id=sql.Literal(checkpoint_id)).as_string(cur), out)
                rows[name] = cur.rowcount
        return rows

    def postgres_limits(self, staged: dict[str, int]) -> tuple[float, float, float]:
        """Seconds of: COPY of every staged row from the files into bare tables, and into
        tables like staging (its index); INSERT … SELECT of every sink's rows from the bare
        tables into tables like its final table (its unique indexes)."""
        tables = staging_tables(self.config)
        created_by = {"bare": "create_bare_like", "like_staging": "create_like_staging"}
        seconds = dict.fromkeys(created_by, 0.0)
        for shape, create in created_by.items():
            for name, staging in tables.items():
                table = sql.Identifier(self.limits_schema, f"{shape}_{name.strip('_')}")
                self.execute(Q[create], table=table, staging=staging)
                with closing(psycopg2.connect(self.db_url)) as conn, conn.cursor() as cur, \
                        (self.folder / f"staged-{name}.copy").open("rb") as source, Stopwatch() as loaded:
                    cur.copy_expert(sql.SQL(Q["copy_in"]).format(table=table).as_string(cur), source)
                    conn.commit()
                seconds[shape] += loaded.seconds
        insert_select = 0.0
        columns = self.ledger.final_columns()
        for sink in self.config.sinks:
            target = sql.Identifier(self.limits_schema, f"final_{sink.name}")
            self.execute(Q["create_like_final"], table=target, final=final_table(sink))
            names = sql.SQL(", ").join(sql.Identifier(c.name) for c in columns[sink.name])
            with Stopwatch() as inserted:
                self.execute(Q["insert_select"], table=target, columns=names,
                             source=sql.Identifier(self.limits_schema, f"bare_{sink.name}"))
            insert_select += inserted.seconds
        return seconds["bare"], seconds["like_staging"], insert_select

    # -- the peers' tables equal the checkpoint's --------------------------------------------

    def check_peers_equal(self) -> None:
        """Every final table of the peers holds the checkpoint's rows (count and checksum), or
        their figures are not comparable."""
        columns = {sink: [c.name for c in types] for sink, types in self.ledger.final_columns().items()}
        differ = []
        for sink in self.config.sinks:
            digests = {v: self.digest(sql.Identifier(self.schemas[v], sink.schema_and_table[1]), columns[sink.name])
                       for v in VARIANTS}
            if len(set(digests.values())) != 1:
                differ.append(f"{sink.name}: {digests}")
        dead = ["pipeline", "topic", "partition", "offset", "key", "value", "reason"]
        digests = {v: self.digest(sql.Identifier(self.schemas[v], "dead_letters"), dead) for v in VARIANTS[1:]}
        digests["eo"] = self.digest(sql.Identifier("exactly_once", "dead_letters"), dead,
                                    sql.SQL("pipeline = {}").format(sql.Literal(self.name)))
        if len(set(digests.values())) != 1:
            differ.append(f"dead letters: {digests}")
        if differ:
            raise AssertionError(f"{self.name}: the peers' final tables differ from the checkpoint's: {differ}")

    def digest(self, table: sql.Identifier, columns: list[str], where: sql.Composable = EVERY_ROW) -> tuple:
        return self.execute(Q["digest"], table=table, where=where,
                            columns=sql.SQL(", ").join(map(sql.Identifier, columns)))[0]


class Stopwatch:
    """`with Stopwatch() as s: …` then `s.seconds`."""

    def __enter__(self) -> Stopwatch:
        self.started = time.perf_counter()
        return self

    def __exit__(self, *exc) -> None:
        self.seconds = time.perf_counter() - self.started


def measure(orders: int, servers: str, db_url: str, folder: Path, repetitions: int,
            profile: bool = False) -> Throughput:
    topic = f"bench_{orders}"
    copies.delete_topic(servers, topic)
    try:
        with Stopwatch() as produced:
            produce(servers, orders, seed=orders, topic=topic, per_transaction=PER_TRANSACTION)
        done = []
        for repetition in range(repetitions):
            bench = Bench(orders, repetition, servers, db_url, folder, profile)
            try:
                done.append(bench.run())
            finally:
                bench.remove()
        return Throughput(orders, produced.seconds, done)
    finally:
        copies.delete_topic(servers, topic)
