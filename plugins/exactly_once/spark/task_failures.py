"""Record isolation's sweep (exactly_once.spark.isolation.sweep_failing) on the driver's JVM: a
frame whose tasks each hold a known part of the records computed to the end of every task, the
error a task's rows raise kept as that task's result (jvm/: exactly_once.isolation.TaskFailures),
so one job names every task that fails. Its tasks hold either the pieces of a spread
(exactly_once.spark.spread) or the partitions of the attempt's cached records, whose first pass
of the write (the checked rows into their cache) is so a sweep too."""

from __future__ import annotations

from collections.abc import Callable

from py4j.java_gateway import JavaClass
from py4j.protocol import Py4JJavaError
from pyspark.errors.exceptions.captured import convert_exception
from pyspark.sql import DataFrame

ADAPTIVE = "spark.sql.adaptive.enabled"


def task_failures(frame: DataFrame, pieces: int) -> dict[int, Exception] | None:
    """The error of each task of the frame whose rows raised, by task index, as PySpark raises
    a failed job's (the same message); None, running nothing, when its tasks are not the
    spread's `pieces` (a transform with a shuffle of its own), no JVM can be asked (Spark
    Connect) or the errors cannot be read back on the driver. Only a task's last attempt keeps
    its error: Spark runs an earlier one again, as for any failed task. The frame must not have
    been planned before (it is planned here without adaptive execution, which would run the
    stages below its last shuffle while planning it). A job that fails anyway (an error Java
    cannot carry back, a lost executor) raises its error."""
    return _swept(frame, lambda failures: failures.of(frame._jdf, pieces))


def task_failures_over(frame: DataFrame, cached: DataFrame) -> dict[int, Exception] | None:
    """`task_failures` of a frame whose task i reads partition i of the `cached` frame's cache
    and no other (no shuffle); a frame itself cached is computed into its cache. A cached
    frame's plan is adaptive (cached before this turns that off), so a shuffle of its own is
    found only after its stages below it ran (reused by its later jobs): None, or their error."""
    return _swept(frame, lambda failures: failures.over(frame._jdf, cached._jdf))


def _swept(frame: DataFrame, sweep: Callable) -> dict[int, Exception] | None:
    session = frame.sparkSession
    try:
        failures = session.sparkContext._jvm.exactly_once.isolation.TaskFailures
    except Exception:  # Spark Connect: no SparkContext
        return None
    if not isinstance(failures, JavaClass):  # a driver with an older jar: as if no task could be named
        return None
    adaptive = session.conf.get(ADAPTIVE)
    session.conf.set(ADAPTIVE, "false")
    try:
        failed = sweep(failures)
    except Py4JJavaError as error:
        raise convert_exception(error.java_exception) from None
    finally:
        session.conf.set(ADAPTIVE, adaptive)
    if failed is None:
        return None
    return {int(index): convert_exception(error) for index, error in failed}
