"""The ledger's rows as values, on one transaction of one pipeline: what protocol.py
reads and writes, mapped to and from `exactly_once.ledger.checkpoints`. Statements are in
sql/ledger.sql; nothing here decides a transition.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import replace
from datetime import datetime

from psycopg2 import sql
from psycopg2.extras import execute_batch

from exactly_once.config import PipelineConfig, Sink, load_stored_config
from exactly_once.ledger.checkpoints import Attempt, AttemptState, Checkpoint, Staged, State
from exactly_once.ledger.planning import OffsetRange, PartitionPlan, PartitionState, Reach
from exactly_once.ledger.refusals import PromotionRefused
from exactly_once.ledger.tables import contributions_table, final_table, staging_tables
from exactly_once.ledger.versions import config_version
from exactly_once.sinks import SinkTables
from exactly_once.sqlfiles import named

Q = named("ledger.sql")
Partition = tuple[str, int]  # (topic, partition)


def _one(cur, statement: str, params: dict, missing: str):
    """The one value a named statement returns; LookupError(`missing`) when it finds no row."""
    cur.execute(Q[statement], params)
    row = cur.fetchone()
    if row is None:
        raise LookupError(missing)
    return row[0]


def registered_config(cur, pipeline: str) -> dict:
    """The pipeline's configuration as last registered."""
    return _one(cur, "pipeline_config", {"pipeline": pipeline},
                f"pipeline {pipeline!r} is not registered in the ledger")


def attempt_config(cur, pipeline: str, checkpoint_id: int, attempt: int) -> dict:
    """The configuration the attempt was started with."""
    return _one(cur, "attempt_config", {"pipeline": pipeline, "checkpoint_id": checkpoint_id, "attempt": attempt},
                f"attempt {attempt} of checkpoint {checkpoint_id} of pipeline {pipeline!r} has no recorded "
                "configuration version")


def pipeline_of(cur, checkpoint_id: int) -> str:
    """The pipeline a checkpoint belongs to."""
    return _one(cur, "pipeline_of_checkpoint", {"checkpoint_id": checkpoint_id},
                f"checkpoint {checkpoint_id} does not exist")


def _attempt(row: tuple) -> Attempt:
    checkpoint_id, attempt, state, reason, retryable = row
    return Attempt(checkpoint_id, attempt, AttemptState(state), reason, retryable)


