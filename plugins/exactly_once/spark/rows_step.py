"""The first step of an attempt's staging write, the transform and the row checks, run to the
end of every Spark task where the driver's JVM can run it so (exactly_once.spark.task_failures):
over the cached records into the checked rows' cache (those a round computes again,
exactly_once.spark.kept_rows), naming every task that fails; over pieces
of the records for record isolation's sweeps; and, elsewhere, as a probe into Spark's noop sink."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping

from pyspark.sql import DataFrame

from exactly_once.catalog import ColumnType
from exactly_once.config import PipelineConfig
from exactly_once.ledger.planning import OffsetRange
from exactly_once.ledger.tables import DEAD_LETTERS
from exactly_once.spark.frames import COORDINATES, AttemptFrames, SetAside, checked_rows, with_set_aside
from exactly_once.spark.isolation import ROWS, Unlocated
from exactly_once.spark.kept_rows import KeptRows, Round
from exactly_once.spark.spread import spread
from exactly_once.spark.step_failed import StepFailed
from exactly_once.spark.sweeps import Failed
from exactly_once.spark.task_failures import TaskFailure, task_failures, task_failures_over
from exactly_once.sqlstates import record_failure

log = logging.getLogger(__name__)
SHOWN = 10  # failed pieces a sweep's log line names, with where their tasks failed


def check(kept: KeptRows, set_aside: SetAside, records: DataFrame, transform: str | None) -> None:
    """The write's first pass: a round's checked rows computed into their cache (those of the
    partitions no cache of `kept` holds whole), every task over the cached `records` to its end
    where the driver's JVM can run them so, and what it computed whole told to `kept`.
    `StepFailed` naming every task (the records' partition) that failed, where it stopped, and
    why the first did (one whose error is not a record's first)."""
    try:
        swept = _check(kept.round(set_aside), records, transform)
    except StepFailed as failed:
        kept.settle(sorted(failed.tasks) if failed.tasks else None)
        raise
    kept.settle([] if swept else None)


def _check(this_round: Round, records: DataFrame, transform: str | None) -> bool:
    """`check`'s pass; whether its tasks ran to their end (not over Spark Connect, nor for a
    transform with a shuffle of its own: the refusals' count computes its rows then)."""
    if this_round.computed is None:
        return True  # every row kept from the rounds before
    try:
        failed = task_failures_over(this_round.computed, records, this_round.partitions)
    except Exception as error:
        raise StepFailed(DEAD_LETTERS, error, transform, ROWS) from error
    if failed:
        first = failed[min(failed, key=lambda i: (record_failure(failed[i].error) is not None, i))].error
        if record_failure(first) is None:  # no record's: raised as it is
            raise StepFailed(DEAD_LETTERS, first, transform, ROWS) from first
        stops = {i: _stopped(f, transform) for i, f in sorted(failed.items())}
        log.info("the write's first pass: %d tasks failed%s", len(stops),
                 _where_stopped(stops, lambda i: f"partition {i}"))
        raise StepFailed(DEAD_LETTERS, first, transform, ROWS, tasks=stops) from first
    return failed is not None


def _stopped(failure: TaskFailure, transform: str | None) -> Failed:
    """How a task failed, with the last record whose rows it gave; an error no record causes is raised."""
    why = StepFailed(DEAD_LETTERS, failure.error, transform, ROWS).reason
    if why is None:
        raise failure.error
    after = failure.after
    return Failed(why, None if after is None else OffsetRange(after[0], after[1], after[2], after[2] + 1), failure.read)


def sweep(parsed: DataFrame, set_aside: SetAside, split: list[list[OffsetRange]], udf_batch: int,
          config: PipelineConfig, columns: Mapping[str, list[ColumnType]]) -> dict[int, Failed]:
    """The step over the pieces at once, piece i in Spark task i, every task to its end, a Python
    UDF getting `udf_batch` rows at once: why each piece that fails does, and the last record whose
    rows its task gave before, by index; `Unlocated` where the tasks are not the pieces, or a job
    failed because of records without saying which. An error no record causes is raised."""
    started = time.monotonic()
    checked = checked_rows(with_set_aside(spread(parsed, split), set_aside), config, columns)
    try:
        failures = task_failures(checked, len(split), COORDINATES, udf_batch)
    except Exception as error:
        if record_failure(error) is None:
            raise
        raise Unlocated(str(error)) from error
    if failures is None:
        raise Unlocated("the step's tasks are not the pieces")
    found = {index: _stopped(failure, config.transform) for index, failure in failures.items()}
    log.info("probe: a sweep of %d pieces, %d failing, %d rows a UDF batch (%.1f s)%s", len(split), len(found),
             udf_batch, time.monotonic() - started, _where_stopped(found, lambda i: _offsets(split[i])))
    return found


def _where_stopped(found: Mapping[int, Failed], named: Callable[[int], str]) -> str:
    """Where the first failed tasks stopped, each named by its index, for the log."""
    shown = sorted(found.items())[:SHOWN]
    return "".join(f"; {named(i)} failed after "
                   + (_offsets([f.after]) if f.after else "no row" if f.read else "rows not read")
                   for i, f in shown) + ("; …" if len(found) > len(shown) else "")


def _offsets(ranges: list[OffsetRange]) -> str:
    return ", ".join(f"{r.topic}[{r.partition}]@{r.start}" + (f"..{r.end}" if r.size > 1 else "") for r in ranges)


def check_rows(parsed: DataFrame, config: PipelineConfig, columns: Mapping[str, list[ColumnType]]) -> None:
    """The checked rows computed as the write's cache of them computes them (every column a
    sink reads, by the transform, and the row checks), into Spark's noop sink; `StepFailed`."""
    try:
        checked_rows(parsed, config, columns).write.format("noop").mode("overwrite").save()
    except Exception as error:
        raise StepFailed(DEAD_LETTERS, error, config.transform, ROWS) from error


def first_bad(frames: AttemptFrames, transform: str | None) -> list:
    """Some bad records of the table-by-table write, computed by the transform and the row
    checks; `StepFailed` if they fail (a UDF raising on a record: isolation names it, and the
    policy `fail` fails on it)."""
    try:
        return frames.bad.limit(5).collect()
    except Exception as error:
        raise StepFailed(DEAD_LETTERS, error, transform, ROWS) from error


def refusals(frames: AttemptFrames, transform: str | None) -> int:
    """How many records a sink table would refuse, in the table-by-table write: the refusals
    computed (and cached, for every sink's write) by the transform and the row checks;
    `StepFailed` if they fail."""
    try:
        return frames.refused.count()
    except Exception as error:
        raise StepFailed(DEAD_LETTERS, error, transform, ROWS) from error
