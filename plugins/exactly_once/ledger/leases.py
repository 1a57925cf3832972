"""Leases: how long a begun checkpoint or a running attempt is held before another run's
recovery may take it over (`PipelineConfig.lease`).

A running attempt's lease is renewed by its task while the task lives (`heartbeat`), so
a job longer than the lease is never taken over by a sibling run. A checkpoint whose lease
ran out (its task died, or it waited too long to start) is aborted and its ranges go to
the next plan (`expire`), within that plan's cap; when lease expiries keep taking the
same offsets from checkpoint after checkpoint, it stalls instead (promise 9): a loop of
aborts that only an operator can end is said out loud.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import datetime
from typing import TYPE_CHECKING

import psycopg2

from exactly_once.ledger.checkpoints import AttemptState, Outcome, State

if TYPE_CHECKING:
    from exactly_once.ledger.access import LedgerAccess

log = logging.getLogger(__name__)
LEASE_EXPIRED = "lease expired"  # how a reason given by a lease's expiry begins


@contextmanager
def heartbeat(ledger: LedgerAccess, checkpoint_id: int, attempt: int) -> Iterator[None]:
    """Renews the running attempt's lease every third of it while the block runs. A renewal
    that fails is tried again at the next beat; the lease is the safety net."""
    stop = threading.Event()
    lease = ledger.config.lease

    def beat() -> None:
        while not stop.wait(lease.total_seconds() / 3):
            try:
                with ledger.rows() as rows:
                    rows.run("renew_lease", checkpoint_id=checkpoint_id, attempt=attempt,
                             lease_until=ledger.now() + lease)
            except psycopg2.Error as error:
                log.warning("checkpoint %s attempt %s: lease not renewed this time: %s", checkpoint_id, attempt,
                            error)

    beating = threading.Thread(target=beat, name=f"lease of checkpoint {checkpoint_id}", daemon=True)
    beating.start()
    try:
        yield
    finally:
        stop.set()
        beating.join()


def expire(ledger: LedgerAccess, checkpoint_id: int, now: datetime) -> Outcome:
    """A checkpoint whose lease ran out: aborted, its ranges to the next plan; stalled
    instead when lease expiries aborted `stall_after` - 1 checkpoints holding its offsets
    before. UNCHANGED if it was renewed or resolved since recovery found it."""
    reason = f"{LEASE_EXPIRED} before {now.isoformat()}; its ranges are planned again by the next checkpoint"
    with ledger.rows() as rows:
        checkpoint = rows.checkpoint(checkpoint_id)
        if checkpoint.state not in (State.PLANNED, State.RUNNING) or checkpoint.lease_until >= now:
            return Outcome.UNCHANGED
        expired = rows.lease_expiries(checkpoint.ranges, LEASE_EXPIRED + "%") + 1
        if expired < ledger.config.stall_after:
            return ledger.release(rows, checkpoint_id, reason)
        rows.end_attempts(checkpoint_id, None, AttemptState.RUNNING, AttemptState.ABORTED, reason, now)
        rows.delete_staging(checkpoint_id, attempt=None)
        rows.run("mark_stalled", checkpoint_id=checkpoint_id, now=now,
                 reason=f"{LEASE_EXPIRED} {expired} times in a row over these offsets: each run ended before its "
                        "checkpoint committed and no task renewed its lease (workers killed? a lease shorter "
                        "than a queued run waits?)")
        return Outcome.STALLED
