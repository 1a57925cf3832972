"""A benchmark's checkpoint, run as the pipeline's tasks run it
(`exactly_once.orchestration.tasks`) and timed task by task: the plan, the increment task
around its Spark job, the task's pre-commit, the commit's transaction and the staging
clean-up after it (the ledger's fault points, timed). `submitted` runs one with its job by
spark-submit, as the benchmarks' checkpoint rows do."""

from __future__ import annotations

import time
from collections.abc import Callable
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path

import psycopg2

from exactly_once import faults
from exactly_once.config import PipelineConfig
from exactly_once.connections import PIPELINE_DB_JOB, pipeline_db_url
from exactly_once.kafka_client import KafkaClient
from exactly_once.ledger.checkpoints import Checkpoint, Outcome
from exactly_once.ledger.kafka_offsets import KafkaOffsets
from exactly_once.ledger.protocol import Ledger
from exactly_once.orchestration import tasks
from exactly_once.spark.report import AttemptReport
from exactly_once.spark.settings import JobSettings
from exactly_once.spark.shipping import launcher
from tests.benchmarks.spark_app import SparkRun, increment_job
from tests.benchmarks.stopwatch import Stopwatch

Execute = Callable[[list[str]], AttemptReport]  # runs the attempt's Spark job (tests/benchmarks/spark_app.py)


@dataclass(frozen=True)
class CheckpointRun:
    plan: float                 # seconds
    start_attempt: float        # and the attempt's token, around the job
    pre_commit: float           # the task's pre-commit of what the job reported
    job: SparkRun               # its report: records, rows per sink, seconds per phase
    commit: float               # the commit's transaction
    clean_up: float             # the staging clean-up after it

    @property
    def end_to_end(self) -> float:
        return self.plan + self.start_attempt + self.job.seconds + self.pre_commit + self.commit + self.clean_up

    def phase(self, name: str) -> float:
        return self.job.report["seconds"][name]

    @property
    def spark_start_stop(self) -> float:
        """The job's time outside its measured phases: JVM and session start (or a Connect
        client's session), reading the ledger, stop."""
        return self.job.seconds - sum(self.job.report["seconds"].values())


class TimedPipeline:
    """A pipeline whose ledger's fault points are timed."""

    def __init__(self, config: PipelineConfig, db_url: str):
        self.marks: dict[str, float] = {}
        self.ledger = Ledger(config, lambda: psycopg2.connect(db_url), fault=self.mark)

    def mark(self, point: str) -> None:
        self.marks[point] = time.perf_counter()
        faults.point(point)

    def plan(self, servers: str, run_id: str = "benchmark") -> tuple[Checkpoint, float]:
        """The checkpoint `begin_checkpoint` freezes for the run `run_id` (all the topic's records
        no earlier checkpoint holds), and its seconds."""
        with KafkaOffsets(KafkaClient.at(servers)) as kafka, Stopwatch() as plan:
            checkpoint = tasks.begin_checkpoint(self.ledger, kafka, run_id, None,
                                                datetime.now(timezone.utc)).checkpoint
        return checkpoint, plan.seconds

    def run(self, checkpoint_id: int, plan: float, execute: Execute, jobs: list[SparkRun],
            around: Callable[[str], AbstractContextManager] = lambda task: nullcontext(),
            before_commit: Callable[[], object] = lambda: None) -> CheckpointRun:
        """The increment task with `execute` (which appends its run to `jobs`), then the commit
        task; `around(task)` wraps each task, `before_commit` runs between them, untimed."""
        def job_then_mark(arguments: list[str]) -> AttemptReport:
            report = execute(arguments)
            self.marks["job_ended"] = time.perf_counter()
            return report

        with around("the increment task"), Stopwatch() as increment:
            tasks.run_increment(self.ledger, checkpoint_id, job_then_mark)
        pre_commit = self.marks["pre_commit.before_commit"] - self.marks["job_ended"]
        before_commit()
        with around("the commit task"), Stopwatch() as commit:
            outcome = tasks.commit_checkpoint(self.ledger, checkpoint_id, try_number=1)
        if outcome is not Outcome.COMMITTED:
            raise AssertionError(f"{self.ledger.config.name}: checkpoint {checkpoint_id} {outcome}")
        transaction = self.marks["commit.before_clean_up"] - commit.started
        [job] = jobs
        return CheckpointRun(plan, increment.seconds - job.seconds - pre_commit, pre_commit, job, transaction,
                             commit.seconds - transaction)


def job_settings(servers: str) -> JobSettings:
    """As IncrementOperator hands them over: the job role's database connection."""
    return JobSettings(pipeline_db_url(PIPELINE_DB_JOB), KafkaClient.at(servers))


def submitted(pipeline: TimedPipeline, checkpoint_id: int, plan: float, servers: str, log: Path,
              conf: dict[str, str] | None = None,
              around: Callable[[str], AbstractContextManager] = lambda task: nullcontext(),
              before_commit: Callable[[], object] = lambda: None, cpu: bool = False) -> CheckpointRun:
    """The planned checkpoint run on, its job by spark-submit (Spark settings `conf`, its output
    in `log`, its threads' CPU read if `cpu`); `around` and `before_commit` as `TimedPipeline.run`
    takes them."""
    jobs: list[SparkRun] = []
    with job_settings(servers).written() as settings_file:
        return pipeline.run(checkpoint_id, plan, increment_job(launcher(), settings_file, log, jobs, conf, cpu), jobs,
                            around=around, before_commit=before_commit)
