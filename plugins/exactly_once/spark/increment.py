"""One attempt of one checkpoint, in Spark: read the frozen ranges, parse (by the value
format), transform, check and make each sink's rows (exactly_once.spark.frames), write
staging from the executors isolating records that fail (exactly_once.spark.staging),
report what was staged to the task, which pre-commits it.

The job never decides ranges; it reads them from the ledger. Everything here
builds Spark plans from the pipeline configuration, so a new pipeline needs no
change to this module: its transform is a function named in its configuration.
"""

from __future__ import annotations

import json
import logging
import math
from collections.abc import Callable, Mapping
from functools import reduce

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from exactly_once import debezium, faults
from exactly_once.db import jdbc_options
from exactly_once.errors import JobFailure, is_retryable
from exactly_once.kafka_client import KafkaClient
from exactly_once.ledger.lost_offsets import PlannedInAnotherTopic, replaced
from exactly_once.ledger.planning import OffsetRange, layers
from exactly_once.ledger.protocol import Ledger
from exactly_once.ledger.refusals import Fenced
from exactly_once.schema_registry import SchemaRegistry
from exactly_once.spark.report import AttemptReport
from exactly_once.spark.staging import Staging

log = logging.getLogger(__name__)

_KAFKA_COLUMNS = ("key binary, value binary, topic string, partition int, offset bigint, timestamp timestamp, "
                  "headers array<struct<key: string, value: binary>>")
KAFKA_COLUMNS = ("key", "value", "topic", "partition", "offset", "timestamp", "headers")  # what the job reads
# Offsets per Spark task: a Kafka partition's range is split so that a task's cached
# records fit in memory whatever the range's size (one task per 1.5 M-record partition
# ran out of a 1 GiB heap), and the tasks balance over the cores; fewer when records may
# be large (`max_record_bytes`), so a task reads at most TASK_BYTES.
OFFSETS_PER_TASK = 250_000
TASK_BYTES = 256 * 2**20
# Small ranges (a topic of 512 partitions) are read several to a task, as many as fit a quarter
# of that bound, never onto fewer tasks than the cores: each task of each pass of the job has its
# cost (the write's COPY connection, say), so a checkpoint of 200,000 records over 512
# partitions ran its staging write in 512 tasks a pass (100 s, where 4 partitions took 21 s).
GROUPED_SHARE = 4
# A bounded read never waits for records to arrive, yet the broker holds a fetch with nothing
# to send up to fetch.max.wait.ms (500 ms), as Spark's consumer asks at each range's end: a noop
# read of 50,000 records over 512 partitions took 54-67 s with Kafka's wait, 9-11 s with 10 ms.
FETCH_WAIT_MS = "10"


def task_record_bytes(config) -> int | None:
    """What a task's offsets are sized by: `max_record_bytes`; for a change feed without it, the
    size of a typical event (a 1 M-event checkpoint of ~3 KB events with the JSON converter's
    schema part, in tasks of 250,000, ran out of the job's heap building the parsed cache)."""
    if config.max_record_bytes is None and config.source.envelope == "debezium":
        return debezium.EVENT_BYTES
    return config.max_record_bytes


