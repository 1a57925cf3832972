"""What can go wrong, and whether running the same step again may help.

Every error the library raises on purpose is a `PipelineError`; `retryable`
says whether a retry of the same task can succeed (a lost connection, a killed
executor) or cannot (a wrong configuration, a missing table, a fenced attempt).
The protocol's refusals are here; other `Permanent` errors stand beside their
causes: `ConfigError` (config.py), `SinkTableError` (registration.py),
`DataLossError` (planning.py), `BadRecords` (increment.py).
`exactly_once.outcomes` turns that into what the orchestrator does.
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING, ClassVar

if TYPE_CHECKING:
    from exactly_once.checkpoints import Checkpoint


class PipelineError(Exception):
    """A known failure of a pipeline step."""

    retryable: ClassVar[bool] = True


class Permanent(PipelineError):
    """A failure that no retry of the same step can fix: it needs a person or a later run."""

    retryable: ClassVar[bool] = False


class AttemptFailed(PipelineError):
    """A Spark attempt failed; its own error decided whether a retry may help."""

    def __init__(self, message: str, retryable: bool):
        super().__init__(message)
        self.retryable = retryable  # type: ignore[misc]  # per instance: the attempt's recorded verdict


class ProtocolError(PipelineError):
    """A known refusal of a protocol step."""


class Fenced(ProtocolError):
    """The attempt is no longer the checkpoint's current one: it may change nothing."""

    retryable = False


class NotRunnable(ProtocolError):
    """The checkpoint's state allows no new attempt (see `.state`)."""

    retryable = False

    def __init__(self, checkpoint: Checkpoint):
        from exactly_once.checkpoints import State  # not at the top: checkpoints imports (via planning) this module

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
        what, task = ("its commit keeps failing (its pre-commit is kept)", "commit") if checkpoint.awaits_commit \
            else ("keeps failing", "increment")
        super().__init__(
            f"pipeline {pipeline!r} is stalled: checkpoint {checkpoint.id} (DAG run {checkpoint.dag_run_id}, ranges "
            f"{ranges}) {what}; last error: {(checkpoint.reason or '').rstrip('.')}. Fix the cause, then clear its "
            f"{task} task (or run `python -m exactly_once.stalls retry {checkpoint.id}` to run its ranges again), or "
            f"dead-letter the records at fault: `python -m exactly_once.stalls dead-letter {pipeline} "
            "'TOPIC[PARTITION]@FROM..TO' --reason WHY`")


def is_retryable(error: BaseException) -> bool:
    """Unknown errors (a crash, a timeout) may pass on a retry; known ones say."""
    return getattr(error, "retryable", True) if isinstance(error, PipelineError) else True


# pgjdbc's batch errors carry the failed statement with its bound values, PostgreSQL's
# details the failing row or key: record values, which an error text kept in the ledger,
# a log or the view must not carry.
_VALUES = ((re.compile(r"Batch entry (\d+) .*? was aborted", re.S), r"Batch entry \1 (statement not shown) was aborted"),
           (re.compile(r"Failing row contains \(.*?\)(?=\.?\s|\.?$)", re.S), "Failing row contains (values not shown)"),
           (re.compile(r"Key \((.*?)\)=\(.*?\)(?= already exists| is not present| conflicts)", re.S),
            r"Key (\1)=(values not shown)"))
MAX_ERROR_TEXT = 2000  # characters of an error text kept: a Spark stack trace can run to megabytes


def error_text(text: str, limit: int = MAX_ERROR_TEXT) -> str:
    """An error's text as the ledger, the logs and the view keep it: without the record
    values a database error quotes, cut to `limit` characters (saying how much was cut)."""
    for pattern, replacement in _VALUES:
        text = pattern.sub(replacement, text)
    return text if len(text) <= limit else f"{text[:limit]}… ({len(text) - limit} more characters cut)"


def error_message(error: BaseException) -> str:
    """A database error's own message (psycopg2's primary message), or the error's text."""
    diag = getattr(error, "diag", None)
    return ((diag.message_primary if diag is not None else None) or str(error)).strip()
