"""A step of an attempt's staging write that failed, and whether a record can have caused it
(exactly_once.spark.staging, record isolation's probes: exactly_once.spark.rows_step)."""

from __future__ import annotations

from collections.abc import Mapping

from exactly_once.spark.isolation import ROWS, Step
from exactly_once.spark.sweeps import Failed
from exactly_once.sqlstates import raised_by_user_code, record_failure


class StepFailed(Exception):
    """A step of the write failed; `reason` says why if a record can have caused it (the
    transform, for a Python error or any error computing the rows; else the sink), else it
    is None. `tasks`: every task of the write's first pass that failed (partitions of the
    attempt's cached records), with where it stopped, where that pass ran each to its end."""

    def __init__(self, sink: str, error: BaseException, transform: str | None, step: Step,
                 tasks: Mapping[int, Failed] | None = None):
        super().__init__(sink, error)
        self.step, self.tasks = step, tasks
        failure = record_failure(error)
        if failure is None:
            self.reason = None
        else:
            state, message = failure
            message = message.replace("\x00", "\\x00")  # a dead letter's reason is text: no NUL
            by_transform = transform is not None and (raised_by_user_code(state) or step == ROWS)
            self.reason = f"transform {transform}: {message}" if by_transform else f"sink {sink}: {message}"

    def __str__(self) -> str:  # rendered when shown: a PySpark error asks the driver's JVM for its text
        sink, error = self.args
        return f"sink {sink}: {error}"
