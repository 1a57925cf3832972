"""One exactly-once checkpoint over N demo orders, measured phase by phase, beside the
limits it is compared with and the jobs a user would otherwise run, all in one run on
the same records:

- the checkpoint as the pipeline's tasks run it (`exactly_once.tasks`): plan, a new attempt,
  `spark-submit jobs/increment.py` (its phases from the job's report, its driver's peak
  memory), commit;
- limits: PostgreSQL `COPY` of the checkpoint's staged rows from files, a bare
  `INSERT … SELECT` of its append rows into a table with the final table's indexes, and
  Spark's Kafka read of its ranges into the noop sink;
- peers (tests/benchmarks/peers.py): an at-least-once job and Structured Streaming,
  each writing final tables of its own, which must equal the checkpoint's, row for row.

The pipeline is a copy of the demo (tests/benchmarks/copies.py).
"""

from __future__ import annotations

import json
import shutil
import time
from contextlib import closing
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path

import psycopg2
from psycopg2 import sql

from exactly_once_demo.pipeline import config as demo_config
from exactly_once_demo.produce import produce
from exactly_once.job_settings import JobSettings
from exactly_once.kafka_client import KafkaClient
from exactly_once.kafka_offsets import KafkaOffsets
from exactly_once import tasks
from exactly_once.checkpoints import Outcome
from exactly_once.protocol import Ledger
from exactly_once.tables import final_table, staging_tables
from exactly_once_stack.settings import ROOT
from tests.benchmarks import copies
from tests.benchmarks.copies import Q
from tests.benchmarks.spark_app import SparkRun, submit

JOB = ROOT / "jobs" / "increment.py"
PEERS = Path(__file__).with_name("peers.py")
PER_TRANSACTION = 50_000  # orders per Kafka transaction (every 7th aborted, as in the demo)
VARIANTS = ("eo", "alo", "ss")  # exactly-once, at-least-once, Structured Streaming: a schema of final tables each
EVERY_ROW = sql.SQL("true")


@dataclass(frozen=True)
class Throughput:
    orders: int                 # produced, aborted transactions included
    records: int                # committed records the checkpoint read (bad ones included)
    produce: float              # seconds
    plan: float
    start_attempt: float
    job: SparkRun               # its report: records, rows per sink, seconds per phase
    commit: float
    staged_rows: int            # every sink's staging rows and the dead letters
    copy: float                 # COPY of the staged rows from files
    append_rows: int
    insert_select: float        # INSERT … SELECT of the append rows
    kafka_read: SparkRun
    at_least_once: SparkRun
    streaming: SparkRun

    @property
    def end_to_end(self) -> float:
        return self.plan + self.start_attempt + self.job.seconds + self.commit

    def phase(self, name: str) -> float:
        return self.job.report["seconds"][name]

    @property
    def spark_start_stop(self) -> float:
        """The job's time outside its measured phases: JVM and session start, reading the ledger, stop."""
        return self.job.seconds - sum(self.job.report["seconds"].values())


