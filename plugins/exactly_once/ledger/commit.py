"""Phase two: the commit of a pre-committed checkpoint (Flink's `notifyCheckpointComplete`
→ `commit`), and what each way it can fail means for the checkpoint: sent back to run
again (the staged rows changed, or a final table refused a record's row), or, for a
failure no record isolation fixes, counted and stalled with its pre-commit kept. The
statements that promote are exactly_once.ledger.promotion's.
"""

from __future__ import annotations

import logging
import time
from dataclasses import replace
from typing import TYPE_CHECKING

import psycopg2

from exactly_once.config import PipelineConfig
from exactly_once.errors import error_message, error_text
from exactly_once.ledger.checkpoints import AttemptState, Checkpoint, Outcome, State, TaskTry, cause, commit_stalls
from exactly_once.ledger.clean_up import clean_up
from exactly_once.ledger.promotion import promote
from exactly_once.ledger.refusals import NotPreCommitted, PromotionRefused, StagedDataChanged, Stalled
from exactly_once.ledger.tables import DEAD_LETTERS

if TYPE_CHECKING:
    from exactly_once.ledger.access import LedgerAccess
    from exactly_once.ledger.rows import LedgerRows

log = logging.getLogger(__name__)


def commit(ledger: LedgerAccess, checkpoint_id: int, task: TaskTry | None = None) -> Outcome:
    """Phase two, in one transaction: promote every sink's staged rows, record the
    committed ranges, mark the checkpoint committed, by the rules of the configuration
    version its attempt ran with. Idempotent. Its staging rows are deleted after that
    transaction (`recover` deletes them if that never happens): the commit holds its
    locks for the promotion only. `SentBack` (the checkpoint planned again) if the staged
    row counts changed since pre-commit or a final table refuses some rows; `Stalled`
    (its pre-commit kept) if it fails for another reason that retrying cannot fix, or
    keeps failing for one (`checkpoints.commit_stalls`). A checkpoint stalled at commit
    is committed only by an operator: a cleared commit task, whose try (`task`) is not its
    first and began after the stall (`Checkpoint.resumed_by`); any other call gets `Stalled`."""
    started = time.monotonic()
    try:
        with ledger.rows() as rows:
            checkpoint = rows.checkpoint(checkpoint_id)
            if checkpoint.state is State.COMMITTED:
                rows.delete_staging(checkpoint_id, attempt=None)  # a clean-up that did not run
                return Outcome.ALREADY_COMMITTED
            if not checkpoint.awaits_commit:
                raise NotPreCommitted(f"checkpoint {checkpoint_id} is {checkpoint.state.value}, not "
                                      "pre-committed: its Spark attempt has not finished")
            if checkpoint.state is State.STALLED:
                if not checkpoint.resumed_by(task):
                    raise Stalled(ledger.config.name, checkpoint)
                rows.record_action("resume", checkpoint_id, ledger.now(),
                                   f"its commit was tried again by a task cleared after the stall (its try "
                                   f"{task.number} began {task.started.isoformat()}) after: {checkpoint.reason}")
            over_budget = _stall_over_budget(ledger, rows, checkpoint)
            if over_budget is None:
                committable = checkpoint.committable
                rows = rows.as_of(rows.attempt_version(committable.checkpoint_id, committable.attempt))
                staged = rows.staged(checkpoint_id, committable.attempt)
                promoted = staged == committable.staged
                if promoted:
                    ledger.fault("commit.before_promote")
                    promote(rows, committable, ledger.now())
                    rows.record_seconds(checkpoint_id, commit=time.monotonic() - started)
                    ledger.fault("commit.before_commit")
        if over_budget is not None:
            raise Stalled(ledger.config.name, over_budget)
        if promoted:
            ledger.fault("commit.before_clean_up")
            clean_up(ledger, checkpoint_id, rows.config)
            return Outcome.COMMITTED
    except PromotionRefused as refused:
        _send_back(ledger, checkpoint_id, committable.attempt, str(refused), rows.config, failed=True)
        raise PromotionRefused(f"checkpoint {checkpoint_id} not committed: {refused}; it is planned again, and "
                               "its next attempt promotes every sink on trial and dead-letters the records "
                               "at fault") from refused.__cause__
    except psycopg2.Error as error:
        _record_failure(ledger, checkpoint_id, error)
        raise
    changes = {name: (committable.staged.get(name), staged.get(name))
               for name in set(committable.staged) | set(staged)
               if committable.staged.get(name) != staged.get(name)}
    reason = (f"staged rows changed after pre-commit of attempt {committable.attempt} "
              f"((pre-committed, found): {changes})")
    _send_back(ledger, checkpoint_id, committable.attempt, reason, rows.config)
    raise StagedDataChanged(f"checkpoint {checkpoint_id} not committed: {reason}; it is planned again "
                            "and will be run again from its frozen ranges")

