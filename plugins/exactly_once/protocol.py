"""The exactly-once protocol: Flink's two-phase commit mapped onto batch checkpoints.

    Flink                              here (each step is one PostgreSQL transaction)
    initializeState on restart         recover()        commit what is pre-committed, abort what was abandoned
    checkpoint n begins (barrier)      begin()          recover, then freeze the next offset range per partition
    beginTransaction                   start_attempt()  a new fencing token; older attempts are fenced off
    preCommit                          pre_commit()     the attempt's staging rows are complete: counts, checksum
    notifyCheckpointComplete, commit   commit()         promote staging and record the offsets, atomically
    abort                              abort(), abort_attempt()

The states and their transitions are drawn in sql/migrations/0001_ledger.sql.
Outcomes that are not success are exceptions of type `ProtocolError`, each
saying what happened; nothing is logged and dropped.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator, Mapping
from contextlib import closing, contextmanager
from dataclasses import dataclass, replace
from datetime import datetime, timezone
from enum import Enum
from typing import Protocol

from psycopg2 import sql

from exactly_once import faults
from exactly_once.config import PipelineConfig, Sink, load_config
from exactly_once.merge import (DEAD_LETTER_STAGING, DEAD_LETTERS, final_table, merge_statement,
                                required_columns, staging_table, unique_columns)
from exactly_once.planning import OffsetRange, PartitionOffsets, PartitionState, cap_plans, plan_partition, start_offset
from exactly_once.sqlfiles import named, text

Q = named("ledger.sql")


class OffsetSource(Protocol):
    """What planning asks Kafka (exactly_once.kafka_offsets.KafkaOffsets)."""

    def partitions(self, topic: str) -> list[int]: ...

    def offsets(self, topic: str, partition: int, interval_end: datetime | None,
                start_time: datetime | None = None) -> PartitionOffsets: ...


@dataclass(frozen=True)
class Staged:
    rows: int
    checksum: str


@dataclass(frozen=True)
class Checkpoint:
    id: int
    dag_run_id: str
    state: str
    attempt: int                       # the current attempt's fencing token; 0 before the first
    ranges: tuple[OffsetRange, ...]
    interval_start: datetime | None = None
    interval_end: datetime | None = None
    lease_until: datetime | None = None
    precommitted_attempt: int | None = None
    staged: Mapping[str, Staged] | None = None   # recorded at pre-commit
    records: int | None = None                   # Kafka records the pre-committed attempt read
    reason: str | None = None                    # why it was last aborted or sent back

    @property
    def is_empty(self) -> bool:
        return all(r.size == 0 for r in self.ranges)


@dataclass(frozen=True)
class Committable:
    """What pre-commit hands to commit (Flink's committable): a value."""

    checkpoint_id: int
    attempt: int
    ranges: tuple[OffsetRange, ...]
    staged: Mapping[str, Staged]


@dataclass(frozen=True)
class Recovery:
    committed: tuple[int, ...] = ()    # pre-committed checkpoints committed now
    aborted: tuple[int, ...] = ()      # abandoned checkpoints whose ranges go to the next plan
    sent_back: tuple[int, ...] = ()    # pre-committed, but their staged rows changed: to run again
    stale_staging_rows: int = 0        # rows of fenced or crashed attempts, deleted


@dataclass(frozen=True)
class Begun:
    checkpoint: Checkpoint
    recovery: Recovery
    new: bool                          # False: this DAG run had begun it before (a retry reuses the plan)


class CommitOutcome(Enum):
    COMMITTED = "committed now"
    ALREADY_COMMITTED = "already committed"


class ProtocolError(Exception):
    """A known outcome other than success."""


class Fenced(ProtocolError):
    """The attempt is no longer the checkpoint's current one: it may change nothing."""


class NotRunnable(ProtocolError):
    """The checkpoint's state allows no new attempt (see `.state`)."""

    def __init__(self, checkpoint: Checkpoint, message: str):
        self.state = checkpoint.state
        super().__init__(message)


class StagingIncomplete(ProtocolError):
    """Pre-commit found other row counts in staging than the attempt wrote."""


class StagedDataChanged(ProtocolError):
    """Commit found the staged rows changed since pre-commit; the checkpoint must run again."""


class NotPreCommitted(ProtocolError):
    """Commit was asked for a checkpoint that has nothing pre-committed."""


class SinkTableError(ValueError):
    """A sink's final table is missing or cannot take order-independent merges."""


def _utcnow() -> datetime:
    return datetime.now(timezone.utc)


class Ledger:
    """The protocol for one pipeline, on the pipeline database."""

    def __init__(self, config: PipelineConfig, connect: Callable[[], object],
                 clock: Callable[[], datetime] = _utcnow, fault: Callable[[str], None] = faults.point):
        self.config = config
        self._connect = connect
        self._clock = clock
        self._fault = fault

    @classmethod
    def of_registered(cls, pipeline: str, connect: Callable[[], object], **options) -> Ledger:
        """The ledger of a pipeline as it was last registered (how a Spark job finds its configuration)."""
        with closing(connect()) as conn, conn, conn.cursor() as cur:
            cur.execute(Q["pipeline_config"], {"pipeline": pipeline})
            row = cur.fetchone()
        if row is None:
            raise LookupError(f"pipeline {pipeline!r} is not registered in the ledger")
        return cls(load_config(row[0]), connect, **options)

    def connect(self):
        """A new connection to the pipeline database."""
        return self._connect()

    # -- begin: recover, then plan -------------------------------------------------

    def begin(self, dag_run_id: str, interval_start: datetime | None, interval_end: datetime | None,
              kafka: OffsetSource) -> Begun:
        """Begins the DAG run's checkpoint, or returns the one it began before (a retry)."""
        self.register()
        recovery = self.recover()
        existing = self._checkpoint_of_run(dag_run_id)
        if existing is not None:
            return Begun(existing, recovery, new=False)
        start_time = self.config.source.start if isinstance(self.config.source.start, datetime) else None
        # Asked before the lock: a snapshot taken a moment earlier is as valid a planning time.
        seen = {(topic, p): kafka.offsets(topic, p, interval_end, start_time)
                for topic in self.config.source.topics for p in kafka.partitions(topic)}
        with self._transaction() as cur:
            self._lock(cur)
            existing_id = self._id_of_run(cur, dag_run_id)
            if existing_id is None:
                existing_id = self._plan(cur, dag_run_id, interval_start, interval_end, seen)
            checkpoint = self._load(cur, existing_id)
        return Begun(checkpoint, recovery, new=True)

    def _plan(self, cur, dag_run_id, interval_start, interval_end,
              seen: Mapping[tuple[str, int], PartitionOffsets]) -> int:
        name = self.config.name
        cur.execute(Q["partitions"], {"pipeline": name})
        known = {(t, p): (start, frontier) for t, p, start, frontier in cur.fetchall()}
        cur.execute(Q["released_ranges"], {"pipeline": name})
        released = {(t, p): (cp, OffsetRange(t, p, a, b)) for cp, t, p, a, b in cur.fetchall()}
        plans = []
        for (topic, partition), offsets in sorted(seen.items()):
            start, frontier = known.get((topic, partition), (None, None))
            if start is None:
                start = start_offset(self.config.source.start, offsets, new_pipeline=not known)
            state = PartitionState(topic, partition, frontier, released.get((topic, partition), (None, None))[1])
            plans.append(plan_partition(state, offsets, start, self.config.allow_data_loss))
        plans = cap_plans(plans, self.config.max_records_per_run)

        now = self._clock()
        nothing_to_read = all(p.range.size == 0 for p in plans)
        cur.execute(Q["insert_checkpoint"], {
            "pipeline": name, "dag_run_id": dag_run_id, "interval_start": interval_start,
            "interval_end": interval_end, "state": "committed" if nothing_to_read else "planned",
            "lease_until": now + self.config.lease, "now": now})
        checkpoint_id = cur.fetchone()[0]
        for plan in plans:
            r = plan.range
            where = {"pipeline": name, "topic": r.topic, "partition": r.partition, "checkpoint_id": checkpoint_id}
            cur.execute(Q["insert_range"], {**where, "from_offset": r.start, "to_offset": r.end})
            if plan.gap is not None:
                cur.execute(Q["insert_gap"], {**where, "from_offset": plan.gap.start, "to_offset": plan.gap.end,
                                              "now": now})
            if plan.replanned:
                cur.execute(Q["mark_replanned"], {**where, "released_from": released[(r.topic, r.partition)][0]})
            else:
                cur.execute(Q["set_frontier"], {**where, "start_offset": plan.start_offset, "frontier": r.end})
        self._fault("begin.before_commit")
        return checkpoint_id

    # -- the two phases ---------------------------------------------------------------

    def start_attempt(self, checkpoint_id: int) -> Checkpoint:
        """A new attempt of a planned or running checkpoint; earlier attempts are fenced off
        and their staging rows discarded (staging is replaced, never added to)."""
        with self._transaction() as cur:
            checkpoint = self._load(cur, checkpoint_id)
            if checkpoint.state not in ("planned", "running"):
                raise NotRunnable(checkpoint, _not_runnable_message(checkpoint))
            now = self._clock()
            cur.execute(Q["start_attempt"], {"checkpoint_id": checkpoint_id, "lease_until": now + self.config.lease})
            attempt = cur.fetchone()[0]
            self._end_attempts(cur, checkpoint_id, None, "running", "aborted", f"superseded by attempt {attempt}")
            cur.execute(Q["insert_attempt"], {"checkpoint_id": checkpoint_id, "attempt": attempt, "now": now})
            self._delete_staging(cur, checkpoint_id, attempt=None)
            self._fault("start_attempt.before_commit")
        return replace(checkpoint, state="running", attempt=attempt)

    def pre_commit(self, checkpoint_id: int, attempt: int, rows: Mapping[str, int], records: int) -> Committable:
        """Phase one: the attempt says it wrote `rows` staging rows per sink (and dead letters).
        Only the current attempt of a running checkpoint may pre-commit (compare-and-set)."""
        expected = set(self._staging_tables())
        if set(rows) != expected:
            raise ValueError(f"pre_commit needs row counts for exactly {sorted(expected)}, got {sorted(rows)}")
        with self._transaction() as cur:
            checkpoint = self._load(cur, checkpoint_id)
            if checkpoint.state != "running" or checkpoint.attempt != attempt:
                raise Fenced(f"attempt {attempt} of checkpoint {checkpoint_id} is fenced: the checkpoint is "
                             f"{checkpoint.state} and its current attempt is {checkpoint.attempt}")
            staged = self._staged(cur, checkpoint_id, attempt)
            wrong = {name: (rows[name], s.rows) for name, s in staged.items() if s.rows != rows[name]}
            if wrong:
                raise StagingIncomplete(f"checkpoint {checkpoint_id} attempt {attempt}: staging holds other row "
                                        f"counts than written ((written, found) per sink: {wrong})")
            cur.execute(Q["mark_precommitted"], {
                "checkpoint_id": checkpoint_id, "attempt": attempt, "records": records, "now": self._clock(),
                "staged": json.dumps({name: vars(s) for name, s in staged.items()})})
            self._end_attempts(cur, checkpoint_id, attempt, "running", "precommitted", None)
            self._fault("pre_commit.before_commit")
        return Committable(checkpoint_id, attempt, checkpoint.ranges, staged)

    def commit(self, checkpoint_id: int) -> CommitOutcome:
        """Phase two, in one transaction: promote every sink's staged rows, record the
        committed ranges, mark the checkpoint committed, clear its staging. Idempotent."""
        with self._transaction() as cur:
            checkpoint = self._load(cur, checkpoint_id)
            if checkpoint.state == "committed":
                return CommitOutcome.ALREADY_COMMITTED
            if checkpoint.state != "precommitted":
                raise NotPreCommitted(f"checkpoint {checkpoint_id} is {checkpoint.state}, not pre-committed: "
                                      "its Spark attempt has not finished")
            attempt, recorded = checkpoint.precommitted_attempt, checkpoint.staged
            staged = self._staged(cur, checkpoint_id, attempt)
            if staged == recorded:
                params = {"checkpoint_id": checkpoint_id, "attempt": attempt, "now": self._clock()}
                for sink in self.config.sinks:
                    cur.execute(merge_statement(self.config.name, sink, self._columns(cur, final_table(sink))), params)
                cur.execute(text("merge/dead_letters.sql"), params)
                cur.execute(Q["promote_ranges"], params)
                cur.execute(Q["mark_committed"], params)
                self._end_attempts(cur, checkpoint_id, attempt, "precommitted", "committed", None)
                self._delete_staging(cur, checkpoint_id, attempt=None)
                self._fault("commit.before_commit")
                return CommitOutcome.COMMITTED
        changes = {name: (recorded.get(name), staged.get(name)) for name in set(recorded) | set(staged)
                   if recorded.get(name) != staged.get(name)}
        reason = f"staged rows changed after pre-commit of attempt {attempt} ((pre-committed, found): {changes})"
        self._send_back(checkpoint_id, attempt, reason)
        raise StagedDataChanged(f"checkpoint {checkpoint_id} not committed: {reason}; it is planned again "
                                "and will be run again from its frozen ranges")

    # -- abort and recovery -------------------------------------------------------------

    def abort_attempt(self, checkpoint_id: int, attempt: int, reason: str) -> bool:
        """A failed attempt: its staging rows go, the checkpoint is planned again with the same
        ranges. False (and nothing changes) if the attempt is no longer the current one."""
        with self._transaction() as cur:
            checkpoint = self._load(cur, checkpoint_id)
            if checkpoint.state != "running" or checkpoint.attempt != attempt:
                return False
            cur.execute(Q["mark_planned"], {"checkpoint_id": checkpoint_id, "reason": reason,
                                            "lease_until": checkpoint.lease_until})
            self._end_attempts(cur, checkpoint_id, attempt, "running", "aborted", reason)
            self._delete_staging(cur, checkpoint_id, attempt)
        return True

    def abort(self, checkpoint_id: int, reason: str) -> str:
        """Aborts a planned or running checkpoint: its staging rows go and its ranges are
        released, to be planned again, exactly, by the next checkpoint. A pre-committed or
        committed checkpoint is never aborted. Returns the checkpoint's state afterwards."""
        with self._transaction() as cur:
            checkpoint = self._load(cur, checkpoint_id)
            if checkpoint.state not in ("planned", "running"):
                return checkpoint.state
            cur.execute(Q["mark_aborted"], {"checkpoint_id": checkpoint_id, "reason": reason})
            self._end_attempts(cur, checkpoint_id, None, "running", "aborted", reason)
            self._delete_staging(cur, checkpoint_id, attempt=None)
        return "aborted"

    def recover(self) -> Recovery:
        """Commits every pre-committed checkpoint; aborts those whose lease ran out; deletes
        staging rows no commit can promote (a zombie attempt that wrote after it was fenced)."""
        now = self._clock()
        with self._transaction() as cur:
            cur.execute(Q["recoverable"], {"pipeline": self.config.name, "now": now})
            found = cur.fetchall()
        committed, aborted, sent_back = [], [], []
        for checkpoint_id, state in found:
            if state == "precommitted":
                try:
                    if self.commit(checkpoint_id) is CommitOutcome.COMMITTED:
                        committed.append(checkpoint_id)
                except StagedDataChanged:
                    sent_back.append(checkpoint_id)
            elif self.abort(checkpoint_id, f"lease expired before {now.isoformat()}; its ranges are "
                                           "planned again by the next checkpoint") == "aborted":
                aborted.append(checkpoint_id)
        stale = 0
        with self._transaction() as cur:
            for table in self._staging_tables().values():
                cur.execute(sql.SQL(Q["delete_stale_staging"]).format(staging=table), {"pipeline": self.config.name})
                stale += cur.rowcount
        return Recovery(tuple(committed), tuple(aborted), tuple(sent_back), stale)

    # -- registration -------------------------------------------------------------------

    def register(self) -> None:
        """Records the pipeline and creates each sink's staging table (idempotent). Checks
        that every final table exists and is unique on what its merge needs."""
        with self._transaction() as cur:
            self._lock(cur)
            cur.execute(Q["register_pipeline"], {"pipeline": self.config.name,
                                                 "config": self.config.model_dump_json()})
            for sink in self.config.sinks:
                self._check_final_table(cur, sink)
                staging = staging_table(self.config.name, sink.name)
                cur.execute(sql.SQL(Q["create_staging"]).format(
                    staging=staging, final=final_table(sink),
                    staging_index=sql.Identifier(f"stg_{self.config.name}_{sink.name}_attempt")))
                if self._columns(cur, staging) != [*self._columns(cur, final_table(sink)), "checkpoint_id", "attempt"]:
                    raise SinkTableError(f"sink {sink.name!r}: staging table {staging.as_string(cur)} no longer matches "
                                         f"final table {sink.table}; drop it while no checkpoint is open")

    def _check_final_table(self, cur, sink: Sink) -> None:
        columns = self._columns(cur, final_table(sink))
        if not columns:
            raise SinkTableError(f"sink {sink.name!r}: final table {sink.table} does not exist")
        missing = sorted(required_columns(sink) - set(columns))
        if missing:
            raise SinkTableError(f"sink {sink.name!r}: final table {sink.table} lacks columns {missing}")
        cur.execute(Q["unique_indexes"], {"table": final_table(sink).as_string(cur)})
        if unique_columns(sink) not in {frozenset(row[0]) for row in cur.fetchall()}:
            raise SinkTableError(f"sink {sink.name!r} ({sink.mode}): final table {sink.table} needs a unique "
                                 f"index or constraint on exactly {sorted(unique_columns(sink))}")

    # -- reading ------------------------------------------------------------------------

    def final_columns(self) -> dict[str, list[str]]:
        """Each sink's final table columns, in table order (what its staging rows carry)."""
        with self._transaction() as cur:
            return {sink.name: self._columns(cur, final_table(sink)) for sink in self.config.sinks}

    def checkpoint(self, checkpoint_id: int) -> Checkpoint:
        with self._transaction() as cur:
            return self._load(cur, checkpoint_id)

    def _checkpoint_of_run(self, dag_run_id: str) -> Checkpoint | None:
        with self._transaction() as cur:
            found = self._id_of_run(cur, dag_run_id)
            return None if found is None else self._load(cur, found)

    def _id_of_run(self, cur, dag_run_id: str) -> int | None:
        cur.execute(Q["checkpoint_of_run"], {"pipeline": self.config.name, "dag_run_id": dag_run_id})
        row = cur.fetchone()
        return None if row is None else row[0]

    def _load(self, cur, checkpoint_id: int) -> Checkpoint:
        cur.execute(Q["checkpoint"], {"checkpoint_id": checkpoint_id, "pipeline": self.config.name})
        row = cur.fetchone()
        if row is None:
            raise LookupError(f"checkpoint {checkpoint_id} of pipeline {self.config.name!r} does not exist")
        cp_id, dag_run_id, state, attempt, interval_start, interval_end, lease_until, precommitted_attempt, \
            staged, records, reason = row
        cur.execute(Q["checkpoint_ranges"], {"checkpoint_id": checkpoint_id})
        ranges = tuple(OffsetRange(*r) for r in cur.fetchall())
        staged = None if staged is None else {name: Staged(**s) for name, s in staged.items()}
        return Checkpoint(cp_id, dag_run_id, state, attempt, ranges, interval_start, interval_end, lease_until,
                          precommitted_attempt, staged, records, reason)

    # -- helpers ------------------------------------------------------------------------

    @contextmanager
    def _transaction(self) -> Iterator:
        with closing(self._connect()) as conn:
            with conn, conn.cursor() as cur:
                yield cur

    def _lock(self, cur) -> None:
        cur.execute(Q["lock_pipeline"], {"pipeline": self.config.name})

    def _staging_tables(self) -> dict[str, sql.Identifier]:
        tables = {s.name: staging_table(self.config.name, s.name) for s in self.config.sinks}
        return {**tables, DEAD_LETTERS: DEAD_LETTER_STAGING}

    def _staged(self, cur, checkpoint_id: int, attempt: int) -> dict[str, Staged]:
        staged = {}
        for name, table in self._staging_tables().items():
            cur.execute(sql.SQL(Q["staged_summary"]).format(staging=table),
                        {"checkpoint_id": checkpoint_id, "attempt": attempt})
            staged[name] = Staged(*cur.fetchone())
        return staged

    def _delete_staging(self, cur, checkpoint_id: int, attempt: int | None) -> None:
        for table in self._staging_tables().values():
            cur.execute(sql.SQL(Q["delete_staging"]).format(staging=table),
                        {"checkpoint_id": checkpoint_id, "attempt": attempt})

    def _end_attempts(self, cur, checkpoint_id: int, attempt: int | None, from_state: str, state: str,
                      reason: str | None) -> None:
        cur.execute(Q["end_attempts"], {"checkpoint_id": checkpoint_id, "attempt": attempt, "from_state": from_state,
                                        "state": state, "reason": reason, "now": self._clock()})

    def _send_back(self, checkpoint_id: int, attempt: int, reason: str) -> None:
        with self._transaction() as cur:
            checkpoint = self._load(cur, checkpoint_id)
            if checkpoint.state != "precommitted":
                return  # someone else resolved it meanwhile
            # lease_until = now: the next run's recovery re-plans it if no retry runs it first.
            cur.execute(Q["mark_planned"], {"checkpoint_id": checkpoint_id, "reason": reason,
                                            "lease_until": self._clock()})
            self._end_attempts(cur, checkpoint_id, attempt, "precommitted", "aborted", reason)
            self._delete_staging(cur, checkpoint_id, attempt=None)

    @staticmethod
    def _columns(cur, table: sql.Identifier) -> list[str]:
        cur.execute(Q["table_columns"], {"table": table.as_string(cur)})
        return [row[0] for row in cur.fetchall()]


def _not_runnable_message(checkpoint: Checkpoint) -> str:
    why = {
        "precommitted": "its attempt is pre-committed and waits for commit",
        "committed": "it is already committed",
        "aborted": "it was aborted and its ranges were planned again by a later checkpoint",
    }[checkpoint.state]
    return f"checkpoint {checkpoint.id} cannot start an attempt: {why}"
