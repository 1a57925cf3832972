"""Phase two's promotion: a pre-committed attempt's staged rows into the final tables, in
the commit's transaction (exactly_once.ledger.commit owns the transaction and what a
failure means)."""

from __future__ import annotations

import json
from datetime import datetime

import psycopg2

from exactly_once.ledger.checkpoints import AttemptState, Committable
from exactly_once.ledger.refusals import PromotionRefused
from exactly_once.ledger.rows import LedgerRows
from exactly_once.ledger.tables import DEAD_LETTERS
from exactly_once.sqlfiles import named
from exactly_once.sqlstates import record_failure


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
    rows.run("forget_trial_promotions", checkpoint_id=committable.checkpoint_id)
    rows.end_attempts(committable.checkpoint_id, committable.attempt, AttemptState.PRECOMMITTED,
                      AttemptState.COMMITTED, None, now)
