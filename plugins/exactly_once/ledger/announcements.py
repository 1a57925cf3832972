"""Which committed checkpoints an Airflow task announces (an asset event per sink:
exactly_once.orchestration.assets): those no task announced yet, claimed in the ledger by the
task's try generation (`announcer`), and those it claimed before — a retry announces again
what a try that failed after claiming never emitted. Whoever committed a checkpoint (its run's
commit task, a later run's recovery, the command line), the first task to claim it
announces it, once.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import TYPE_CHECKING

from exactly_once.ledger.planning import OffsetRange

if TYPE_CHECKING:
    from exactly_once.ledger.access import LedgerAccess


@dataclass(frozen=True)
class Committed:
    """A committed checkpoint as announced: its rows per sink are the rows it put in (for a
    reprocessing, which replaced the contribution of the checkpoint it replays, also the
    rows it took back: `taken_back`)."""

    checkpoint_id: int
    dag_run_id: str
    interval_start: datetime | None
    interval_end: datetime | None
    ranges: tuple[OffsetRange, ...]
    rows: Mapping[str, int]
    config_version: str | None
    replays: int | None = None
    taken_back: Mapping[str, int] | None = None


def claim(ledger: LedgerAccess, announcer: str) -> list[Committed]:
    """The pipeline's committed checkpoints for `announcer` to announce, claimed in one
    transaction (a concurrent claim of another task waits, then finds them claimed); oldest first."""
    with ledger.rows() as rows:
        rows.run("claim_announcements", pipeline=ledger.config.name, announcer=announcer)
        claimed = sorted(rows.cur.fetchall())
        committed = []
        for checkpoint_id, replaced, version in claimed:
            checkpoint = rows.checkpoint(checkpoint_id, locked=False)
            committed.append(Committed(
                checkpoint.id, checkpoint.dag_run_id, checkpoint.interval_start, checkpoint.interval_end,
                checkpoint.ranges, {name: staged.rows for name, staged in (checkpoint.staged or {}).items()},
                version, checkpoint.replays,
                None if replaced is None else {name: counts["old"] for name, counts in replaced.items()}))
    return committed