class Bench:
    """The benchmark pipeline of one size: names, tables, and what it runs."""

    def __init__(self, orders: int, servers: str, db_url: str, folder: Path):
        self.orders, self.servers, self.db_url = orders, servers, db_url
        self.name = f"bench_{orders}"
        self.folder = folder / self.name
        self.folder.mkdir(parents=True, exist_ok=True)
        self.schemas = {v: f"{self.name}_{v}" for v in VARIANTS}
        self.limits_schema = f"{self.name}_limits"
        self.config = demo_config(self.name, self.name, self.schemas["eo"])
        self.ledger = Ledger(self.config, lambda: psycopg2.connect(db_url))

    def execute(self, statement: str, params: dict | None = None, **identifiers) -> list[tuple]:
        return copies.execute(self.db_url, statement, params, **identifiers)

    def remove(self) -> None:
        """Everything of this pipeline but the logs and reports in its folder."""
        copies.remove(self.servers, self.db_url, self.config, [*self.schemas.values(), self.limits_schema])
        for staged in self.folder.glob("staged-*.tsv"):
            staged.unlink()
        shutil.rmtree(self.streaming_checkpoint, ignore_errors=True)

    @property
    def streaming_checkpoint(self) -> Path:
        return self.folder / "streaming-checkpoint"

    def prepare(self) -> None:
        self.remove()
        for variant, schema in self.schemas.items():
            copies.create_demo_tables(self.db_url, schema)
            if variant != "eo":
                self.execute(Q["create_peer_dead_letters"], schema=sql.Identifier(schema))
        self.execute(Q["create_schema"], schema=sql.Identifier(self.limits_schema))
        self.ledger.register()

    # -- the checkpoint ------------------------------------------------------------------

    def run(self) -> Throughput:
        self.prepare()
        with Stopwatch() as produced:
            produce(self.servers, self.orders, seed=self.orders, topic=self.name, per_transaction=PER_TRANSACTION)
        # The pipeline's own run path (exactly_once.tasks), each task timed.
        with KafkaOffsets(KafkaClient.at(self.servers)) as kafka, Stopwatch() as plan:
            checkpoint = tasks.begin_checkpoint(self.ledger, kafka, "benchmark", None,
                                                datetime.now(timezone.utc)).checkpoint
        jobs = []
        settings = JobSettings(self.db_url, KafkaClient.at(self.servers))  # as IncrementOperator hands them over
        with Stopwatch() as increment, settings.written() as settings_file:
            tasks.run_increment(self.ledger, checkpoint.id, lambda arguments: jobs.append(
                submit(JOB, [*arguments, "--settings", str(settings_file)], self.folder / "increment.log")))
        job = jobs[0]
        staged = self.save_staging(checkpoint.id)
        with Stopwatch() as commit:
            outcome = tasks.commit_checkpoint(self.ledger, checkpoint.id, try_number=1)
        if outcome is not Outcome.COMMITTED:
            raise AssertionError(f"{self.name}: checkpoint {checkpoint.id} {outcome}")
        ranges = json.dumps([[r.topic, r.partition, r.start, r.end] for r in checkpoint.ranges if r.size])
        copy, insert_select, append_rows = self.postgres_limits(staged)
        kafka_read = submit(PEERS, ["kafka-read", ranges], self.folder / "kafka-read.log")
        peer = ["--pipeline", self.name, "--topic", self.name]
        at_least_once = submit(PEERS, ["at-least-once", ranges, *peer, "--schema", self.schemas["alo"]],
                               self.folder / "at-least-once.log")
        streaming = submit(PEERS, ["streaming", ranges, *peer, "--schema", self.schemas["ss"],
                                   "--checkpoint-dir", str(self.streaming_checkpoint)], self.folder / "streaming.log")
        self.check_peers_equal()
        return Throughput(self.orders, job.report["records"], produced.seconds, plan.seconds,
                          increment.seconds - job.seconds,
                          job, commit.seconds, sum(staged.values()), copy, append_rows, insert_select, kafka_read,
                          at_least_once, streaming)

    def save_staging(self, checkpoint_id: int) -> dict[str, int]:
        """Each staging table's rows of the checkpoint into a file (between pre-commit and
        commit, untimed): what the COPY limit loads. Rows per table."""
        rows = {}
        with closing(psycopg2.connect(self.db_url)) as conn, conn.cursor() as cur:
            for name, table in staging_tables(self.config).items():
                with (self.folder / f"staged-{name}.tsv").open("w") as out:
                    cur.copy_expert(sql.SQL(Q["copy_out"]).format(
                        staging=table, checkpoint_id=sql.Literal(checkpoint_id)).as_string(cur), out)
                rows[name] = cur.rowcount
        return rows

    def postgres_limits(self, staged: dict[str, int]) -> tuple[float, float, int]:
        """COPY of every staged row from the files into tables like staging (indexes
        included), then INSERT … SELECT of the append sink's rows into a table like its final
        table (unique index included). Seconds of each, and the append rows."""
        limits = {name: sql.Identifier(self.limits_schema, f"staged_{name.strip('_')}")
                  for name in staging_tables(self.config)}
        for name, staging in staging_tables(self.config).items():
            self.execute(Q["create_like_staging"], table=limits[name], staging=staging)
        copy = 0.0
        with closing(psycopg2.connect(self.db_url)) as conn, conn.cursor() as cur:
            for name, table in limits.items():
                with (self.folder / f"staged-{name}.tsv").open() as source, Stopwatch() as loaded:
                    cur.copy_expert(sql.SQL(Q["copy_in"]).format(table=table).as_string(cur), source)
                    conn.commit()
                copy += loaded.seconds
        append = next(s for s in self.config.sinks if s.mode == "append")
        target = sql.Identifier(self.limits_schema, "final_orders")
        self.execute(Q["create_like_final"], table=target, final=final_table(append))
        columns = sql.SQL(", ").join(sql.Identifier(c.name) for c in self.ledger.final_columns()[append.name])
        with Stopwatch() as insert_select:
            self.execute(Q["insert_select"], table=target, source=limits[append.name], columns=columns)
        return copy, insert_select.seconds, staged[append.name]

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
        digests = {v: self.digest(sql.Identifier(self.schemas[v], "dead_letters"), dead) for v in ("alo", "ss")}
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


def measure(orders: int, servers: str, db_url: str, folder: Path) -> Throughput:
    bench = Bench(orders, servers, db_url, folder)
    try:
        return bench.run()
    finally:
        bench.remove()
