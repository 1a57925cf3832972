"""An attempt's staging tables written: in one pass (exactly_once.spark.one_pass), then the
dead letters, or each table's COPY (exactly_once.spark.copy_writer) a Spark job of its own;
jobs at once from threads of the driver, so that one job's tasks take the cores another's
leave idle (its last tasks, the driver planning the next job; at 1 M demo orders the
job's staging write took 13.9 s at once against 15.2 s one by one, medians of 5: the docs'
Performance page).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from concurrent.futures import ThreadPoolExecutor
from contextlib import nullcontext
from dataclasses import dataclass
from functools import partial

from pyspark.sql import DataFrame, SparkSession
from pyspark.util import inheritable_thread_target

from exactly_once import faults
from exactly_once.config import PipelineConfig
from exactly_once.ledger.tables import DEAD_LETTERS, qualified, staging_table
from exactly_once.spark.copy_writer import write_staging, write_tables
from exactly_once.spark.isolation import Step
from exactly_once.spark.one_pass import OnePass
from exactly_once.spark.spread import FailedTasks
from exactly_once.spark.step_failed import StepFailed

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class StagingWrites:
    config: PipelineConfig
    jdbc: Mapping[str, str]
    targets: Mapping[str, Mapping[str, str]]  # what each staging table's columns take, by table
    checkpoint_id: int
    token: str  # the attempt's, which the ledger's staging functions ask for

    def every_table(self, staging: Mapping[str, DataFrame], tag: int) -> dict[str, int]:
        """Every table's rows tagged `tag`, the tables at once; the rows written per table. A
        table whose write fails is written again alone, in the tables' order, so that
        `StepFailed` names the first that fails on its own and its failed job is the only one
        in the job group the write runs in (isolation reads the failed job's tasks:
        exactly_once.spark.spread.FailedTasks). What the failed job's tasks committed goes when
        the table's next write is settled, which keeps only its own tasks' rows of the tag
        (copy_writer.write_staging), or with the attempt's rows when isolation starts. The
        fault points `increment.wrote.<table>` pass in the tables' order."""
        outcomes = _at_once(next(iter(staging.values())).sparkSession,
                            {name: partial(self._copy, name, frame, tag) for name, frame in staging.items()})
        failed = [name for name, outcome in outcomes.items() if isinstance(outcome, BaseException)]
        if failed:
            log.warning("checkpoint %s: the staging writes of %s failed beside the others; each again alone",
                        self.checkpoint_id, ", ".join(failed))
        written = {}
        for name, frame in staging.items():
            written[name] = self.one_table(name, frame, tag) if name in failed else outcomes[name]
            faults.point(f"increment.wrote.{name}")
        return written

    def in_one_pass(self, rows: OnePass, unparsed: DataFrame, tag: int) -> dict[str, int] | None:
        """Every sink's rows of the one pass, tagged `tag`, then the dead letters: `unparsed`'s,
        or where a sink table would refuse rows, every dead letter, the refused records' too.
        The rows written per table, the fault points `increment.wrote.<table>` passed in the
        tables' order; None if a job failed (a record's failure or not: the table-by-table write
        tells which) or a refused record has rows the pass wrote, whatever they staged left."""
        try:
            written = dict(zip(rows.tables, write_tables(rows.rows, list(rows.tables.values()), self.jdbc,
                                                         self.checkpoint_id, tag, self.token)))
            letters = rows.every_letter() if rows.refused_rows() else unparsed
            if letters is None:
                log.info("checkpoint %s: a record a sink table refuses has rows the one pass wrote; written table "
                         "by table, its every row left out", self.checkpoint_id)
                return None
            written = {DEAD_LETTERS: self._copy(DEAD_LETTERS, letters, tag), **written}
        except Exception as error:
            log.warning("checkpoint %s: the one-pass write failed; written table by table: %s", self.checkpoint_id,
                        error)
            return None
        for name in written:
            faults.point(f"increment.wrote.{name}")
        return written

    def one_table(self, name: str, frame: DataFrame, tag: int) -> int:
        """The table's rows tagged `tag`; `StepFailed` if its write fails."""
        try:
            return self._copy(name, frame, tag)
        except Exception as error:
            raise StepFailed(name, error, self.config.transform, Step(name)) from error

    def _copy(self, name: str, frame: DataFrame, tag: int) -> int:
        return write_staging(frame, qualified(staging_table(self.config, name)), self.jdbc, self.targets[name],
                             self.checkpoint_id, tag, self.token)


def _at_once(session: SparkSession, calls: Mapping[str, Callable[[], int]]) -> dict[str, int | BaseException]:
    """What each call returned or raised, by name, the calls run at once in threads of the
    driver (one that fails does not stop the others). In an application of the job's own,
    under a job group of their own (PySpark pins a thread of the driver's JVM to each Python
    thread, and a new one has no group); over Spark Connect, whose jobs have no group here,
    as they are."""
    tasks = FailedTasks.of(session)
    with tasks.group("the staging tables written at once") if tasks else nullcontext():
        with ThreadPoolExecutor(max_workers=len(calls)) as pool:
            futures = {name: pool.submit(inheritable_thread_target(session)(call) if tasks else call)
                       for name, call in calls.items()}
    outcomes: dict[str, int | BaseException] = {}
    for name, future in futures.items():
        error = future.exception()
        if error is not None and not isinstance(error, Exception):
            raise error  # an interrupt, an exit: not the write's
        outcomes[name] = future.result() if error is None else error
    return outcomes
