"""An attempt's staging writes, with record isolation (exactly_once.spark.isolation).

Each sink's rows and the dead letters are appended from the executors with PostgreSQL's
COPY, tagged (checkpoint, attempt). Where a final table can refuse rows the row checks pass (a CHECK
constraint, a trigger, a foreign key: `Ledger.may_refuse`), the staged rows are then
promoted on trial and rolled back, so a refusal is found before pre-commit. A write or
trial that fails because of some records is narrowed down to them by probes, each the step
that failed (the transform and row checks; one table's COPY; one sink's trial) on a part of
the ranges, what it staged under a probe tag then deleted; the attempt is written again with
them set aside as dead letters carrying the failure's own message.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping
from contextlib import AbstractContextManager, nullcontext

from pyspark.sql import DataFrame

from exactly_once import ddl, faults
from exactly_once.catalog import column_types, refuses_type
from exactly_once.config import Sink
from exactly_once.errors import ConfigError, Permanent
from exactly_once.ledger import trials
from exactly_once.ledger.checkpoints import Checkpoint
from exactly_once.ledger.planning import OffsetRange
from exactly_once.ledger.protocol import Ledger
from exactly_once.ledger.registration import final_columns
from exactly_once.ledger.rows import LedgerRows
from exactly_once.ledger.tables import DEAD_LETTERS, qualified, staging_table
from exactly_once.schema_registry import SchemaRegistry
from exactly_once.spark.copy_writer import write_staging
from exactly_once.spark.frames import (AttemptFrames, SetAside, attempt_frames, cache_level, checked_rows, in_ranges,
                                       parse, with_set_aside)
from exactly_once.spark.isolation import (MAX_ISOLATED, ROWS, Budget, Located, NotIsolated, Step, Unlocated,
                                          describe, locate_failing, narrow)
from exactly_once.spark.spread import FailedTasks, spread
from exactly_once.sqlstates import raised_by_user_code, record_failure

log = logging.getLogger(__name__)

Phase = Callable[[str], AbstractContextManager]        # times a phase of the attempt's report


class BadRecords(Permanent):
    """Bad records in a pipeline whose policy (`on_bad_record: fail`) is to fail."""


class _Refused(Exception):
    """A step of the write failed; `reason` says why if a record can have caused it (the
    transform, for a Python error or any error computing the rows; else the sink), else it
    is None."""

    def __init__(self, sink: str, error: BaseException, transform: str | None, step: Step):
        super().__init__(f"sink {sink}: {error}")
        self.step = step
        failure = record_failure(error)
        if failure is None:
            self.reason = None
        else:
            state, message = failure
            message = message.replace("\x00", "\\x00")  # a dead letter's reason is text: no NUL
            by_transform = transform is not None and (raised_by_user_code(state) or step == ROWS)
            self.reason = f"transform {transform}: {message}" if by_transform else f"sink {sink}: {message}"


class Staging:
    def __init__(self, ledger: Ledger, checkpoint: Checkpoint, attempt: int, token: str, jdbc: Mapping[str, str],
                 registry: SchemaRegistry | None = None):
        self.ledger, self.checkpoint, self.attempt, self.jdbc = ledger, checkpoint, attempt, jdbc
        self.token = token  # the attempt's, which the ledger's staging functions ask for
        self.registry = registry  # the schema registry a record format reads from
        self.checkpoint_id, self.ranges = checkpoint.id, checkpoint.ranges
        self.config = ledger.config
        with ledger.rows() as rows:
            self.columns = final_columns(rows)
            # what each staging column takes, which the COPY writer renders
            self.targets = {name: {c.name: c.base for c in column_types(rows.cur, table)}
                            for name, table in rows.staging.items()}
            self.refusing = self._may_refuse(rows)
        self.typed: set[str] = set()  # the staging tables whose columns were found to take the frame's types
        # Each isolation finds the records that fail at one step: the transform and row checks,
        # a table's COPY (the sinks' and the dead letters'), a sink's trial. And an upsert's
        # next-newest row may be refused once its newest is set aside. The transform's
        # failures may take a round each, up to isolation's limit (its rest is the next round).
        self.rounds = 2 * len(self.config.sinks) + 4 + MAX_ISOLATED

    def write_isolating(self, records: DataFrame, set_aside: SetAside, phase: Phase) -> tuple[int, dict[str, int]]:
        """Stages the records' rows; returns how many records there are and the rows written per sink."""
        set_aside = list(set_aside)
        with phase("read"):
            # A checkpoint's first attempt retries an unknown schema id; a later one dead-letters it.
            parsed = parse(records, self.config, self.registry,
                           retry_unknown_ids=self.attempt == 1).persist(cache_level(records.sparkSession))
            count = parsed.count()
        tasks = FailedTasks.of(parsed.sparkSession)
        budget = Budget()  # isolation's limits, over every round
        try:
            for _ in range(self.rounds):
                try:
                    faults.point("increment.before_write")
                    with phase("write_staging"), (tasks.group() if tasks else nullcontext()) as group:
                        return count, self.write(with_set_aside(parsed, set_aside), self.attempt)
                except _Refused as refused:
                    if refused.reason is None:
                        raise refused.__cause__ from None
                    with phase("isolate"):
                        located = (tasks, group) if tasks and self._locatable(refused.step) else None
                        set_aside += list(self.isolate(parsed, set_aside, refused, located, budget).items())
        finally:
            parsed.unpersist()
        raise NotIsolated(f"checkpoint {self.checkpoint_id}: writes kept failing after isolating "
                          + ", ".join(f"{r.topic}[{r.partition}]@{r.start}" for r, _ in set_aside))

    def isolate(self, parsed: DataFrame, set_aside: SetAside, refused: _Refused,
                located: tuple[FailedTasks, str] | None, budget: Budget) -> dict[OffsetRange, str]:
        """The records that fail on their own, each with why: by the tasks that fail where
        `located` gives the driver's failed tasks and the failed write's job group, else by
        bisection; within the limits of `budget`, which holds the earlier rounds' records."""
        self._delete(self.attempt)
        log.warning("checkpoint %s attempt %s: isolating the records that fail: %s", self.checkpoint_id,
                    self.attempt, refused.reason)

        def probe(part: list[OffsetRange]) -> str | None:
            return self.probe(with_set_aside(parsed.where(in_ranges(part)), set_aside), refused.step)

        if located is None:
            isolated = narrow(self.ranges, probe, budget)
        else:
            tasks, group = located
            isolated = locate_failing(self.ranges, lambda split: self.locate(parsed, set_aside, refused.step, split,
                                                                             tasks), probe,
                                      budget=budget, first=tasks.failed_write(parsed, group, refused.reason),
                                      # the policy `fail` names every record it can at once
                                      rest_is_the_next_write=refused.step == ROWS
                                      and self.config.on_bad_record != "fail")
        if not isolated:
            raise NotIsolated(f"checkpoint {self.checkpoint_id}: {refused.reason}; no record fails on its own "
                              "(rows of several records together?)") from refused.__cause__
        if budget.found_every_record(lambda: parsed.where("reason IS NULL").count()):
            raise NotIsolated(f"checkpoint {self.checkpoint_id}: every record fails on its own, so the cause is "
                              f"not in the records: {describe(budget.found)}") from refused.__cause__
        if self.config.on_bad_record == "fail":
            raise BadRecords(f"pipeline {self.config.name!r} fails on bad records; checkpoint {self.checkpoint_id}: "
                             + describe(isolated))
        log.warning("checkpoint %s attempt %s: set aside as dead letters: %s", self.checkpoint_id, self.attempt,
                    describe(isolated, limit=len(isolated)))
        return isolated

    def write(self, parsed: DataFrame, tag: int) -> dict[str, int]:
        """Stages the rows tagged `tag` and promotes them on trial where a table may refuse
        some; `_Refused` says which step failed."""
        frames = attempt_frames(parsed, self.config, self.columns)
        written = {}
        try:
            if self.config.on_bad_record == "fail":
                first = self._first_bad(frames)
                if first:
                    raise BadRecords(f"pipeline {self.config.name!r} fails on bad records; checkpoint "
                                     f"{self.checkpoint_id} read "
                                     + "; ".join(f"{r.topic}[{r.partition}]@{r.offset}: {r.reason}" for r in first))
            staging = frames.staging(any_refused=self._refusals(frames) > 0)
            for name, frame in staging.items():  # every table before any row is written
                self._check_types(name, frame)
            for name, frame in staging.items():
                written[name] = self._write_table(name, frame, tag)
                faults.point(f"increment.wrote.{name}")
        finally:
            frames.release()
        self._trial_promote(tag, [sink.name for sink in self.refusing])
        return written

    def _write_table(self, name: str, frame: DataFrame, tag: int) -> int:
        try:
            return write_staging(frame, qualified(staging_table(self.config, name)), self.jdbc, self.targets[name],
                                 self.checkpoint_id, tag, self.token)
        except Exception as error:
            raise _Refused(name, error, self.config.transform, Step(name)) from error

    def _first_bad(self, frames: AttemptFrames) -> list:
        """Some bad records, computed by the transform and the row checks; `_Refused` if they
        fail (a UDF raising on a record: isolation names it, and the policy fails on it)."""
        try:
            return frames.bad.limit(5).collect()
        except Exception as error:
            raise _Refused(DEAD_LETTERS, error, self.config.transform, ROWS) from error

    def _refusals(self, frames: AttemptFrames) -> int:
        """How many records a sink table would refuse: the refusals computed (and cached, for
        every sink's write), by the transform and the row checks; `_Refused` if they fail."""
        try:
            return frames.refused.count()
        except Exception as error:
            raise _Refused(DEAD_LETTERS, error, self.config.transform, ROWS) from error

    def _locatable(self, step: Step) -> bool:
        """Whether the step runs each record's rows in the Spark task its record is in: the
        transform and row checks, an append sink's COPY (an aggregate's or upsert's rows are
        made after a shuffle of their own; a trial runs in the database)."""
        return step.table is None or (not step.trial and any(
            sink.name == step.table and sink.mode == "append" for sink in self.config.sinks))

    def locate(self, parsed: DataFrame, set_aside: SetAside, step: Step, split: list[list[OffsetRange]],
               tasks: FailedTasks) -> Located | None:
        """The step over the pieces at once, piece i in Spark task i: None if it passes, else
        the pieces whose tasks failed and passed; `Unlocated` if the status store names none."""
        with tasks.group() as group:
            why = self.probe(with_set_aside(spread(parsed, split), set_aside), step, one_task=False)
        if why is None:
            return None
        hit = tasks.located(group, len(split), why)
        if hit is None:
            raise Unlocated(why)
        return hit

    def probe(self, parsed: DataFrame, step: Step, one_task: bool = True) -> str | None:
        """Why these records fail at `step`, or None; leaves nothing staged. Only the step is
        repeated (a transform raising needs no table), its table written by one Spark task
        unless `one_task` is false (a located probe's pieces each in a task of their own)."""
        tag = -self.attempt  # never a real attempt's: no commit promotes it, clean-ups delete it
        started = time.monotonic()
        why = None
        try:
            if step.table is None:
                self._check_rows(parsed)
            else:
                self._repeat_write(parsed, step, tag, one_task)
        except _Refused as refused:
            if refused.reason is None:
                raise refused.__cause__ from None
            why = refused.reason
        finally:
            if step.table is not None:
                self._delete(tag)
        log.info("probe: %s (%.1f s)", why or "passes", time.monotonic() - started)
        return why

    def _check_rows(self, parsed: DataFrame) -> None:
        """The checked rows computed as the write's cache of them computes them (every column a
        sink reads, by the transform, and the row checks), into Spark's noop sink."""
        try:
            checked_rows(parsed, self.config, self.columns).write.format("noop").mode("overwrite").save()
        except Exception as error:
            raise _Refused(DEAD_LETTERS, error, self.config.transform, ROWS) from error

    def _repeat_write(self, parsed: DataFrame, step: Step, tag: int, one_task: bool) -> None:
        """A table's COPY of these records, each table in one Spark task; for a trial, every
        refusing sink's up to the step's, promoted on trial in the write's order (a foreign
        key between sinks sees the rows before it)."""
        tables = [step.table]
        if step.trial:
            refusing = [sink.name for sink in self.refusing]
            tables = refusing[:refusing.index(step.table) + 1]
        frames = attempt_frames(parsed, self.config, self.columns)
        try:
            staging = frames.staging(any_refused=True)
            for name in tables:
                self._write_table(name, staging[name].coalesce(1) if one_task else staging[name], tag)
        finally:
            frames.release()
        if step.trial:
            self._trial_promote(tag, tables)

    # -- on the pipeline database -------------------------------------------------------------

    def _may_refuse(self, rows: LedgerRows) -> list[Sink]:
        """The sinks promoted on trial: those whose final tables can refuse rows that pass the
        row checks (a CHECK, foreign key or exclusion constraint, a trigger, or a unique index
        besides the one the merge conflicts on), and the sinks their foreign keys reference,
        whose new rows the keys must see; every sink once a commit of these ranges was
        refused (an aggregate's sum beyond its column, say)."""
        if rows.refused_at_commit(self.checkpoint_id):  # a table refused what no trial had tried
            return list(self.config.sinks)
        refusing = [sink for sink in self.config.sinks if rows.may_refuse(sink)]
        return [sink for sink in self.config.sinks
                if sink in refusing or any(rows.references(other, sink) for other in refusing if other != sink)]

    def _check_types(self, name: str, frame: DataFrame) -> None:
        """Each column of the staging table takes the values of the frame's Spark type as
        Spark's JDBC writer bound them (an assignment cast exists: PostgreSQL answers, without
        inserting anything), as the COPY writer writes what such a cast makes of them; else
        no record is at fault, and the pipeline's configuration is (`ConfigError`)."""
        if name in self.typed:
            return
        table = staging_table(self.config, name)
        with self.ledger.rows() as rows:
            for field in frame.schema.fields:
                spark_type = field.dataType.simpleString()
                if spark_type == "void":  # only nulls, which every nullable column takes
                    continue
                try:
                    bound = ddl.bound_type(spark_type)
                except ValueError:  # a type the configuration's types do not name (interval, variant)
                    bound = None
                if bound is None:
                    raise ConfigError(f"sink {name}: column {field.name}: Spark {spark_type} values cannot be staged")
                refused = refuses_type(rows.cur, table, field.name, bound)
                if refused is not None:
                    raise ConfigError(f"sink {name}: column {field.name} gets Spark {spark_type} values: "
                                      f"PostgreSQL says {refused.diag.message_primary!r}")
        self.typed.add(name)

    def _trial_promote(self, tag: int, sinks: list[str]) -> None:
        """Promotes the rows tagged `tag` into these sinks' tables and rolls back; `_Refused`
        with the database's error for the first that refuses them. The ledger runs the
        promotion (`exactly_once.ledger.trials`): the job's role has no rights on the final
        tables."""
        if not sinks:
            return
        with self.ledger.rows() as rows:
            refused = trials.promote(rows, self.checkpoint_id, tag, sinks, self.token)
        if refused is not None:
            sink, error = refused
            raise _Refused(sink, error, self.config.transform, Step(sink, trial=True)) from error

    def _delete(self, tag: int) -> None:
        with self.ledger.rows() as rows:
            trials.discard(rows, self.checkpoint_id, tag, self.token)
