"""Exactly-once checkpoints over N demo orders, measured phase by phase, beside the
limits they are compared with and the jobs a user would otherwise run. The orders are
produced once; each repetition then reads all of them anew, as pipelines of its own,
and runs its Spark jobs in an order rotated from the repetition before (interleaved), so
that no job always runs first on a cold machine; the PostgreSQL limits follow them:

- the checkpoint as the pipeline's tasks run it (tests/benchmarks/checkpoints.py): plan, a
  new attempt, spark-submit of the job (its phases from the job's report, its
  driver's peak memory), commit (the transaction, then the staging clean-up after it);
- the same checkpoint, by a second copy of the pipeline, with its job run as the task runs
  it on a `spark_connect` connection: a client of a warm Spark Connect server (on local[2],
  started once for all repetitions), so no Spark application starts per checkpoint; only
  where `measure` is asked to (`./dev bench`: sizes up to tests/benchmarks/run.py's CONNECT_UP_TO);
- limits (tests/benchmarks/postgres_limits.py), on the PostgreSQL server: binary `COPY` of
  the checkpoint's staged rows from files into bare tables (no index) and into tables like
  staging (its index), and a bare `INSERT … SELECT` of every sink's rows from the bare
  copies into tables with the final tables' indexes; Spark's Kafka read of the ranges into
  the noop sink;
- peers: Structured Streaming as its users write it, with Spark's JDBC writer
  (tests/benchmarks/user_streaming.py: bad records dropped, no dead letters); and
  (tests/benchmarks/peers.py) an at-least-once job and Structured Streaming, both with the
  increment job's parse, checks, sink rows and COPY writer. Each writes final tables of its
  own, which must equal the checkpoint's, row for row, as must the Connect checkpoint's (and
  the dead letters, where a peer writes them).

The pipelines are copies of the demo (tests/benchmarks/copies.py).
"""

from __future__ import annotations

import json
import os
import shutil
import statistics
import time
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager, nullcontext
from dataclasses import dataclass
from functools import partial
from pathlib import Path

from psycopg2 import sql
from psycopg2.extensions import parse_dsn

from exactly_once.ledger.tables import DEAD_LETTERS
from exactly_once.spark.runners import job_runner
from exactly_once_demo.pipeline import config as demo_config
from exactly_once_demo.produce import produce
from exactly_once_stack import spark_cluster
from exactly_once_stack.settings import spark_connection
from tests.benchmarks import copies, postgres_limits, profiling
from tests.benchmarks.checkpoints import CheckpointRun, TimedPipeline, job_settings, submitted
from tests.benchmarks.copies import Q
from tests.benchmarks.postgres_limits import Limits
from tests.benchmarks.spark_app import SparkRun, connect_job, submit
from tests.benchmarks.stopwatch import Stopwatch

PEERS = Path(__file__).with_name("peers.py")
USER_STREAMING = Path(__file__).with_name("user_streaming.py")  # the `streaming` peer
PER_TRANSACTION = 50_000  # orders per Kafka transaction (every 7th aborted, as in the demo)
CONNECT = "bench_spark_connect"  # the Airflow connection of the warm Spark Connect server
# exactly-once (spark-submit, Spark Connect), at-least-once, Structured Streaming (as users write
# it, with JDBC; with the increment job's frames and COPY): a schema of final tables each
VARIANTS = ("eo", "eoc", "alo", "ss", "ssc")
DEAD_LETTERING = ("alo", "ssc")  # the peers that write dead letters (the user's job drops bad records)
JOBS = ("exactly-once", "exactly-once-connect", "at-least-once", "streaming", "streaming-copy",
        "kafka-read")  # a repetition's, rotated
EVERY_ROW = sql.SQL("true")
# The dead letters' columns compared (not `pipeline`: each copy of the pipeline has a name of its own)
DEAD = ["topic", "partition", "offset", "key", "value", "reason"]


