"""Retention: what the ledger stops keeping as a pipeline's checkpoints age, by its
configuration's `retention` (exactly_once.retention_policy), one bounded step at a time.

A step, run after each commit (exactly_once.orchestration.tasks), is three short
transactions, each over at most `retention.batch` checkpoints:

1. fold: committed checkpoints beyond the reprocess horizon give their contributions to the
   upsert and aggregate sinks to the pipeline's base checkpoint, folded per key or group
   (sql/merge/keyed.sql `fold`), and their committed ranges, merged (sql/retention.sql).
   The final tables do not change, and a reprocessing of a checkpoint inside the horizon
   recomputes its keys from the base and the checkpoints since, as exactly as before. A
   checkpoint beyond the horizon is no longer reprocessed (exactly_once.ledger.replays),
   and one with an open reprocessing is not folded until that ends. The fold holds the
   pipeline's lock (what a reprocessing's begin holds while it checks the horizon) and runs
   alone among the pipeline's commits, but waits for neither: it skips the fold instead.
2. history: folded checkpoints beyond the history, and aborted ones that hold nothing, are
   deleted with their attempts and frozen ranges; so are old operator actions, cleared
   alerts and preflights of earlier versions.
3. dead letters beyond their retention are deleted, oldest first.

One step of a pipeline runs at a time: a step that finds another running does nothing.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import timedelta
from typing import TYPE_CHECKING

from pydantic import TypeAdapter

from exactly_once.ledger.access import LedgerAccess
from exactly_once.ledger.refusals import NotReprocessable
from exactly_once.sinks import keeps_contributions
from exactly_once.sqlfiles import named

if TYPE_CHECKING:
    from exactly_once.ledger.rows import LedgerRows

Q = named("retention.sql")
DEAD_LETTERS_PER_STEP = 10_000


@dataclass(frozen=True)
class Pruned:
    """What one step did; `busy` if a commit, a plan or recovery, or another step of the
    pipeline was running, so nothing was folded."""

    folded: int = 0
    deleted: int = 0
    dead_letters: int = 0
    busy: bool = False

    @property
    def idle(self) -> bool:
        """Nothing left to do: the step found nothing to fold or delete."""
        return not (self.folded or self.deleted or self.dead_letters or self.busy)


def prune(ledger: LedgerAccess) -> Pruned:
    """One step of the pipeline's retention (the module's docstring)."""
    retention, now = ledger.config.retention, ledger.now()
    folded, busy = _fold(ledger, retention.horizon(now), retention.batch, now)
    return Pruned(folded=folded, busy=busy, deleted=_delete_history(ledger, retention.history_cutoff(now),
                                                                    retention.batch),
                  dead_letters=_delete_dead_letters(ledger, retention.dead_letters_cutoff(now)))


def refuse_beyond_horizon(ledger: LedgerAccess, cur, checkpoint_id: int) -> None:
    """`NotReprocessable` for a committed checkpoint beyond the reprocess horizon, or folded:
    its contributions are the base's, and no recompute could take them back. Run under the
    pipeline's lock, without which no fold runs."""
    retention = ledger.config.retention
    horizon = retention.horizon(ledger.now())
    cur.execute(Q["age"], {"checkpoint_id": checkpoint_id})
    committed_at, folded = cur.fetchone()
    if not folded and (horizon is None or committed_at >= horizon):
        return
    setting = TypeAdapter(timedelta | None).dump_python(retention.reprocess_horizon, mode="json")
    since = "" if horizon is None else f", so since {horizon:%Y-%m-%d %H:%M:%S %Z}"
    raise NotReprocessable(
        f"checkpoint {checkpoint_id} was committed {committed_at:%Y-%m-%d %H:%M:%S %Z}, and is "
        f"{'folded' if folded else 'beyond'} pipeline {ledger.config.name!r}'s reprocess horizon "
        f"(retention.reprocess_horizon: {setting}{since}): its contributions are, or are about to be, folded into "
        "the pipeline's base, so it cannot be reprocessed exactly; only a checkpoint committed inside the horizon "
        "can be")


@contextmanager
def _step(ledger: LedgerAccess) -> Iterator[LedgerRows | None]:
    """A transaction of a step: its rows, or None when another step of the pipeline runs."""
    with ledger.rows() as rows:
        rows.cur.execute(Q["may_prune"], {"pipeline": ledger.config.name})
        yield rows if rows.cur.fetchone()[0] else None


def _fold(ledger: LedgerAccess, horizon, batch: int, now) -> tuple[int, bool]:
    if horizon is None:
        return 0, False
    pipeline = ledger.config.name
    with _step(ledger) as rows:
        if rows is None:
            return 0, True
        rows.cur.execute(Q["may_fold"], {"pipeline": pipeline})
        if not rows.cur.fetchone()[0]:
            return 0, True
        rows.cur.execute(Q["foldable"], {"pipeline": pipeline, "horizon": horizon, "batch": batch})
        found = rows.cur.fetchall()
        if not found:
            return 0, False
        rows.cur.execute(Q["base"], {"pipeline": pipeline, "now": now})
        params = {"pipeline": pipeline, "folded": [checkpoint_id for checkpoint_id, _ in found],
                  "kept": all(kept for _, kept in found), "base": rows.cur.fetchone()[0], "now": now}
        for sink in ledger.config.sinks:
            if keeps_contributions(sink):
                rows.cur.execute(sink.strategy.fold(sink, rows.sink_tables(sink)), params)
        rows.cur.execute(Q["fold_ranges"], params)
        rows.cur.execute(Q["mark_folded"], params)
        return len(found), False


def _delete_history(ledger: LedgerAccess, cutoff, batch: int) -> int:
    if cutoff is None:
        return 0
    params = {"pipeline": ledger.config.name, "cutoff": cutoff, "batch": batch}
    with _step(ledger) as rows:
        if rows is None:
            return 0
        rows.cur.execute(Q["expired"], params)
        ids = [checkpoint_id for checkpoint_id, in rows.cur.fetchall()]
        if ids:
            rows.cur.execute(Q["delete_checkpoints"], {"ids": ids})
        rows.cur.execute(Q["delete_history"], params)
        return len(ids)


def _delete_dead_letters(ledger: LedgerAccess, cutoff) -> int:
    if cutoff is None:
        return 0
    with _step(ledger) as rows:
        if rows is None:
            return 0
        rows.cur.execute(Q["delete_dead_letters"], {"pipeline": ledger.config.name, "cutoff": cutoff,
                                                    "rows": DEAD_LETTERS_PER_STEP})
        return rows.cur.rowcount