def _stall_over_budget(ledger: LedgerAccess, rows: LedgerRows, checkpoint: Checkpoint) -> Checkpoint | None:
    """Stalls a pre-committed checkpoint whose dead letters exceed the pipeline's budget
    (exactly_once.dead_letter_budget), its pre-commit kept; the stalled checkpoint, or None
    when it is within the budget or already stalled: an operator who clears a stalled commit
    task has looked, and it commits as it is."""
    if checkpoint.state is not State.PRECOMMITTED:
        return None
    breach = ledger.config.dead_letter_budget.breach(checkpoint.staged[DEAD_LETTERS].rows, checkpoint.records or 0)
    if breach is None:
        return None
    reason = (f"{breach}; look at them (status, the pipelines view), then fix the cause and retry it, or "
              "clear its commit task to commit it as it is")
    rows.run("record_commit_failure", checkpoint_id=checkpoint.id, reason=reason, failures=1, stalled=True,
             now=ledger.now())
    return replace(checkpoint, state=State.STALLED, reason=reason)


def _send_back(ledger: LedgerAccess, checkpoint_id: int, attempt: int, reason: str, config: PipelineConfig,
               failed: bool = False) -> None:
    """`failed`: the attempt counts as failed (for `stalls`), not merely superseded.
    `config`: the attempt's, whose staging tables hold its rows."""
    reason = error_text(reason)
    with ledger.rows() as rows:
        if not rows.checkpoint(checkpoint_id).awaits_commit:
            return  # someone else resolved it meanwhile
        rows = rows.as_of(config)
        # lease_until = now: the next run's recovery re-plans it if no retry runs it first.
        rows.run("mark_planned", checkpoint_id=checkpoint_id, reason=reason, lease_until=ledger.now())
        rows.end_attempts(checkpoint_id, attempt, AttemptState.PRECOMMITTED, AttemptState.ABORTED, reason,
                          ledger.now(), True if failed else None)
        rows.delete_staging(checkpoint_id, attempt=None)



def _record_failure(ledger: LedgerAccess, checkpoint_id: int, error: psycopg2.Error) -> None:
    """Records a commit that failed for a reason that is no record's (a permission, a column
    gone, a timeout, a clash in the ledger's tables); raises `Stalled` if that stalls the
    checkpoint (`checkpoints.commit_stalls`), its pre-commit kept; else returns, and the
    caller raises the error for a retry or the next recovery."""
    reason = error_text(f"commit failed: {error.pgcode or 'no SQLSTATE'}: {error_message(error)}")
    try:
        with ledger.rows() as rows:
            checkpoint = rows.checkpoint(checkpoint_id)
            if not checkpoint.awaits_commit:
                return
            same = checkpoint.commit_failures and cause(checkpoint.reason or "") == cause(reason)
            failures = checkpoint.commit_failures + 1 if same else 1
            stalled = checkpoint.state is State.STALLED or commit_stalls(error.pgcode, failures,
                                                                        ledger.config.stall_after)
            rows.run("record_commit_failure", checkpoint_id=checkpoint_id, reason=reason, failures=failures,
                     stalled=stalled, now=ledger.now())
    except psycopg2.Error:
        return  # the database fails this too: nothing is recorded, the commit's error stands
    if stalled:
        raise Stalled(ledger.config.name, replace(checkpoint, state=State.STALLED, reason=reason)) from error
