"""One attempt of one checkpoint, in Spark: read the frozen ranges, parse (by the value
format), transform, make each sink's rows (by its mode), write staging from the
executors, pre-commit.

The job never decides ranges; it reads them from the ledger. Everything here
builds Spark plans from the pipeline configuration, so a new pipeline needs no
change to this module: its transform is a function named in its configuration.
"""

from __future__ import annotations

import importlib
import json
import logging
import time
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field

from pyspark import StorageLevel
from pyspark.sql import DataFrame, Observation, SparkSession
from pyspark.sql import functions as F

from exactly_once import faults
from exactly_once.checkpoints import Committable
from exactly_once.config import KAFKA_OFFSET, KAFKA_PARTITION, KAFKA_TOPIC, ConfigError, PipelineConfig
from exactly_once.db import jdbc_options
from exactly_once.errors import Permanent, is_retryable
from exactly_once.formats import format_of
from exactly_once.planning import OffsetRange
from exactly_once.protocol import Ledger
from exactly_once.tables import DEAD_LETTERS, qualified, staging_table

log = logging.getLogger(__name__)

KAFKA_TIMESTAMP = "kafka_timestamp"
_KAFKA_COLUMNS = "key binary, value binary, topic string, partition int, offset bigint, timestamp timestamp"
KAFKA_COLUMNS = ("key", "value", "topic", "partition", "offset", "timestamp")  # what the job reads of a record
# Offsets per Spark task: a Kafka partition's range is split so that a task's cached
# records fit in memory whatever the range's size (one task per 1.5 M-record partition
# ran out of a 1 GiB heap), and the tasks balance over the cores.
OFFSETS_PER_TASK = 250_000


class BadRecords(Permanent):
    """Records that do not fit the schema, in a pipeline whose policy is to fail."""


@dataclass
class AttemptReport:
    """What the attempt did, for its log and the checkpoint history."""

    records: int = 0
    rows: dict[str, int] = field(default_factory=dict)
    seconds: dict[str, float] = field(default_factory=dict)

    @contextmanager
    def phase(self, name: str) -> Iterator[None]:
        started = time.monotonic()
        yield
        self.seconds[name] = round(time.monotonic() - started, 3)


def kafka_source_options(bootstrap_servers: str, ranges: tuple[OffsetRange, ...]) -> dict[str, str]:
    """Options of Spark's Kafka source for exactly these (non-empty) ranges, read_committed."""
    assign, starting, ending = {}, {}, {}
    for r in ranges:
        assign.setdefault(r.topic, []).append(r.partition)
        starting.setdefault(r.topic, {})[str(r.partition)] = r.start
        ending.setdefault(r.topic, {})[str(r.partition)] = r.end
    return {"kafka.bootstrap.servers": bootstrap_servers, "kafka.isolation.level": "read_committed",
            "failOnDataLoss": "true", "assign": json.dumps(assign), "startingOffsets": json.dumps(starting),
            "endingOffsets": json.dumps(ending), "maxRecordsPerPartition": str(OFFSETS_PER_TASK)}


def read_ranges(spark: SparkSession, bootstrap_servers: str, ranges: tuple[OffsetRange, ...]) -> DataFrame:
    """Exactly the committed records of the frozen ranges (read_committed; a range that
    ends on transaction markers or holds only aborted records yields what is committed)."""
    wanted = tuple(r for r in ranges if r.size)
    if not wanted:
        return spark.createDataFrame([], _KAFKA_COLUMNS)
    return (spark.read.format("kafka").options(**kafka_source_options(bootstrap_servers, wanted)).load()
            .select(*KAFKA_COLUMNS))


def parse(records: DataFrame, config: PipelineConfig) -> DataFrame:
    """The records with `parsed` (the value by the schema) and `reason` (null when it fits)."""
    return format_of(config.source.value_format).parse(records, config.source.value_schema)


def good_rows(parsed: DataFrame) -> DataFrame:
    """Fitting records as columns of the schema plus their Kafka coordinates."""
    return parsed.where(F.col("reason").isNull()).select(
        "parsed.*", F.col("topic").alias(KAFKA_TOPIC), F.col("partition").alias(KAFKA_PARTITION),
        F.col("offset").alias(KAFKA_OFFSET), F.col("timestamp").alias(KAFKA_TIMESTAMP))


def dead_letters(parsed: DataFrame, pipeline: str) -> DataFrame:
    return parsed.where(F.col("reason").isNotNull()).select(
        F.lit(pipeline).alias("pipeline"), "topic", "partition", "offset", "key", "value", "reason")


