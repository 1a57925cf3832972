"""An attempt's staging writes, with record isolation (exactly_once.spark.isolation).

Each sink's rows and the dead letters are appended from the executors with PostgreSQL's
COPY, tagged (checkpoint, attempt). Where a final table can refuse rows the row checks pass (a CHECK
constraint, a trigger, a foreign key: `Ledger.may_refuse`), the staged rows are then
promoted on trial and rolled back, so a refusal is found before pre-commit. A write or
trial that fails because of some records is narrowed down to them by probes, each the step
that failed (the transform and row checks, exactly_once.spark.rows_step; one table's COPY;
one sink's trial) on a part of the ranges, what it staged under a probe tag then deleted;
the attempt is written again with them set aside as dead letters carrying the failure's own
message.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping
from contextlib import AbstractContextManager, nullcontext

from pyspark.sql import DataFrame

from exactly_once import faults
from exactly_once.catalog import column_types
from exactly_once.errors import Permanent
from exactly_once.ledger import trials
from exactly_once.ledger.checkpoints import Checkpoint
from exactly_once.ledger.planning import OffsetRange
from exactly_once.ledger.protocol import Ledger
from exactly_once.ledger.registration import final_columns
from exactly_once.ledger.tables import DEAD_LETTERS
from exactly_once.schema_registry import SchemaRegistry
from exactly_once.spark import one_pass, rows_step
from exactly_once.spark.frames import (SetAside, attempt_frames, cache_level, in_ranges, parse,
                                       unparsed_letters, with_set_aside)
from exactly_once.spark.isolation import (MAX_ISOLATED, ROWS, Budget, Located, NotIsolated, Step, Unlocated,
                                          describe, locate_failing, narrow)
from exactly_once.spark.kept_rows import KeptRows
from exactly_once.spark.spread import FailedTasks, cached_pieces, spread
from exactly_once.spark.staging_tables import promoted_on_trial, require_staged_types
from exactly_once.spark.staging_writes import StagingWrites
from exactly_once.spark.step_failed import StepFailed
from exactly_once.spark.sweeps import sweep_failing

log = logging.getLogger(__name__)

Phase = Callable[[str], AbstractContextManager]        # times a phase of the attempt's report


class BadRecords(Permanent):
    """Bad records in a pipeline whose policy (`on_bad_record: fail`) is to fail."""


class Staging:
    def __init__(self, ledger: Ledger, checkpoint: Checkpoint, attempt: int, token: str, jdbc: Mapping[str, str],
                 registry: SchemaRegistry | None = None):
        self.ledger, self.checkpoint, self.attempt = ledger, checkpoint, attempt
        self.token = token  # the attempt's, which the ledger's staging functions ask for
        self.registry = registry  # the schema registry a record format reads from
        self.checkpoint_id, self.ranges = checkpoint.id, checkpoint.ranges
        self.config = ledger.config
        with ledger.rows() as rows:
            self.columns = final_columns(rows)
            # what each staging column takes, which the COPY writer renders
            targets = {name: {c.name: c.base for c in column_types(rows.cur, table)}
                       for name, table in rows.staging.items()}
            self.refusing = promoted_on_trial(rows, self.config, self.checkpoint_id)
        self.writes = StagingWrites(self.config, jdbc, targets, self.checkpoint_id, token)
        self.typed: set[str] = set()  # the staging tables whose columns were found to take the frame's types
        self.held: list[list[OffsetRange]] | None = None  # the offsets of each partition of the cached records
        self.passing = True  # whether the write in one pass is tried: not once it gave way in the attempt
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
        kept = KeptRows(parsed, self.config, self.columns)
        try:
            for _ in range(self.rounds):
                try:
                    faults.point("increment.before_write")
                    with phase("write_staging"), (tasks.group() if tasks else nullcontext()) as group:
                        return count, self.write(parsed, set_aside, kept, tasks)
                except StepFailed as refused:
                    if refused.reason is None:
                        raise refused.__cause__ from None
                    with phase("isolate"):
                        located = (tasks, group) if tasks and self._locatable(refused.step) else None
                        set_aside += list(self.isolate(parsed, set_aside, refused, located, budget).items())
        finally:
            kept.release()
            parsed.unpersist()
        raise NotIsolated(f"checkpoint {self.checkpoint_id}: writes kept failing after isolating "
                          + ", ".join(f"{r.topic}[{r.partition}]@{r.start}" for r, _ in set_aside))

    def isolate(self, parsed: DataFrame, set_aside: SetAside, refused: StepFailed,
                located: tuple[FailedTasks, str] | None, budget: Budget) -> dict[OffsetRange, str]:
        """The records that fail on their own, each with why: by the tasks that fail where
        `located` gives the driver's failed tasks and the failed write's job group, else by
        bisection; within the limits of `budget`, which holds the earlier rounds' records."""
        self._delete(self.attempt)
        log.warning("checkpoint %s attempt %s: isolating the records that fail: %s", self.checkpoint_id,
                    self.attempt, refused.reason)

        isolated = self._search(parsed, set_aside, refused, located, budget)
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

    def _search(self, parsed: DataFrame, set_aside: SetAside, refused: StepFailed,
                located: tuple[FailedTasks, str] | None, budget: Budget) -> dict[OffsetRange, str]:
        """`isolate`'s search: by sweeps from where each task of the write's first pass that failed
        stopped; else by the failed tasks of each job where `located`, else by bisection."""
        if refused.tasks:
            held = self._cached_pieces(parsed)
            try:
                return sweep_failing([], lambda split, batch: rows_step.sweep(parsed, set_aside, split, batch,
                                                                              self.config, self.columns),
                                     budget=budget, stops=[(held[i], how) for i, how in refused.tasks.items()])
            except Unlocated:
                pass  # the spread's tasks not its pieces after all (nothing found): as below

        def probe(part: list[OffsetRange]) -> str | None:
            return self.probe(with_set_aside(parsed.where(in_ranges(part)), set_aside), refused.step)

        if located is None:
            return narrow(self.ranges, probe, budget)
        tasks, group = located
        return locate_failing(self.ranges, lambda split: self.locate(parsed, set_aside, refused.step, split, tasks),
                              probe, budget=budget, first=tasks.failed_write(parsed, group, refused.reason),
                              # the policy `fail` names every record it can at once
                              rest_is_the_next_write=refused.step == ROWS and self.config.on_bad_record != "fail")

    def write(self, records: DataFrame, set_aside: SetAside, kept: KeptRows,
              tasks: FailedTasks | None) -> dict[str, int]:
        """Stages the rows of the cached `records`, those `set_aside` as dead letters, and
        promotes them on trial where a table may refuse some; `StepFailed` says which step
        failed. The write's first pass computes the checked rows the rounds before did not
        compute whole into `kept`'s cache; every table's rows are then written from them in one
        pass (exactly_once.spark.one_pass), or table by table where the pass does not serve or
        gave way once in the attempt (the table-by-table write names the step at fault). `tasks`:
        the driver's failed tasks, None over Spark Connect."""
        try:
            # The transform runs in the first pass, not inline in the pass: a record it raises on
            # fails a job that wrote no table and names its partition, and its passing tasks' rows stay kept.
            rows_step.check(kept, set_aside, records, self.config.transform)
            checked = kept.rows(set_aside)
            written = self._in_one_pass(records, set_aside, checked, tasks) if self.passing else None
            if written is not None:
                return written
            self.passing = False
            written = self._table_by_table(records, set_aside, checked)
        finally:
            kept.end_round()
        self._trial_promote(self.attempt, [sink.name for sink in self.refusing])
        return written

    def _table_by_table(self, records: DataFrame, set_aside: SetAside, checked: DataFrame) -> dict[str, int]:
        """Each table's rows from the round's `checked` rows, a Spark job each (the refusals,
        then every table's COPY at once)."""
        frames = attempt_frames(with_set_aside(records, set_aside), self.config, self.columns, checked)
        try:
            if self.config.on_bad_record == "fail":
                first = rows_step.first_bad(frames, self.config.transform)
                if first:
                    raise BadRecords(f"pipeline {self.config.name!r} fails on bad records; checkpoint "
                                     f"{self.checkpoint_id} read "
                                     + "; ".join(f"{r.topic}[{r.partition}]@{r.offset}: {r.reason}" for r in first))
            staging = frames.staging(any_refused=rows_step.refusals(frames, self.config.transform) > 0)
            require_staged_types(self.ledger, self.typed, staging)
            return self.writes.every_table(staging, self.attempt)
        finally:
            frames.release()

    def _in_one_pass(self, parsed: DataFrame, set_aside: SetAside, checked: DataFrame,
                     tasks: FailedTasks | None) -> dict[str, int] | None:
        """The attempt's rows in one pass over their `checked` rows (exactly_once.spark.one_pass)
        and promoted on trial where a table may refuse some: the rows written per table; else
        None, nothing staged, where the pass does not serve the pipeline, a record a sink table
        would refuse has rows the pass wrote, or the pass or a trial fails. Its jobs run in a
        job group of their own: isolation reads the failed jobs of the table-by-table write's."""
        records = with_set_aside(parsed, set_aside)
        rows = one_pass.plan(records, checked, self.config, self.columns, self.writes.targets)
        if rows is None:
            return None
        letters = unparsed_letters(records, self.config)
        try:
            require_staged_types(self.ledger, self.typed, {DEAD_LETTERS: letters, **rows.staged()})
            with tasks.group("the write in one pass") if tasks else nullcontext():
                written = self.writes.in_one_pass(rows, letters, self.attempt)
            if written is not None:
                self._trial_promote(self.attempt, [sink.name for sink in self.refusing])
                return written
        except StepFailed as failed:
            log.warning("checkpoint %s attempt %s: %s; written table by table", self.checkpoint_id, self.attempt,
                        failed.reason)
        finally:
            rows.release()
        self._delete(self.attempt)
        return None

    def _cached_pieces(self, parsed: DataFrame) -> list[list[OffsetRange]]:
        """The offsets of each partition of the attempt's cached records (a Spark job, once)."""
        if self.held is None:
            self.held = cached_pieces(parsed)
        return self.held

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
                rows_step.check_rows(parsed, self.config, self.columns)
            else:
                self._repeat_write(parsed, step, tag, one_task)
        except StepFailed as refused:
            if refused.reason is None:
                raise refused.__cause__ from None
            why = refused.reason
        finally:
            if step.table is not None:
                self._delete(tag)
        log.info("probe: %s (%.1f s)", why or "passes", time.monotonic() - started)
        return why

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
                self.writes.one_table(name, staging[name].coalesce(1) if one_task else staging[name], tag)
        finally:
            frames.release()
        if step.trial:
            self._trial_promote(tag, tables)

    # -- on the pipeline database -------------------------------------------------------------

    def _trial_promote(self, tag: int, sinks: list[str]) -> None:
        """Promotes the rows tagged `tag` into these sinks' tables and rolls back; `StepFailed`
        with the database's error for the first that refuses them. The ledger runs the
        promotion (`exactly_once.ledger.trials`): the job's role has no rights on the final
        tables."""
        if not sinks:
            return
        with self.ledger.rows() as rows:
            refused = trials.promote(rows, self.checkpoint_id, tag, sinks, self.token)
        if refused is not None:
            sink, error = refused
            raise StepFailed(sink, error, self.config.transform, Step(sink, trial=True)) from error

    def _delete(self, tag: int) -> None:
        with self.ledger.rows() as rows:
            trials.discard(rows, self.checkpoint_id, tag, self.token)
