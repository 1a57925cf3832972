"""What phase two (`commit`), leases (`leases`) and the staging clean-up (`clean_up`) need
of the protocol's `Ledger` (exactly_once.ledger.protocol): the protocol calls them, so they
see it through this interface and never import it.
"""

from __future__ import annotations

from contextlib import AbstractContextManager
from datetime import datetime
from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    from exactly_once.config import PipelineConfig
    from exactly_once.ledger.checkpoints import Outcome
    from exactly_once.ledger.rows import LedgerRows


class LedgerAccess(Protocol):
    @property
    def config(self) -> PipelineConfig: ...

    def rows(self) -> AbstractContextManager[LedgerRows]:
        """The ledger's rows in one transaction on a connection of its own."""

    def now(self) -> datetime: ...

    def fault(self, point: str) -> None:
        """A fault point (exactly_once.faults)."""

    def release(self, rows: LedgerRows, checkpoint_id: int, reason: str) -> Outcome:
        """Aborts an open checkpoint in the caller's transaction, its ranges to the next plan."""
