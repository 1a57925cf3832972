"""How long the ledger keeps what a pipeline's checkpoints leave behind (`retention:` in a
pipeline's configuration), and the reprocess horizon that bounds it: what is pruned, and
when, is exactly_once.ledger.retention's.

The defaults follow the anchors' own bounds and stay above them: Delta Lake keeps its log
30 days, so a checkpoint is reprocessed exactly for 30 days; the history an operator reads
(attempts, actions, alerts) and the dead letters stay for a quarter, long enough to look
into an incident after the fact.
"""

from __future__ import annotations

from datetime import datetime, timedelta

from pydantic import BaseModel, ConfigDict, Field, PositiveInt, model_validator


class Retention(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    reprocess_horizon: timedelta | None = Field(
        timedelta(days=30), gt=timedelta(0),
        description="How long after its commit a checkpoint can be reprocessed (null: forever). Beyond it, "
                    "its contributions to the upsert and aggregate sinks are folded into one base "
                    "contribution per key or group, and its committed ranges into one range per partition; "
                    "a reprocessing of it is refused, naming the horizon.")
    history: timedelta | None = Field(
        timedelta(days=90), gt=timedelta(0),
        description="How long checkpoints beyond the horizon, their attempts, aborted checkpoints, operator "
                    "actions, cleared alerts and preflights are kept (null: forever); at least "
                    "`reprocess_horizon`.")
    dead_letters: timedelta | None = Field(
        timedelta(days=90), gt=timedelta(0),
        description="How long committed dead letters are kept (null: forever); copy them elsewhere before "
                    "that if they must be kept longer.")
    batch: PositiveInt = Field(
        100, description="Most checkpoints one step folds or deletes (one step runs after each commit), so a "
                         "step holds its locks briefly.")

    @model_validator(mode="after")
    def _history_covers_the_horizon(self) -> Retention:
        if self.history is not None and (self.reprocess_horizon is None or self.history < self.reprocess_horizon):
            raise ValueError(f"retention.history ({self.history}) is shorter than retention.reprocess_horizon "
                             f"({self.reprocess_horizon or 'forever'}): a checkpoint that can still be reprocessed "
                             "would be deleted")
        return self

    def horizon(self, now: datetime) -> datetime | None:
        """Checkpoints committed before this time are beyond the reprocess horizon."""
        return None if self.reprocess_horizon is None else now - self.reprocess_horizon

    def history_cutoff(self, now: datetime) -> datetime | None:
        return None if self.history is None else now - self.history

    def dead_letters_cutoff(self, now: datetime) -> datetime | None:
        return None if self.dead_letters is None else now - self.dead_letters
