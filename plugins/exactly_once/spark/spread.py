"""Pieces of a checkpoint's records, each in a Spark task of its own, so that the task a
failure names says which piece failed (record isolation's `locate`,
exactly_once.spark.isolation).

Spark puts a row of `repartition(n, column)` in the partition pmod(Murmur3(column, 42), n),
and runs partition i in the stage's task of index i. Each piece gets a label whose hash lands
in a partition of its own, so task i holds piece i and nothing else; the driver's status
store says which tasks failed (`FailedTasks`).
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator, Sequence
from contextlib import contextmanager

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from exactly_once.ledger.planning import OffsetRange
from exactly_once.spark.frames import in_ranges, sql_string
from exactly_once.spark.isolation import Located

_MASK = 0xFFFFFFFF
_SEED = 42  # Spark's HashPartitioning hashes with Murmur3Hash's default seed
_PIECE, _TOPIC, _PARTITION, _START, _END = "_piece", "_piece_topic", "_piece_partition", "_piece_start", "_piece_end"
_GROUP_PROPERTIES = ("spark.jobGroup.id", "spark.job.description", "spark.job.interruptOnCancel")
# Offsets in blocks of this many: a block that holds none of the cached records (an aborted
# transaction's, a compacted topic's) is left out of the pieces a search starts from, so that
# the offsets after a task's last row reach the next record. A record right after an aborted
# transaction cost the sweep two more levels of 32 tasks each (issue 63).
GAP = 1024


def _rotl(x: int, r: int) -> int:
    return ((x << r) | (x >> (32 - r))) & _MASK


def murmur3_int(value: int, seed: int = _SEED) -> int:
    """Spark's Murmur3_x86_32.hashInt: what `F.hash` of an int column gives."""
    k1 = _rotl((value & _MASK) * 0xCC9E2D51 & _MASK, 15) * 0x1B873593 & _MASK
    h1 = (_rotl(seed ^ k1, 13) * 5 + 0xE6546B64) & _MASK
    h1 ^= 4  # the input's length in bytes
    h1 ^= h1 >> 16
    h1 = h1 * 0x85EBCA6B & _MASK
    h1 ^= h1 >> 13
    h1 = h1 * 0xC2B2AE35 & _MASK
    h1 ^= h1 >> 16
    return h1 - (1 << 32) if h1 & 0x80000000 else h1


def labels(n: int) -> list[int]:
    """For each of n partitions, an int that `repartition(n, column)` puts there."""
    found: dict[int, int] = {}
    value = 0
    while len(found) < n:
        found.setdefault(murmur3_int(value) % n, value)
        value += 1
    return [found[p] for p in range(n)]


def spread(parsed: DataFrame, split: Sequence[Sequence[OffsetRange]]) -> DataFrame:
    """The records of the pieces, piece i in Spark partition i (no other record)."""
    named = labels(len(split))
    # Each record's piece by a join with the pieces' ranges, broadcast: a hash lookup of its
    # partition's ranges. A CASE of a test a piece computed it 2-3 times slower for 60 pieces
    # over 900,000 records (issue 63). The ranges are SQL values, which need no Spark job to
    # broadcast; the filter before the join lets the cache skip its batches outside them.
    ranges = parsed.sparkSession.sql(
        "SELECT * FROM VALUES " + ", ".join(f"({sql_string(r.topic)}, {int(r.partition)}, {int(r.start)}L, "
                                            f"{int(r.end)}L, {named[i]})" for i, part in enumerate(split) for r in part)
        + f" AS ranges({_TOPIC}, {_PARTITION}, {_START}, {_END}, {_PIECE})")
    held = ((F.col("topic") == F.col(_TOPIC)) & (F.col("partition") == F.col(_PARTITION))
            & (F.col("offset") >= F.col(_START)) & (F.col("offset") < F.col(_END)))
    # Spark pushes filters down through a repartition, so a filter of the transform that
    # calls a UDF would run in the task that read the records, not in the piece's. The reason
    # computed after it by a non-deterministic expression (the same reason in any partition;
    # Spark folded a random number's test away) stops them: every step filters on it.
    kept = F.when(F.spark_partition_id() >= 0, F.col("reason"))
    return (parsed.where(in_ranges([r for part in split for r in part])).join(F.broadcast(ranges), held)
            .drop(_TOPIC, _PARTITION, _START, _END).repartition(len(split), _PIECE).drop(_PIECE)
            .withColumn("reason", kept))