@dataclass(frozen=True)
class Repetition:
    submitted: CheckpointRun    # its job by spark-submit, an application of its own
    connected: CheckpointRun | None  # the same, a client of the warm Spark Connect server (None: not run)
    staged_rows: int            # every sink's staging rows and the dead letters
    limits: Limits
    kafka_read: SparkRun
    at_least_once: SparkRun
    streaming: SparkRun
    streaming_copy: SparkRun

    @property
    def records(self) -> int:
        """Committed records the checkpoint read (bad ones included)."""
        return self.submitted.job.report["records"]

    @property
    def sink_rows(self) -> int:
        """The staged rows of the sinks, without the dead letters: what the commit promotes into final tables."""
        return self.staged_rows - self.submitted.job.report["rows"][DEAD_LETTERS]


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
    """One repetition's pipelines over the size's topic: names, tables, and what they run."""

    def __init__(self, orders: int, repetition: int, servers: str, db_url: str, folder: Path, profile: bool = False,
                 connect: bool = True):
        self.orders, self.repetition, self.servers, self.db_url = orders, repetition, servers, db_url
        self.profile = profile  # its Spark event log and PostgreSQL statements (tests/benchmarks/profiling.py)
        self.topic = f"bench_{orders}"
        self.name = f"bench_{orders}_{repetition}"
        self.folder = folder / self.name
        self.folder.mkdir(parents=True, exist_ok=True)
        self.schemas = {v: f"{self.name}_{v}" for v in VARIANTS if connect or v != "eoc"}
        self.limits_schema = f"{self.name}_limits"
        self.config = demo_config(self.name, self.topic, self.schemas["eo"])
        self.pipeline = TimedPipeline(self.config, db_url)
        self.connected = TimedPipeline(demo_config(f"{self.name}_connect", self.topic, self.schemas["eoc"]),
                                       db_url) if connect else None

    def execute(self, statement: str, params: dict | None = None, **identifiers) -> list[tuple]:
        return copies.execute(self.db_url, statement, params, **identifiers)

    def remove(self) -> None:
        """Everything of these pipelines but their topic, logs and reports."""
        copies.forget(self.db_url, self.config, [*self.schemas.values(), self.limits_schema])
        if self.connected:
            copies.forget(self.db_url, self.connected.ledger.config, [])
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
            if variant in DEAD_LETTERING:
                self.execute(Q["create_peer_dead_letters"], schema=sql.Identifier(schema))
        self.execute(Q["create_schema"], schema=sql.Identifier(self.limits_schema))
        for pipeline in self.pipelines().values():
            pipeline.ledger.register()

    # -- one repetition ---------------------------------------------------------------------

    def run(self) -> Repetition:
        self.prepare()
        checkpoint, plan = self.pipeline.plan(self.servers)
        ranges = json.dumps([[r.topic, r.partition, r.start, r.end] for r in checkpoint.ranges if r.size])
        peer = ["--pipeline", self.name, "--topic", self.topic]
        runs = {
            "exactly-once": lambda: self.checkpoint(checkpoint.id, plan),
            "kafka-read": lambda: submit(PEERS, ["kafka-read", ranges], self.folder / "kafka-read.log"),
            "at-least-once": lambda: submit(PEERS, ["at-least-once", ranges, *peer, "--schema", self.schemas["alo"]],
                                            self.folder / "at-least-once.log"),
            **{name: partial(self.streaming, name, ranges, self.schemas[variant])
               for name, variant in (("streaming", "ss"), ("streaming-copy", "ssc"))},
        }
        if self.connected:
            connected, connected_plan = self.connected.plan(self.servers)
            runs["exactly-once-connect"] = lambda: self.connect_checkpoint(connected.id, connected_plan)
        done = {name: runs[name]() for name in rotated(self.repetition) if name in runs}
        self.check_peers_equal()
        submitted, staged = done["exactly-once"]
        limits = postgres_limits.measure(self.db_url, self.pipeline.ledger, self.folder, self.limits_schema)
        return Repetition(submitted, done.get("exactly-once-connect"), sum(staged.values()), limits, done["kafka-read"],
                          done["at-least-once"], done["streaming"], done["streaming-copy"])

    def streaming(self, peer: str, ranges: str, schema: str) -> SparkRun:
        if peer == "streaming":  # the user's job: no pipeline, no dead letters
            return submit(USER_STREAMING, [ranges, "--schema", schema, "--checkpoint-dir",
                                           str(self.streaming_checkpoint(peer))], self.folder / f"{peer}.log")
        return submit(PEERS, [peer, ranges, "--pipeline", self.name, "--topic", self.topic, "--schema", schema,
                              "--checkpoint-dir", str(self.streaming_checkpoint(peer))], self.folder / f"{peer}.log")

    def pipelines(self) -> dict[str, TimedPipeline]:
        """The exactly-once pipelines run, by variant."""
        return {"eo": self.pipeline, **({"eoc": self.connected} if self.connected else {})}

    def checkpoint(self, checkpoint_id: int, plan: float) -> tuple[CheckpointRun, dict[str, int]]:
        """The checkpoint with its job by spark-submit, and its staged rows per table (saved to
        files between the pre-commit and the commit, for the PostgreSQL limits)."""
        staged, statements = {}, {}
        event_logs = self.folder / "event-logs"
        conf = profiling.event_log_conf(event_logs) if self.profile else None
        run = submitted(self.pipeline, checkpoint_id, plan, self.servers, self.folder / "increment.log", conf,
                        around=partial(self.profiling, statements),
                        before_commit=lambda: staged.update(postgres_limits.save_staging(self.db_url, self.config,
                                                                                         checkpoint_id, self.folder)),
                        cpu=self.profile)
        if self.profile:
            profiling.write_profile(self.folder / "profile.md", event_logs, statements, job=run.job)
        return run, staged

    def connect_checkpoint(self, checkpoint_id: int, plan: float) -> CheckpointRun:
        """The second pipeline's checkpoint, its job run as the task runs it on the warm Spark
        Connect server's connection (`exactly_once.spark.runners.job_runner`)."""
        config = self.connected.ledger.config
        runner = job_runner(CONNECT, f"{config.name} increment", config, job_settings(self.servers))
        jobs, statements = [], {}
        server = spark_cluster.running()["connect"]  # spark-submit execs the server's JVM under this pid
        began = time.time()
        run = self.connected.run(checkpoint_id, plan,
                                 connect_job(runner, self.folder / "increment-connect.log", jobs, server), jobs,
                                 around=partial(self.profiling, statements))
        event_logs = connect_event_logs(self.folder.parent)
        if self.profile and any(event_logs.iterdir()):  # a server it started
            profiling.write_profile(self.folder / "profile-connect.md", event_logs, statements, config.name,
                                    window=(began, time.time()))
        return run

    def profiling(self, into: dict[str, str], part: str) -> AbstractContextManager:
        return profiling.statements(parse_dsn(self.db_url)["dbname"], into, part) if self.profile else nullcontext()

    # -- the peers' tables equal the checkpoint's --------------------------------------------

    def check_peers_equal(self) -> None:
        """Every final table of the peers and of the Connect checkpoint holds the checkpoint's
        rows (count and checksum), and so do the dead letters of those that write them, or
        their figures are not comparable. The user's streaming job drops the records the
        checkpoint dead-letters (malformed, a NUL in the sku), so its sink tables equal too."""
        columns = {sink: [c.name for c in types] for sink, types in self.pipeline.ledger.final_columns().items()}
        differ = []
        for sink in self.config.sinks:
            digests = {v: self.digest(sql.Identifier(schema, sink.schema_and_table[1]), columns[sink.name])
                       for v, schema in self.schemas.items()}
            if len(set(digests.values())) != 1:
                differ.append(f"{sink.name}: {digests}")
        digests = {v: self.digest(sql.Identifier(schema, "dead_letters"), DEAD) for v, schema in self.schemas.items()
                   if v in DEAD_LETTERING}
        for variant, pipeline in self.pipelines().items():
            digests[variant] = self.digest(sql.Identifier("exactly_once", "dead_letters"), DEAD, sql.SQL(
                "pipeline = {}").format(sql.Literal(pipeline.ledger.config.name)))
        if len(set(digests.values())) != 1:
            differ.append(f"dead letters: {digests}")
        if differ:
            raise AssertionError(f"{self.name}: the peers' final tables differ from the checkpoint's: {differ}")

    def digest(self, table: sql.Identifier, columns: list[str], where: sql.Composable = EVERY_ROW) -> tuple:
        return self.execute(Q["digest"], table=table, where=where,
                            columns=sql.SQL(", ").join(map(sql.Identifier, columns)))[0]