def offsets_per_task(max_record_bytes: int | None) -> int:
    return OFFSETS_PER_TASK if max_record_bytes is None else max(1, min(OFFSETS_PER_TASK,
                                                                       TASK_BYTES // max_record_bytes))


def grouped_tasks(ranges: tuple[OffsetRange, ...], per_task: int, cores: Callable[[], int]) -> int | None:
    """How many Spark tasks read the ranges when Spark's Kafka source's own tasks (one a range,
    a range larger than `per_task` split evenly) are small enough that two or more of the
    largest fit `per_task // GROUPED_SHARE`; None: as the source splits them. Never fewer
    than `cores()`, asked only then."""
    sized = [r for r in ranges if r.size]
    parts = [math.ceil(r.size / per_task) for r in sized]
    if not parts:
        return None
    largest = max(math.ceil(r.size / n) for r, n in zip(sized, parts))
    together = per_task // GROUPED_SHARE // largest
    if together < 2:
        return None
    tasks = max(math.ceil(sum(parts) / together), cores())
    return tasks if tasks < sum(parts) else None


def parallelism(spark: SparkSession) -> int:
    """The cores the session's jobs run on: Spark's default parallelism; over Spark Connect,
    which has no SparkContext to ask, the partitions of a range the server splits by it."""
    if type(spark).__module__.startswith("pyspark.sql.connect"):
        split = spark.range(0, 1 << 16).select(F.spark_partition_id().alias("split"))  # no aggregate takes it raw
        return split.agg(F.max("split")).first()[0] + 1
    return spark.sparkContext.defaultParallelism


def kafka_source_options(kafka: KafkaClient, ranges: tuple[OffsetRange, ...],
                         max_record_bytes: int | None = None) -> dict[str, str]:
    """Options of Spark's Kafka source for exactly these (non-empty) ranges, read_committed,
    through the client config of the pipeline's Kafka connection, in tasks of a bounded size."""
    assign, starting, ending = {}, {}, {}
    for r in ranges:
        assign.setdefault(r.topic, []).append(r.partition)
        starting.setdefault(r.topic, {})[str(r.partition)] = r.start
        ending.setdefault(r.topic, {})[str(r.partition)] = r.end
    return {**kafka.spark_options(), "kafka.isolation.level": "read_committed",
            "kafka.fetch.max.wait.ms": FETCH_WAIT_MS, "failOnDataLoss": "true", "includeHeaders": "true",
            "assign": json.dumps(assign), "startingOffsets": json.dumps(starting), "endingOffsets": json.dumps(ending),
            "maxRecordsPerPartition": str(offsets_per_task(max_record_bytes))}


def read_ranges(spark: SparkSession, kafka: KafkaClient, ranges: tuple[OffsetRange, ...],
                max_record_bytes: int | None = None) -> DataFrame:
    """Exactly the committed records of the frozen ranges (read_committed; a range that
    ends on transaction markers or holds only aborted records yields what is committed):
    one read of Kafka per layer of ranges, as a read takes one range per partition; small
    ranges read together (`grouped_tasks`)."""
    reads = [spark.read.format("kafka").options(**kafka_source_options(kafka, layer, max_record_bytes)).load()
             .select(*KAFKA_COLUMNS) for layer in layers(ranges)]
    if not reads:
        return spark.createDataFrame([], _KAFKA_COLUMNS)
    records = reduce(DataFrame.unionAll, reads)
    tasks = grouped_tasks(ranges, offsets_per_task(max_record_bytes), lambda: parallelism(spark))
    return records if tasks is None else records.coalesce(tasks)


def require_planned_topics(ledger: Ledger, checkpoint_id: int, kafka: KafkaClient) -> None:
    """`PlannedInAnotherTopic` unless each topic the checkpoint's ranges were planned in still
    has the id recorded with them: a topic deleted and created again has a new one (KIP-516),
    and its records must not be read under offsets frozen for the old one's (promise 7).
    Ranges planned before ids were recorded are read unchecked. Asked from the driver only:
    executors' Python need not have confluent-kafka."""
    from exactly_once.ledger.kafka_offsets import KafkaOffsets

    with ledger.rows() as rows:
        recorded = rows.topic_ids(checkpoint_id)
    if not recorded:
        return
    with KafkaOffsets(kafka) as offsets:
        for topic, partitions in sorted(recorded.items()):
            now = offsets.topic_id(topic)
            for was in sorted(set(partitions.values())):
                if replaced(was, now):
                    raise PlannedInAnotherTopic(ledger.config.name, checkpoint_id, topic,
                                                sorted(p for p, i in partitions.items() if i == was), was, now)


def run_attempt(spark: SparkSession, ledger: Ledger, checkpoint_id: int, attempt: int, token: str,
                kafka: KafkaClient, jdbc: Mapping[str, str], registry: SchemaRegistry | None = None) -> AttemptReport:
    """Executes the attempt: stages its rows, which its task then pre-commits from the
    report (`exactly_once.orchestration.tasks.run_increment`); `token` is the attempt's,
    which the ledger's staging functions ask for. Raises `Fenced` if it is not (or no
    longer, once staged) the checkpoint's current attempt, `PlannedInAnotherTopic` before it reads
    if a topic was created again since its ranges were planned, `BadRecords` under the `fail`
    policy, `NotIsolated` if a write fails because of records that isolation cannot single out."""
    report = AttemptReport()
    checkpoint = ledger.current(checkpoint_id, attempt)  # Fenced before it reads anything
    log.info("checkpoint %s attempt %s: ranges %s", checkpoint_id, attempt,
             ", ".join(f"{r.topic}[{r.partition}] {r.start}..{r.end}" for r in checkpoint.ranges))
    require_planned_topics(ledger, checkpoint_id, kafka)  # before anything is read or staged
    staging = Staging(ledger, checkpoint, attempt, token, jdbc, registry)
    with ledger.rows() as rows:
        set_aside = rows.dead_lettered(checkpoint.ranges)

    faults.point("increment.before_read")
    records = read_ranges(spark, kafka, checkpoint.ranges, task_record_bytes(ledger.config))
    report.records, report.rows = staging.write_isolating(records, set_aside, report.phase)
    faults.point("increment.before_pre_commit")
    ledger.current(checkpoint_id, attempt)  # Fenced meanwhile (a zombie): it says so, and exits 3
    log.info("checkpoint %s attempt %s staged: %s records read, rows per sink %s, seconds per phase %s",
             checkpoint_id, attempt, report.records, report.rows, report.seconds)
    return report


def execute_attempt(spark: SparkSession, ledger: Ledger, checkpoint_id: int, attempt: int, token: str,
                    kafka: KafkaClient, db_url: str, registry: SchemaRegistry | None = None) -> AttemptReport:
    """`run_attempt`, a failure raised as the `JobFailure` its task records on the attempt:
    its text and whether a retry may help, whatever ran the job (spark-submit, a cluster,
    an in-process session). `Fenced` stays itself: the attempt is no longer the
    checkpoint's to change."""
    try:
        return run_attempt(spark, ledger, checkpoint_id, attempt, token, kafka, jdbc_options(db_url), registry)
    except Fenced:
        raise
    except Exception as error:
        try:  # fenced meanwhile, the ledger's staging functions refused the zombie: it says so, and exits 3
            ledger.current(checkpoint_id, attempt)
        except Fenced:
            raise
        except Exception:
            pass  # the ledger out of reach too: the job's own error says more
        raise JobFailure(f"{type(error).__name__}: {error}", is_retryable(error)) from error
