"""The dead-letter budget: how many of a checkpoint's records may go to the dead letters
before its commit stalls (promise 9) instead of committing. Without it, a producer's schema
change that sends every record to the dead letters keeps every run green.

Checked by the commit (exactly_once.ledger.commit) on the attempt's pre-commit counts; a
checkpoint stalled on it is committed as it is once an operator clears its commit task.
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field, PositiveInt

BREACH = "dead-letter budget exceeded"  # how a stall's reason says so (status, the view, alerts)


class DeadLetterBudget(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    ratio: float | None = Field(
        0.5, gt=0, le=1,
        description="Most dead letters a checkpoint may commit, as a share of the Kafka records it read "
                    "(null: no ratio): its commit stalls when it has at least `ratio_from` dead letters and "
                    "they are more than this share. The default (more than half, once there are 20 dead "
                    "letters) catches a producer whose records the pipeline can no longer read, not a bad "
                    "record now and then.")
    ratio_from: PositiveInt = Field(
        20, description="The ratio applies once a checkpoint has this many dead letters (a count of dead "
                        "letters, not of records read), so that a small checkpoint with a bad record or two "
                        "does not stall.")
    count: PositiveInt | None = Field(
        None, description="Most dead letters a checkpoint may commit, whatever it read (null: no count).")

    def breach(self, dead_letters: int, records: int) -> str | None:
        """Why `dead_letters` among `records` exceed the budget, or None if they do not."""
        share = f"{dead_letters} of the {records} records it read are dead letters"
        if self.count is not None and dead_letters > self.count:
            return f"{BREACH}: {share}, more than dead_letter_budget.count {self.count}"
        if self.ratio is not None and dead_letters >= self.ratio_from and dead_letters > self.ratio * records:
            return (f"{BREACH}: {share} ({dead_letters / max(records, dead_letters):.1%}), more than "
                    f"dead_letter_budget.ratio {self.ratio:g}")
        return None