def transform_of(config: PipelineConfig) -> Callable[[DataFrame], DataFrame]:
    if config.transform is None:
        return lambda frame: frame
    module, _, function = config.transform.partition(":")
    try:
        return getattr(importlib.import_module(module), function)
    except (ImportError, AttributeError) as error:
        raise ConfigError(f"pipeline {config.name!r}: transform {config.transform!r} cannot be loaded: {error}") \
            from error


def write_jdbc(frame: DataFrame, table: str, jdbc: Mapping[str, str]) -> None:
    """Appends the rows to `table` from the executors in parallel. Each Spark task writes in
    one transaction, so a retried task does not leave half its rows behind."""
    frame.write.format("jdbc").options(**jdbc).option("dbtable", table).option("batchsize", 10_000) \
        .mode("append").save()


def write_staging(frame: DataFrame, table: str, jdbc: Mapping[str, str], checkpoint_id: int, attempt: int) -> int:
    """Appends the rows, tagged (checkpoint, attempt), and returns how many were written:
    counted as they pass into the write (an Observation, which counts the successful
    attempt of each Spark task once), so the rows are computed once."""
    written = Observation(f"rows written to {table}")
    tagged = frame.withColumns({"checkpoint_id": F.lit(checkpoint_id), "attempt": F.lit(attempt)})
    write_jdbc(tagged.observe(written, F.count(F.lit(1)).alias("rows")), table, jdbc)
    return written.get["rows"]


def sink_frames(parsed: DataFrame, config: PipelineConfig, columns: Mapping[str, list[str]]) -> dict[str, DataFrame]:
    """What each sink receives from the parsed records, the dead letters first: the rows
    an attempt stages, keyed by sink name (DEAD_LETTERS for the bad records)."""
    rows = transform_of(config)(good_rows(parsed))
    return {DEAD_LETTERS: dead_letters(parsed, config.name),
            **{sink.name: sink.strategy.staging_rows(rows, sink, columns[sink.name]) for sink in config.sinks}}


def run_attempt(spark: SparkSession, ledger: Ledger, checkpoint_id: int, attempt: int, bootstrap_servers: str,
                jdbc: Mapping[str, str]) -> tuple[Committable, AttemptReport]:
    """Executes the attempt and pre-commits it. Raises `Fenced` if it is no longer the
    checkpoint's current attempt, `BadRecords` under the `fail` policy."""
    config, report = ledger.config, AttemptReport()
    checkpoint = ledger.current(checkpoint_id, attempt)  # Fenced before it reads anything
    log.info("checkpoint %s attempt %s: ranges %s", checkpoint_id, attempt,
             ", ".join(f"{r.topic}[{r.partition}] {r.start}..{r.end}" for r in checkpoint.ranges))
    columns = ledger.final_columns()

    faults.point("increment.before_read")
    with report.phase("read"):
        parsed = parse(read_ranges(spark, bootstrap_servers, checkpoint.ranges), config)
        parsed.persist(StorageLevel.MEMORY_AND_DISK)
        report.records = parsed.count()
    try:
        frames = sink_frames(parsed, config, columns)
        if config.on_bad_record == "fail":
            first = frames[DEAD_LETTERS].limit(5).collect()
            if first:
                raise BadRecords(f"pipeline {config.name!r} fails on bad records; checkpoint {checkpoint_id} read "
                                 + "; ".join(f"{r.topic}[{r.partition}]@{r.offset}: {r.reason}" for r in first))
        faults.point("increment.before_write")
        with report.phase("write_staging"):
            for name, frame in frames.items():
                report.rows[name] = write_staging(frame, qualified(staging_table(config, name)), jdbc,
                                                  checkpoint_id, attempt)
                faults.point(f"increment.wrote.{name}")
    finally:
        parsed.unpersist()
    faults.point("increment.before_pre_commit")
    with report.phase("pre_commit"):
        committable = ledger.pre_commit(checkpoint_id, attempt, report.rows, report.records)
    log.info("checkpoint %s attempt %s pre-committed: %s records read, rows per sink %s, seconds per phase %s",
             checkpoint_id, attempt, report.records, report.rows, report.seconds)
    return committable, report


def execute_attempt(spark: SparkSession, ledger: Ledger, checkpoint_id: int, attempt: int, bootstrap_servers: str,
                    db_url: str) -> AttemptReport:
    """`run_attempt`, with a failure recorded on the attempt together with whether a retry
    may help: the task that started the attempt reads that verdict from the ledger,
    whatever ran the job (spark-submit, a cluster, an in-process session). A fenced
    attempt records nothing: it is no longer the checkpoint's to change."""
    try:
        return run_attempt(spark, ledger, checkpoint_id, attempt, bootstrap_servers, jdbc_options(db_url))[1]
    except Exception as error:
        ledger.abort_attempt(checkpoint_id, attempt, f"{type(error).__name__}: {error}", is_retryable(error))
        raise
