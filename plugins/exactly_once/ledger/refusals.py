"""The protocol's refusals: a step of exactly_once.ledger.protocol that cannot do what it
was asked says why, and whether a retry of the same task may help (`retryable`)."""

from __future__ import annotations

from exactly_once.dead_letter_budget import BREACH
from exactly_once.errors import PipelineError
from exactly_once.ledger.checkpoints import Checkpoint, State


class ProtocolError(PipelineError):
    """A known refusal of a protocol step."""


class Fenced(ProtocolError):
    """The attempt is no longer the checkpoint's current one: it may change nothing."""

    retryable = False


class NotRunnable(ProtocolError):
    """The checkpoint's state allows no new attempt (see `.state`)."""

    retryable = False

    def __init__(self, checkpoint: Checkpoint):
        self.state = checkpoint.state
        self.done = checkpoint.awaits_commit or checkpoint.state is State.COMMITTED  # its attempt's work is done
        why = {State.PRECOMMITTED: "its attempt is pre-committed and waits for commit",
               State.STALLED: "its attempt is pre-committed and its commit is stalled: clear its commit task",
               State.COMMITTED: "it is already committed",
               State.ABORTED: "it was aborted and its ranges were planned again by a later checkpoint"}
        super().__init__(f"checkpoint {checkpoint.id} cannot start an attempt: {why[checkpoint.state]}")


class NotReprocessable(ProtocolError):
    """The checkpoint cannot be reprocessed (not committed, or its keyed sinks' contributions were not kept)."""

    retryable = False


class StagingIncomplete(ProtocolError):
    """Pre-commit found other row counts in staging than the attempt wrote (a new attempt may succeed)."""


class SentBack(ProtocolError):
    """Commit could not promote the pre-committed attempt; the checkpoint is planned again,
    to run again from its frozen ranges."""

    retryable = False


class StagedDataChanged(SentBack):
    """Commit found the staged rows changed since pre-commit."""


class PromotionRefused(SentBack):
    """A final table refused staged rows at commit (a table without constraints the attempt
    knew of, or whose data changed since its trial promotion). The checkpoint's ranges
    run again, promoting every sink on trial, so the records at fault are isolated."""

    PREFIX = "a final table refused staged rows at commit"  # how its attempt's recorded reason begins


class NotPreCommitted(ProtocolError):
    """Commit was asked for a checkpoint that has nothing pre-committed."""

    retryable = False


class Stalled(ProtocolError):
    """A checkpoint of the pipeline is stalled: no run goes on until an operator acts."""

    retryable = False

    def __init__(self, pipeline: str, checkpoint: Checkpoint):
        self.checkpoint_id = checkpoint.id
        ranges = ", ".join(r.label for r in checkpoint.ranges if r.size)
        reason = (checkpoint.reason or "").rstrip(".")
        retry = f"`python -m exactly_once.operate.stalls retry {checkpoint.id}` to run its ranges again"
        if reason.startswith(BREACH):  # its reason says the way out; dead-lettering more would only add to them
            what, way_out = "is not committed, its pre-commit kept", f"(or, after fixing the pipeline, {retry})"
        else:
            task = "commit" if checkpoint.awaits_commit else "increment"
            what = "its commit keeps failing (its pre-commit is kept)" if checkpoint.awaits_commit else "keeps failing"
            way_out = (f"Fix the cause, then clear its {task} task (or run {retry}), or dead-letter the records at "
                       f"fault: `python -m exactly_once.operate.stalls dead-letter {pipeline} "
                       "'TOPIC[PARTITION]@FROM..TO' --reason WHY`")
        super().__init__(f"pipeline {pipeline!r} is stalled: checkpoint {checkpoint.id} (DAG run "
                         f"{checkpoint.dag_run_id}, ranges {ranges}) {what}; last error: {reason}. {way_out}")