def cached_pieces(parsed: DataFrame) -> list[list[OffsetRange]]:
    """The offsets of each partition of the cached records, by partition index: the pieces a
    job's tasks over them read (a Kafka range's records are split into contiguous chunks),
    without the blocks of GAP offsets that hold none of them."""
    pieces: list[list[OffsetRange]] = [[] for _ in range(parsed.rdd.getNumPartitions())]
    held = parsed.groupBy(F.spark_partition_id().alias("p"), "topic", "partition",
                          F.expr(f"`offset` div {GAP}").alias("block")).agg(
        F.min("offset").alias("first"), F.max("offset").alias("last"))
    block_before: dict[tuple[int, str, int], int] = {}
    for row in sorted(held.collect()):
        ranges, chunk = pieces[row.p], (row.p, row.topic, row.partition)
        if block_before.get(chunk) == row.block - 1:
            ranges[-1] = OffsetRange(row.topic, row.partition, ranges[-1].start, row.last + 1)
        else:
            ranges.append(OffsetRange(row.topic, row.partition, row.first, row.last + 1))
        block_before[chunk] = row.block
    return pieces


class FailedTasks:
    """Which tasks of a job failed, asked of the driver's status store: a failed job's error
    does not say (Spark 4 raises the failed task's own error). Local and spark-submit jobs
    only: a Spark Connect client has no driver to ask (`of` gives None)."""

    def __init__(self, session: SparkSession):
        self.context = session.sparkContext
        self.store = self.context._jsc.sc().statusStore()

    @classmethod
    def of(cls, session: SparkSession) -> FailedTasks | None:
        try:
            return cls(session)
        except Exception:  # Spark Connect: no SparkContext
            return None

    @contextmanager
    def group(self, description: str = "record isolation: which piece fails") -> Iterator[str]:
        """Runs the jobs started inside under a job group of their own, which it yields; the
        thread's group before it is put back after."""
        before = {key: self.context.getLocalProperty(key) for key in _GROUP_PROPERTIES}
        name = f"exactly_once-{uuid.uuid4().hex}"
        self.context.setJobGroup(name, description)
        try:
            yield name
        finally:
            for key, value in before.items():
                self.context.setLocalProperty(key, value)

    def outcome(self, group: str, tasks: int) -> tuple[set[int], set[int]]:
        """The partitions whose tasks failed and those whose tasks passed, in the stages of the
        group's failed jobs that ran `tasks` tasks and had a task fail (none if the task that
        failed was in another stage). The status store learns of the jobs' ends after their
        tasks' ends: waits (up to 2 s) until it knows every job of the group ended."""
        tracker = self.context.statusTracker()
        deadline = time.monotonic() + 2
        while True:
            jobs = [tracker.getJobInfo(job) for job in tracker.getJobIdsForGroup(group)]
            if all(job is not None and job.status != "RUNNING" for job in jobs) or time.monotonic() > deadline:
                break
            time.sleep(0.05)
        stages = [tracker.getStageInfo(stage) for job in jobs if job is not None and job.status == "FAILED"
                  for stage in job.stageIds]
        failed, passed = set(), set()
        for stage in (s for s in stages if s is not None and s.numTasks == tasks and s.numFailedTasks > 0):
            listed = self.store.taskList(stage.stageId, stage.currentAttemptId, tasks * 8)
            for task in (listed.apply(i) for i in range(listed.size())):
                {"FAILED": failed, "SUCCESS": passed}.get(task.status(), set()).add(task.index())
        return failed, passed - failed

    def located(self, group: str, pieces: int, why: str) -> Located | None:
        """What the group's failed job says of its pieces, task i piece i; None if it names
        none of their tasks failed."""
        failed, passed = self.outcome(group, pieces)
        return Located(frozenset(failed), frozenset(passed), why) if failed else None

    def failed_write(self, parsed: DataFrame, group: str, why: str) -> tuple[list[list[OffsetRange]], Located] | None:
        """The failed write's own tasks as a located probe's: a stage that reads the cached
        records runs a task per partition of them, in order."""
        hit = self.located(group, parsed.rdd.getNumPartitions(), why)
        return None if hit is None else (cached_pieces(parsed), hit)