class LedgerRows:
    def __init__(self, cur, config: PipelineConfig):
        self.cur, self.config = cur, config
        self.staging = staging_tables(config)

    def as_of(self, config: PipelineConfig) -> LedgerRows:
        """The same transaction's rows as another configuration version of the pipeline sees them."""
        return self if config == self.config else LedgerRows(self.cur, config)

    def attempt_version(self, checkpoint_id: int, attempt: int) -> PipelineConfig:
        """The configuration the attempt ran with, as recorded (this one for an attempt started
        before versions were recorded)."""
        try:
            return load_stored_config(attempt_config(self.cur, self.config.name, checkpoint_id, attempt))
        except LookupError:
            return self.config

    def run(self, statement: str, **params) -> None:
        """A named statement of sql/ledger.sql."""
        self.cur.execute(Q[statement], params)

    def record_seconds(self, checkpoint_id: int, **seconds: float) -> None:
        """How long phases of the checkpoint took (the metrics' histograms)."""
        self.run("record_phase_seconds", checkpoint_id=checkpoint_id,
                 seconds=json.dumps({phase: round(s, 3) for phase, s in seconds.items()}))

    def record_version(self) -> str:
        """The configuration's version, recorded with the configuration (once per version)."""
        version = config_version(self.config)
        self.run("register_version", pipeline=self.config.name, version=version, config=self.config.model_dump_json())
        return version

    def lock(self) -> None:
        """Serializes registration, planning and recovery of the pipeline."""
        self.run("lock_pipeline", pipeline=self.config.name)

    # -- checkpoints and attempts -------------------------------------------------------

    def checkpoint(self, checkpoint_id: int, locked: bool = True) -> Checkpoint:
        """The checkpoint, locked for the rest of the transaction unless `locked` is false (a
        read of the Spark job, whose role may not lock the ledger's rows)."""
        if locked:
            self.run("lock_checkpoint", checkpoint_id=checkpoint_id)
        self.run("checkpoint", checkpoint_id=checkpoint_id, pipeline=self.config.name)
        row = self.cur.fetchone()
        if row is None:
            raise LookupError(f"checkpoint {checkpoint_id} of pipeline {self.config.name!r} does not exist")
        cp_id, dag_run_id, state, attempt, interval_start, interval_end, lease_until, precommitted_attempt, \
            staged, records, reason, replays, commit_failures, stalled_at = row
        self.run("checkpoint_ranges", checkpoint_id=checkpoint_id)
        ranges = tuple(OffsetRange(*r) for r in self.cur.fetchall())
        # rows only: a checkpoint pre-committed by an earlier version recorded a checksum as well
        staged = None if staged is None else {name: Staged(s["rows"]) for name, s in staged.items()}
        return Checkpoint(cp_id, dag_run_id, State(state), attempt, ranges, interval_start, interval_end,
                          lease_until, precommitted_attempt, staged, records, reason, replays, commit_failures,
                          stalled_at)

    def checkpoint_of_run(self, dag_run_id: str) -> int | None:
        self.run("checkpoint_of_run", pipeline=self.config.name, dag_run_id=dag_run_id)
        row = self.cur.fetchone()
        return None if row is None else row[0]

    def attempt(self, checkpoint_id: int, attempt: int) -> Attempt:
        self.run("attempt", checkpoint_id=checkpoint_id, attempt=attempt)
        row = self.cur.fetchone()
        if row is None:
            raise LookupError(f"checkpoint {checkpoint_id} has no attempt {attempt}")
        return _attempt(row)

    def failed_attempts(self, checkpoint_id: int) -> list[Attempt]:
        """The attempts that failed (not superseded), newest first."""
        self.run("failed_attempts", checkpoint_id=checkpoint_id)
        return [_attempt(row) for row in self.cur.fetchall()]

    def stalled(self) -> list[Checkpoint]:
        self.run("stalled", pipeline=self.config.name)
        return [self.checkpoint(checkpoint_id) for checkpoint_id, in self.cur.fetchall()]

    def end_attempts(self, checkpoint_id: int, attempt: int | None, from_state: AttemptState, state: AttemptState,
                     reason: str | None, now: datetime, retryable: bool | None = None) -> None:
        """Ends the checkpoint's attempts still in `from_state` (one, or all when attempt is None)."""
        self.run("end_attempts", checkpoint_id=checkpoint_id, attempt=attempt, from_state=from_state.value,
                 state=state.value, reason=reason, now=now, retryable=retryable)

    def mark_precommitted(self, checkpoint_id: int, attempt: int, staged: Mapping[str, Staged], records: int,
                          now: datetime) -> None:
        self.run("mark_precommitted", checkpoint_id=checkpoint_id, attempt=attempt, records=records, now=now,
                 staged=json.dumps({name: vars(s) for name, s in staged.items()}))

    # -- operators' actions ---------------------------------------------------------------

    def record_action(self, action: str, checkpoint_id: int | None, now: datetime, reason: str,
                      offsets: OffsetRange | None = None) -> None:
        """An operator's action (sql/migrations/0004_stalls_and_operator_actions.sql)."""
        self.run("insert_operator_action", pipeline=self.config.name, action=action, checkpoint_id=checkpoint_id,
                 now=now, reason=reason, topic=offsets.topic if offsets else None,
                 partition=offsets.partition if offsets else None, from_offset=offsets.start if offsets else None,
                 to_offset=offsets.end if offsets else None)

    def relabel_append_rows(self, sink: Sink, topic: str, partition: int, label: str) -> None:
        """An append sink's rows of a reset partition, under the label its history is kept as."""
        self.cur.execute(sql.SQL(Q["relabel_append_rows"]).format(final=final_table(sink)),
                         {"topic": topic, "partition": partition, "label": label})

    def dead_lettered(self, ranges: tuple[OffsetRange, ...]) -> list[tuple[OffsetRange, str]]:
        """Ranges an operator dead-lettered that overlap `ranges`, with their reason."""
        found = []
        for r in ranges:
            self.run("dead_lettered_ranges", pipeline=self.config.name, topic=r.topic, partition=r.partition,
                     from_offset=r.start, to_offset=r.end)
            found += [(OffsetRange(t, p, a, b), f"dead-lettered by an operator at {at.isoformat()}: {why}")
                      for t, p, a, b, why, at in self.cur.fetchall()]
        return found

    def holders(self, offsets: OffsetRange) -> list[tuple[str, int]]:
        """(state, checkpoint id) of what holds some of the offsets: 'committed' ranges and live ones."""
        self.run("range_holders", pipeline=self.config.name, topic=offsets.topic, partition=offsets.partition,
                 from_offset=offsets.start, to_offset=offsets.end)
        return self.cur.fetchall()

    # -- planning -----------------------------------------------------------------------

    def partitions(self) -> dict[Partition, PartitionState]:
        """What the ledger says about each partition the pipeline planned before: its start,
        frontier, the ranges and gaps reaching past the frontier, released ranges, and the
        id of the topic whose offsets these are."""
        states = {}
        self.run("partitions", pipeline=self.config.name)
        for topic, partition, start, frontier, topic_id in self.cur.fetchall():
            states[(topic, partition)] = PartitionState(topic, partition, start, frontier, topic_id=topic_id)
        for statement, field in (("taken_ranges", "taken"), ("released_ranges", "released")):
            self.run(statement, pipeline=self.config.name)
            for topic, partition, a, b in self.cur.fetchall():
                state = states[(topic, partition)]
                states[(topic, partition)] = replace(
                    state, **{field: getattr(state, field) + (OffsetRange(topic, partition, a, b),)})
        return states

    def topic_ids(self, checkpoint_id: int) -> dict[str, dict[int, str]]:
        """Per topic, per partition: the id of the topic the checkpoint's ranges were planned in,
        where recorded (a read the Spark job makes)."""
        found: dict[str, dict[int, str]] = {}
        self.run("checkpoint_topic_ids", checkpoint_id=checkpoint_id)
        for topic, partition, topic_id in self.cur.fetchall():
            found.setdefault(topic, {})[partition] = topic_id
        return found

    def insert_checkpoint(self, dag_run_id: str, interval_start: datetime | None, interval_end: datetime | None,
                          reach: Reach, state: State, lease_until: datetime, now: datetime) -> int:
        self.run("insert_checkpoint", pipeline=self.config.name, dag_run_id=dag_run_id,
                 interval_start=interval_start, interval_end=interval_end, reach=reach.value, state=state.value,
                 lease_until=lease_until, now=now)
        return self.cur.fetchone()[0]

    def insert_plans(self, checkpoint_id: int, plans: Sequence[PartitionPlan], now: datetime) -> None:
        """Each partition's frozen ranges, its gaps, its released ranges marked as planned
        again (split where the cap cut one), and its frontier. Sent in pages of statements
        (`execute_batch`): 512 partitions took 1,024 round trips one by one (0.27 s of a
        plan's 1.3 s, issue 63). A split precedes the mark of the same released range."""
        batches: dict[str, list[dict]] = {"insert_range": [], "insert_gap": [], "split_released": [],
                                          "mark_replanned": [], "set_frontier": []}
        for plan in plans:
            where = {"pipeline": self.config.name, "topic": plan.topic, "partition": plan.partition,
                     "checkpoint_id": checkpoint_id}
            batches["insert_range"] += [dict(where, from_offset=r.start, to_offset=r.end, topic_id=plan.topic_id)
                                        for r in plan.ranges]
            batches["insert_gap"] += [dict(where, from_offset=gap.start, to_offset=gap.end, now=now)
                                      for gap in plan.gaps]
            left = {r.end: r.start for r in plan.left_released}  # where the cap cut a released range
            for released in plan.released:
                end = left.get(released.end, released.end)
                if end < released.end:
                    batches["split_released"].append(dict(where, from_offset=released.start,
                                                          to_offset=released.end, cut=end))
                batches["mark_replanned"].append(dict(where, from_offset=released.start, to_offset=end))
            batches["set_frontier"].append(dict(where, start_offset=plan.start_offset, frontier=plan.frontier,
                                                topic_id=plan.topic_id))
        for statement, params in batches.items():  # a page joins them with ";": none may end in a comment
            execute_batch(self.cur, Q[statement], params)

    # -- staging ------------------------------------------------------------------------

    def staged(self, checkpoint_id: int, attempt: int) -> dict[str, Staged]:
        """Row count of the attempt's rows in every staging table (an index scan)."""
        found = {}
        for name, table in self.staging.items():
            self.cur.execute(sql.SQL(Q["staged_summary"]).format(staging=table),
                             {"checkpoint_id": checkpoint_id, "attempt": attempt})
            found[name] = Staged(*self.cur.fetchone())
        return found

    def delete_staging(self, checkpoint_id: int, attempt: int | None) -> None:
        """The attempt's staging rows, or every attempt's when attempt is None."""
        for table in self.staging.values():
            self.cur.execute(sql.SQL(Q["delete_staging"]).format(staging=table),
                             {"checkpoint_id": checkpoint_id, "attempt": attempt})

    def lease_expiries(self, ranges: tuple[OffsetRange, ...], prefix: str) -> int:
        """How many checkpoints a lease expiry (a reason beginning with `prefix`) aborted
        that held some of these offsets."""
        found = 0
        for r in ranges:
            if r.size:
                self.run("lease_expiries", pipeline=self.config.name, topic=r.topic, partition=r.partition,
                         from_offset=r.start, to_offset=r.end, prefix=prefix)
                found = max(found, self.cur.fetchone()[0])
        return found

    def delete_stale_staging(self) -> int:
        deleted = 0
        for table in self.staging.values():
            self.cur.execute(sql.SQL(Q["delete_stale_staging"]).format(staging=table),
                             {"pipeline": self.config.name})
            deleted += self.cur.rowcount
        return deleted

    def sink_tables(self, sink: Sink) -> SinkTables:
        return SinkTables(final_table(sink), self.staging[sink.name], contributions_table(self.config, sink),
                          self.columns(final_table(sink)), self.config.source.deletes,
                          self.config.name)

    def promotion(self, sink: Sink, reprocessing: bool) -> list[sql.Composed]:
        """The statements that merge the sink's staged rows of %(checkpoint_id)s/%(attempt)s
        into its final table as the contribution of %(slot)s: a promotion, or a
        reprocessing's (forget, put), where forget's row count is the rows taken back."""
        tables = self.sink_tables(sink)
        return list(sink.strategy.replace(sink, tables)) if reprocessing else [sink.strategy.promote(sink, tables)]

    def lock_commits(self, alone: bool) -> None:
        """Shared among the pipeline's commits; a reprocessing's commit runs `alone`."""
        self.run("lock_commits_alone" if alone else "lock_commits", pipeline=self.config.name)

    def refused_at_commit(self, checkpoint_id: int) -> bool:
        """Whether a final table refused a commit of this checkpoint, or of the checkpoint
        whose released ranges it plans again."""
        self.run("refused_at_commit", checkpoint_id=checkpoint_id, prefix=PromotionRefused.PREFIX + "%")
        return self.cur.fetchone()[0]

    def may_refuse(self, sink: Sink) -> bool:
        """Whether the sink's final table can refuse rows whose values fit its columns: a
        CHECK, foreign key or exclusion constraint, a trigger, or a unique index besides
        the one its merge conflicts on."""
        if not sink.strategy.unique_columns(sink):
            return False  # a table nothing is merged into is never written (a kafka sink's)
        table = final_table(sink).as_string(self.cur)
        self.run("refusing_constraints", table=table)
        if self.cur.fetchone()[0]:
            return True
        self.run("unique_indexes", table=table)
        return any(frozenset(columns) != sink.strategy.unique_columns(sink) for columns, in self.cur.fetchall())

    def references(self, sink: Sink, referenced: Sink) -> bool:
        """Whether the sink's final table has a foreign key to the other's."""
        self.run("references_table", table=final_table(sink).as_string(self.cur),
                 referenced=final_table(referenced).as_string(self.cur))
        return self.cur.fetchone()[0]

    def columns(self, table: sql.Identifier) -> list[str]:
        """The table's columns in table order; empty if it does not exist."""
        self.run("table_columns", table=table.as_string(self.cur))
        return [row[0] for row in self.cur.fetchall()]
