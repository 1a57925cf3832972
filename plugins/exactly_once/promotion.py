"""Phase two's promotion: a pre-committed attempt's staged rows into the final tables, in
the commit's transaction (exactly_once.protocol.Ledger.commit owns the transaction), and
what a failure of it that is no record's does to the checkpoint."""

from __future__ import annotations

import json
from dataclasses import replace
from datetime import datetime
from typing import TYPE_CHECKING

import psycopg2

from exactly_once.checkpoints import AttemptState, Committable, State, cause, commit_stalls
from exactly_once.errors import PromotionRefused, Stalled, error_message, error_text
from exactly_once.isolation import record_failure
from exactly_once.ledger_rows import LedgerRows
from exactly_once.sqlfiles import named
from exactly_once.tables import DEAD_LETTERS

if TYPE_CHECKING:
    from exactly_once.protocol import Ledger


def promote(rows: LedgerRows, committable: Committable, now: datetime) -> None:
    """Every sink's staged rows of the pre-committed attempt, the dead letters and the
    ranges; the checkpoint is marked committed with them. A reprocessing replaces the
    replayed checkpoint's contribution instead (its ranges are committed already) and
    records the rows taken back and put in per sink. `PromotionRefused` names the sink
    whose final table refuses a row."""
    reprocessing = committable.replays is not None
    params = {"checkpoint_id": committable.checkpoint_id, "attempt": committable.attempt, "now": now,
              "slot": committable.slot}
    rows.lock_commits(alone=reprocessing)
    taken_back = {}
    for sink in rows.config.sinks:
        try:
            for step, statement in enumerate(rows.promotion(sink, reprocessing)):
                rows.cur.execute(statement, params)
                if reprocessing and step == 0:  # forget: the rows taken back
                    taken_back[sink.name] = rows.cur.rowcount
        except psycopg2.Error as error:
            failure = record_failure(error)
            if failure is None:
                raise
            raise PromotionRefused(f"{PromotionRefused.PREFIX}: sink {sink.name}: {failure[1]}") from error
    dead_letters = named("merge/dead_letters.sql")
    if reprocessing:
        rows.cur.execute(dead_letters["forget"], params)
        taken_back[DEAD_LETTERS] = rows.cur.rowcount
    rows.cur.execute(dead_letters["promote"], params)
    if not reprocessing:
        rows.run("promote_ranges", **params)
    replaced = {name: {"old": old, "new": committable.staged[name].rows} for name, old in taken_back.items()}
    rows.run("mark_committed", **params, replaced=json.dumps(replaced) if reprocessing else None)
    rows.end_attempts(committable.checkpoint_id, committable.attempt, AttemptState.PRECOMMITTED,
                      AttemptState.COMMITTED, None, now)


def record_commit_failure(ledger: Ledger, checkpoint_id: int, error: psycopg2.Error) -> None:
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
                     stalled=stalled)
    except psycopg2.Error:
        return  # the database fails this too: nothing is recorded, the commit's error stands
    if stalled:
        raise Stalled(ledger.config.name, replace(checkpoint, state=State.STALLED, reason=reason)) from error
