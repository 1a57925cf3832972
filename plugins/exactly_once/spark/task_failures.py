"""Record isolation's sweep (exactly_once.spark.sweeps) on the driver's JVM: a
frame whose tasks each hold a known part of the records computed to the end of every task, the
error a task's rows raise kept as that task's result (jvm/: exactly_once.isolation.TaskFailures),
so one job names every task that fails. Its tasks hold either the pieces of a spread
(exactly_once.spark.spread) or the partitions of the attempt's cached records, whose first pass
of the write (the checked rows into their cache) is so a sweep too."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

from py4j.java_gateway import JavaClass
from py4j.protocol import Py4JError, Py4JJavaError, Py4JNetworkError
from pyspark.errors.exceptions.captured import convert_exception
from pyspark.sql import DataFrame
from pyspark.sql import functions as F
from pyspark.sql.classic.column import Column, _to_java_column

from exactly_once.spark.frames import COORDINATES, NOTED

ADAPTIVE = "spark.sql.adaptive.enabled"
# The rows a Python UDF gets at once: Arrow-optimized (and pandas) UDFs', pickled UDFs'.
UDF_BATCHES = ("spark.sql.execution.arrow.maxRecordsPerBatch", "spark.sql.execution.python.udf.maxRecordsPerBatch")


@dataclass(frozen=True)
class TaskFailure:
    error: Exception
    after: tuple[str, int, int] | None  # the Kafka coordinates of the last row the task gave before it failed
    read: bool  # whether the task's rows were read (else `after` is None, knowing nothing)


def task_failures(frame: DataFrame, pieces: int, coordinates: Sequence[str],
                  udf_batch: int | None = None) -> dict[int, TaskFailure] | None:
    """The error of each task of the frame whose rows raised, by task index, as PySpark raises
    a failed job's (the same message), with the coordinates (the frame's columns named by
    `coordinates`: topic, partition, offset) of the last row the task gave before it; None,
    running nothing, when its tasks are not the spread's `pieces` (a transform with a shuffle
    of its own), no JVM can be asked (Spark Connect) or the errors cannot be read back on the
    driver. `udf_batch`: the rows a Python UDF gets at once in its job (a UDF gives no row of a
    batch it raises on). Only a task's last attempt keeps its error: Spark runs an earlier one
    again, as for any failed task. The frame must not have been planned before (it is planned
    here without adaptive execution, which would run the stages below its last shuffle while
    planning it). A job that fails anyway (an error Java cannot carry back, a lost executor)
    raises its error."""
    batches = {} if udf_batch is None else dict.fromkeys(UDF_BATCHES, str(udf_batch))
    types = dict(frame.dtypes)
    read = [types.get(name) for name in coordinates] == ["string", "int", "bigint"]  # as the JVM finds them
    failed = _swept(frame, lambda failures: failures.of(frame._jdf, pieces, list(coordinates)), batches)
    return None if failed is None else _failures(failed, read)


def task_failures_over(frame: DataFrame, cached: DataFrame,
                       partitions: Sequence[int] | None = None) -> dict[int, TaskFailure] | None:
    """The error of each task of a frame whose task i reads partition i of the `cached` frame's
    cache and no other (no shuffle), as `task_failures`; only the tasks of `partitions` when
    given. A frame itself cached is computed into its cache, where its rows are not read: the
    last row a task gave is known where the frame has the column `noting_last_rows` adds. A
    cached frame's plan is adaptive (cached before this turns that off), so a shuffle of its own
    is found only after its stages below it ran (reused by its later jobs): None, or their error."""
    def over(failures):  # an older jar has no `over` of some partitions
        return failures.over(frame._jdf, cached._jdf) if partitions is None else \
            failures.over(frame._jdf, cached._jdf, list(partitions))
    failed = _swept(frame, over, {})
    return None if failed is None else _failures(failed, read=NOTED in frame.columns)


def _failures(failed: list, read: bool) -> dict[int, TaskFailure]:
    """The JVM's outcomes of the tasks that failed, by task index."""
    return {int(index): TaskFailure(convert_exception(error), None if offset is None else (topic, partition, offset),
                                    read) for index, error, topic, partition, offset in failed}


def noting_last_rows(checked: DataFrame) -> DataFrame:
    """The checked rows with a column that notes, as their task's rows pass into a cache, the
    last one it gave (the jar's LastRows), so that `task_failures_over` can say where a failed
    task stopped; as they are where no JVM can note them (Spark Connect, an older jar)."""
    last_rows = _last_rows(checked)
    if last_rows is None:
        return checked
    return checked.withColumn(NOTED, Column(last_rows.noting(*(_to_java_column(F.col(c)) for c in COORDINATES))))


def _last_rows(frame: DataFrame) -> JavaClass | None:
    try:
        found = frame.sparkSession.sparkContext._jvm.exactly_once.isolation.LastRows
    except Exception:  # Spark Connect: no SparkContext
        return None
    return found if isinstance(found, JavaClass) else None


def _swept(frame: DataFrame, sweep: Callable, settings: Mapping[str, str]) -> list | None:
    """What `sweep` gives of the JVM's TaskFailures, run without adaptive execution and with
    `settings`, the session's own put back after."""
    session = frame.sparkSession
    try:
        failures = session.sparkContext._jvm.exactly_once.isolation.TaskFailures
    except Exception:  # Spark Connect: no SparkContext
        return None
    if not isinstance(failures, JavaClass):  # a driver with an older jar: as if no task could be named
        return None
    changed = {ADAPTIVE: "false", **settings}
    before = {name: session.conf.get(name, None) for name in changed}
    try:
        for name, value in changed.items():
            session.conf.set(name, value)
        return sweep(failures)
    except Py4JJavaError as error:
        raise convert_exception(error.java_exception) from None
    except Py4JNetworkError:
        raise
    except Py4JError:  # a driver with an older jar, whose methods take other arguments
        return None
    finally:
        for name, value in before.items():
            if value is None:
                session.conf.unset(name)
            else:
                session.conf.set(name, value)
