"""The exactly-once protocol: Flink's two-phase commit mapped onto batch checkpoints.

    Flink                              here (each step is one PostgreSQL transaction)
    initializeState on restart         recover()        commit what is pre-committed, abort what was abandoned
    checkpoint n begins (barrier)      begin()          recover, then freeze the next offset range per partition
    (replay a completed checkpoint)    replays.reprocess()  a checkpoint that replays a committed one's ranges
    beginTransaction                   start_attempt()  a new fencing token; older attempts are fenced off
    preCommit                          pre_commit()     the attempt's staging rows are complete: row counts
    notifyCheckpointComplete, commit   commit()         promote staging and record the offsets, atomically
    abort                              abort(), abort_attempt()

States and values are in exactly_once.ledger.checkpoints, their transitions drawn in
sql/migrations/0001_ledger.sql (and 0004, 0009); rows are read and written by
exactly_once.ledger.rows, phase two is exactly_once.ledger.commit (its statements
exactly_once.ledger.promotion's), leases exactly_once.ledger.leases. A step returns an `Outcome` or a value; a refusal is a
`ProtocolError` saying what happened and whether a retry may help. Nothing is logged
and dropped but a failed staging clean-up after a commit, which a retried commit or
the next recovery does again.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterator, Mapping
from contextlib import closing, contextmanager
from dataclasses import replace
from datetime import datetime, timezone

from exactly_once import faults
from exactly_once.catalog import ColumnType
from exactly_once.config import PipelineConfig, load_stored_config
from exactly_once.errors import ConfigError, error_text
from exactly_once.ledger import trials
from exactly_once.ledger.checkpoints import (Attempt, AttemptState, Begun, Checkpoint, Committable, Outcome, Recovery,
                                             State, TaskTry, stalls)
from exactly_once.ledger.commit import commit
from exactly_once.ledger.leases import expire
from exactly_once.ledger.planning import OffsetSource, PartitionOffsets, Reach, plan_checkpoint
from exactly_once.ledger.refusals import Fenced, NotRunnable, SentBack, StagingIncomplete, Stalled
from exactly_once.ledger.registration import final_columns, register
from exactly_once.ledger.rows import LedgerRows, attempt_config, registered_config
from exactly_once.ledger.transactions import Transactions
from exactly_once.ledger.waiting import seen_offsets
from exactly_once.sinks.upsert import ambiguous_partitions

log = logging.getLogger(__name__)


def _utcnow() -> datetime:
    return datetime.now(timezone.utc)


class Ledger:
    """The protocol for one pipeline, on the pipeline database."""

    def __init__(self, config: PipelineConfig, connect: Callable[[], object],
                 clock: Callable[[], datetime] = _utcnow, fault: Callable[[str], None] = faults.point):
        self.config = config
        self._connect = connect
        self.transactions = Transactions(connect)  # `rows`'s; `transactions.kept()` reuses connections
        self._clock = clock
        self.fault = fault  # a fault point's hook (exactly_once.faults), for the fault matrix and tests

    @classmethod
    def of_registered(cls, pipeline: str, connect: Callable[[], object], **options) -> Ledger:
        """The ledger of a pipeline as it was last registered (how a Spark job finds its configuration)."""
        with closing(connect()) as conn, conn, conn.cursor() as cur:
            return cls(load_stored_config(registered_config(cur, pipeline)), connect, **options)

    @classmethod
    def of_attempt(cls, pipeline: str, checkpoint_id: int, attempt: int, connect: Callable[[], object],
                   **options) -> Ledger:
        """The ledger with the configuration the attempt was started with (how its Spark job
        runs exactly that version, whatever was registered since)."""
        with closing(connect()) as conn, conn, conn.cursor() as cur:
            return cls(load_stored_config(attempt_config(cur, pipeline, checkpoint_id, attempt)), connect, **options)

    def connect(self):
        """A new connection to the pipeline database."""
        return self._connect()

    def now(self) -> datetime:
        return self._clock()

    # -- begin: recover, then plan -------------------------------------------------

    def begin(self, dag_run_id: str, interval_start: datetime | None, interval_end: datetime | None,
              kafka: OffsetSource, reach: Reach = Reach.BACKLOG) -> Begun:
        """Begins the DAG run's checkpoint, or returns the one it began before (a retry).
        `Stalled` while another checkpoint of the pipeline is stalled."""
        started = time.monotonic()
        self.refuse_if_stalled(dag_run_id)
        self.register()
        recovery = self.recover(own_run=dag_run_id)
        self.refuse_if_stalled(dag_run_id)  # recovery may have stalled one (lease expiries, a commit)
        with self.rows() as rows:
            existing = rows.checkpoint_of_run(dag_run_id)
            if existing is not None:
                return Begun(rows.checkpoint(existing), recovery, new=False)
        # Asked before the lock: a snapshot taken a moment earlier is as valid a planning time.
        seen = seen_offsets(self.config, kafka, interval_start, interval_end)
        with self.rows() as rows:
            rows.lock()
            checkpoint_id = rows.checkpoint_of_run(dag_run_id)
            new = checkpoint_id is None
            if new:
                checkpoint_id = self._plan(rows, dag_run_id, interval_start, interval_end, reach, seen)
                rows.record_seconds(checkpoint_id, plan=time.monotonic() - started)
            return Begun(rows.checkpoint(checkpoint_id), recovery, new=new)

    def refuse_if_stalled(self, dag_run_id: str) -> None:
        """`Stalled` while a checkpoint of the pipeline other than the run's own (or its
        reprocessings) is stalled."""
        with self.rows() as rows:
            stalled = [c for c in rows.stalled() if c.dag_run_id != dag_run_id]
            if stalled:
                raise Stalled(self.config.name, stalled[0])

    def _plan(self, rows: LedgerRows, dag_run_id: str, interval_start: datetime | None,
              interval_end: datetime | None, reach: Reach, seen: Mapping[tuple[str, int], PartitionOffsets]) -> int:
        known = rows.partitions()
        ambiguous = ambiguous_partitions(self.config, set(known), set(seen))
        if ambiguous:
            raise ConfigError(ambiguous)
        plans = plan_checkpoint(seen, known, self.config.source.start, reach, self.config.allow_data_loss,
                                self.config.max_records_per_run)
        now = self.now()
        state = State.COMMITTED if all(p.size == 0 for p in plans) else State.PLANNED
        checkpoint_id = rows.insert_checkpoint(dag_run_id, interval_start, interval_end, reach, state,
                                               now + self.config.lease, now)
        rows.insert_plans(checkpoint_id, plans, now)
        self.fault("begin.before_commit")
        return checkpoint_id

    # -- the two phases ---------------------------------------------------------------

    def start_attempt(self, checkpoint_id: int, task: TaskTry | None = None) -> Checkpoint:
        """A new attempt of a planned or running checkpoint; earlier attempts are fenced off
        and their staging rows discarded (staging is replaced, never added to). A stalled one
        only by an operator's cleared task: a try (`task`) not its first that began after the
        stall (`Checkpoint.resumed_by`); else `Stalled`."""
        with self.rows() as rows:
            checkpoint = rows.checkpoint(checkpoint_id)
            if not checkpoint.state.open or checkpoint.awaits_commit:
                raise NotRunnable(checkpoint)
            now = self.now()
            if checkpoint.state is State.STALLED:  # only a person starts one: retries stop at a stall
                if not checkpoint.resumed_by(task):
                    raise Stalled(self.config.name, checkpoint)
                rows.record_action("resume", checkpoint_id, now,
                                   f"a new attempt was started by a task cleared after the stall "
                                   f"(its try {task.number} began {task.started.isoformat()}) after: {checkpoint.reason}")
            rows.run("start_attempt", checkpoint_id=checkpoint_id, lease_until=now + self.config.lease)
            attempt = rows.cur.fetchone()[0]
            rows.end_attempts(checkpoint_id, None, AttemptState.RUNNING, AttemptState.ABORTED,
                              f"superseded by attempt {attempt}", now)
            rows.run("insert_attempt", checkpoint_id=checkpoint_id, attempt=attempt, now=now,
                     config_version=rows.record_version())
            rows.delete_staging(checkpoint_id, attempt=None)
            started = replace(checkpoint, state=State.RUNNING, attempt=attempt)
            trials.write(rows, started)
            self.fault("start_attempt.before_commit")
        return started

    def pre_commit(self, checkpoint_id: int, attempt: int, rows_written: Mapping[str, int],
                   records: int, spark_seconds: float | None = None) -> Committable:
        """Phase one: the attempt says it wrote `rows_written` staging rows per sink (and dead
        letters), its job taking `spark_seconds`. Only the current attempt of a running
        checkpoint may pre-commit (compare-and-set)."""
        started = time.monotonic()
        with self.rows() as rows:
            if set(rows_written) != set(rows.staging):
                raise ValueError(f"pre_commit needs row counts for exactly {sorted(rows.staging)}, "
                                 f"got {sorted(rows_written)}")
            checkpoint = self._current(rows, checkpoint_id, attempt)
            staged = rows.staged(checkpoint_id, attempt)
            wrong = {name: (rows_written[name], s.rows) for name, s in staged.items() if s.rows != rows_written[name]}
            if wrong:
                raise StagingIncomplete(f"checkpoint {checkpoint_id} attempt {attempt}: staging holds other row "
                                        f"counts than written ((written, found) per sink: {wrong})")
            now = self.now()
            rows.mark_precommitted(checkpoint_id, attempt, staged, records, now)
            rows.end_attempts(checkpoint_id, attempt, AttemptState.RUNNING, AttemptState.PRECOMMITTED, None, now)
            spark = {} if spark_seconds is None else {"spark": spark_seconds}
            rows.record_seconds(checkpoint_id, **spark, pre_commit=time.monotonic() - started)
            self.fault("pre_commit.before_commit")
        return Committable(checkpoint_id, attempt, checkpoint.ranges, staged)

    def commit(self, checkpoint_id: int, task: TaskTry | None = None) -> Outcome:
        """Phase two, in one transaction, idempotent: promote the staged rows and record the
        committed ranges (exactly_once.ledger.commit says what each refusal means). A
        checkpoint stalled at commit only by an operator: a cleared task's try (`task`)."""
        return commit(self, checkpoint_id, task)

    # -- abort and recovery -------------------------------------------------------------

    def abort_attempt(self, checkpoint_id: int, attempt: int, reason: str, retryable: bool = True) -> Outcome:
        """A failed attempt: its staging rows go and the attempt records why and whether a
        retry may help. The checkpoint is planned again with the same ranges (ABORTED), or,
        if its failures say no retry will do (`checkpoints.stalls`), stalled (STALLED).
        UNCHANGED if the attempt is no longer the current one (fenced, or already aborted).
        The reason is kept as `errors.error_text` makes it: bounded, no record values."""
        reason = error_text(reason)
        with self.rows() as rows:
            checkpoint = rows.checkpoint(checkpoint_id)
            if not checkpoint.is_current(attempt):
                return Outcome.UNCHANGED
            rows.end_attempts(checkpoint_id, attempt, AttemptState.RUNNING, AttemptState.ABORTED, reason,
                              self.now(), retryable)
            rows.delete_staging(checkpoint_id, attempt)
            if stalls(rows.failed_attempts(checkpoint_id), self.config.stall_after):
                rows.run("mark_stalled", checkpoint_id=checkpoint_id, reason=reason, now=self.now())
                return Outcome.STALLED
            rows.run("mark_planned", checkpoint_id=checkpoint_id, reason=reason, lease_until=checkpoint.lease_until)
        return Outcome.ABORTED

    def abort(self, checkpoint_id: int, reason: str) -> Outcome:
        """Aborts a planned or running checkpoint: its staging rows go and its ranges are
        released, to be planned again, exactly, by the next checkpoint. A pre-committed or
        committed checkpoint is never aborted (UNCHANGED)."""
        with self.rows() as rows:
            if rows.checkpoint(checkpoint_id).awaits_commit:  # stalled at commit: only an operator releases it
                return Outcome.UNCHANGED
            return self.release(rows, checkpoint_id, reason)

    def release(self, rows: LedgerRows, checkpoint_id: int, reason: str) -> Outcome:
        """`abort` in the caller's transaction (an operator's action: exactly_once.operate.stalls)."""
        if not rows.checkpoint(checkpoint_id).state.open:
            return Outcome.UNCHANGED
        rows.run("mark_aborted", checkpoint_id=checkpoint_id, reason=reason)
        rows.run("forget_trial_promotions", checkpoint_id=checkpoint_id)
        rows.end_attempts(checkpoint_id, None, AttemptState.RUNNING, AttemptState.ABORTED, reason, self.now())
        rows.delete_staging(checkpoint_id, attempt=None)
        return Outcome.ABORTED

    def recover(self, own_run: str | None = None) -> Recovery:
        """Commits every pre-committed checkpoint; aborts those whose lease ran out (but the
        checkpoint of `own_run`, the run recovering: a cleared run resumes it), or stalls one
        whose offsets lease expiries took from `stall_after` checkpoints in a row; deletes
        staging rows no commit can promote (a zombie attempt that wrote after it was fenced,
        a committed checkpoint's whose clean-up did not run)."""
        now = self.now()
        with self.rows() as rows:
            rows.run("recoverable", pipeline=self.config.name, now=now, own_run=own_run or "")
            found = [(checkpoint_id, State(state)) for checkpoint_id, state in rows.cur.fetchall()]
        committed, aborted, sent_back = [], [], []
        for checkpoint_id, state in found:
            if state is State.PRECOMMITTED:
                try:
                    if self.commit(checkpoint_id) is Outcome.COMMITTED:
                        committed.append(checkpoint_id)
                except SentBack:
                    sent_back.append(checkpoint_id)
            elif expire(self, checkpoint_id, now) is Outcome.ABORTED:
                aborted.append(checkpoint_id)
        with self.rows() as rows:
            stale = rows.delete_stale_staging()
        return Recovery(tuple(committed), tuple(aborted), tuple(sent_back), stale)

    # -- registration and reading -------------------------------------------------------

    def register(self) -> None:
        """Records the pipeline and creates each sink's staging table (idempotent). Checks
        that every final table exists and is unique on what its merge needs."""
        with self.rows() as rows:
            rows.lock()
            register(rows)

    def final_columns(self) -> dict[str, list[ColumnType]]:
        """Each sink's final table columns with their types (`registration.final_columns`)."""
        with self.rows() as rows:
            return final_columns(rows)

    def checkpoint(self, checkpoint_id: int) -> Checkpoint:
        with self.rows() as rows:
            return rows.checkpoint(checkpoint_id)

    def attempt_token(self, checkpoint_id: int, attempt: int) -> str:
        """The secret the attempt's task hands its job (`exactly_once.ledger.trials`)."""
        with self.rows() as rows:
            return trials.token(rows, checkpoint_id, attempt)

    def attempt(self, checkpoint_id: int, attempt: int) -> Attempt:
        with self.rows() as rows:
            return rows.attempt(checkpoint_id, attempt)

    def current(self, checkpoint_id: int, attempt: int) -> Checkpoint:
        """The checkpoint, if `attempt` is still its current one; `Fenced` otherwise. A read
        (the Spark job's), which locks nothing."""
        with self.rows() as rows:
            return self._current(rows, checkpoint_id, attempt, locked=False)

    @staticmethod
    def _current(rows: LedgerRows, checkpoint_id: int, attempt: int, locked: bool = True) -> Checkpoint:
        checkpoint = rows.checkpoint(checkpoint_id, locked)
        if not checkpoint.is_current(attempt):
            raise Fenced(f"attempt {attempt} of checkpoint {checkpoint_id} is fenced: the checkpoint is "
                         f"{checkpoint.state.value} and its current attempt is {checkpoint.attempt}")
        return checkpoint

    @contextmanager
    def rows(self) -> Iterator[LedgerRows]:
        """The ledger's rows in one transaction (on a connection of its own unless kept)."""
        with self.transactions.transaction() as cur:
            yield LedgerRows(cur, self.config)