def connect_event_logs(folder: Path) -> Path:
    """Where a warm Connect server the benchmark started writes its event log (`--profile`)."""
    return folder / "connect-event-logs"


@contextmanager
def warm_connect_server(event_logs: Path | None = None) -> Iterator[None]:
    """A Spark Connect server on local[2] (started unless running, then stopped), writing its
    event log into `event_logs` if given (unless it was running), and the Airflow connection
    `CONNECT` to it in this process's environment."""
    if event_logs is not None:
        shutil.rmtree(event_logs, ignore_errors=True)
    started = spark_cluster.start("connect", profiling.event_log_conf(event_logs) if event_logs else None)
    if event_logs is not None and not started:
        print("the Spark Connect server ran before the benchmark, without its event log: no profile-connect.md",
              flush=True)
    variable = f"AIRFLOW_CONN_{CONNECT.upper()}"
    os.environ[variable] = json.dumps(spark_connection("connect"))
    try:
        yield
    finally:
        os.environ.pop(variable, None)
        spark_cluster.stop_named(started)


def measure(orders: int, servers: str, db_url: str, folder: Path, repetitions: int,
            profile: bool = False, connect: bool = True) -> Throughput:
    """The size's repetitions; with `connect`, each with the checkpoint over a warm Spark
    Connect server too."""
    topic = f"bench_{orders}"
    copies.delete_topic(servers, topic)
    try:
        with Stopwatch() as produced:
            produce(servers, orders, seed=orders, topic=topic, per_transaction=PER_TRANSACTION)
        done = []
        with warm_connect_server(connect_event_logs(folder) if profile else None) if connect else nullcontext():
            for repetition in range(repetitions):
                bench = Bench(orders, repetition, servers, db_url, folder, profile, connect)
                try:
                    done.append(bench.run())
                finally:
                    bench.remove()
        return Throughput(orders, produced.seconds, done)
    finally:
        copies.delete_topic(servers, topic)
