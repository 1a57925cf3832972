"""What can go wrong, and whether running the same step again may help.

Every error the library raises on purpose is a `PipelineError`; `retryable`
says whether a retry of the same task can succeed (a lost connection, a killed
executor) or cannot (a wrong configuration, a missing table, a fenced attempt).
The protocol's refusals are in exactly_once.ledger.refusals; other `Permanent` errors
stand beside their causes: `ConfigError` (here), `SinkTableError` (ledger/registration.py),
`DataLossError` and `OffsetsWentBack` (ledger/lost_offsets.py), `BadRecords` (spark/staging.py).
`exactly_once.orchestration.outcomes` turns that into what the orchestrator does.
"""

from __future__ import annotations

import re
from typing import ClassVar


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


class JobFailure(PipelineError):
    """How a Spark job's attempt failed, as the job reports it to the task that started it
    (which records it on the attempt: the job's role writes no ledger row): its error's text
    and whether a retry may help."""

    def __init__(self, reason: str, retryable: bool):
        super().__init__(reason)
        self.reason = reason
        self.retryable = retryable  # type: ignore[misc]  # per instance: the job's verdict


class ConfigError(Permanent, ValueError):
    """A pipeline configuration (or an operator's command) that cannot be used; the message
    names the field."""


def is_retryable(error: BaseException) -> bool:
    """Unknown errors (a crash, a timeout) may pass on a retry; known ones say."""
    return getattr(error, "retryable", True) if isinstance(error, PipelineError) else True


# pgjdbc's batch errors carry the failed statement with its bound values, PostgreSQL's
# details the failing row or key, a COPY's context the refused line or value: record
# values, which an error text kept in the ledger, a log or the view must not carry.
_VALUES = ((re.compile(r"Batch entry (\d+) .*? was aborted", re.S), r"Batch entry \1 (statement not shown) was aborted"),
           (re.compile(r"Failing row contains \(.*?\)(?=\.?\s|\.?$)", re.S), "Failing row contains (values not shown)"),
           (re.compile(r"Key \((.*?)\)=\(.*?\)(?= already exists| is not present| conflicts)", re.S),
            r"Key (\1)=(values not shown)"),
           # a column's value (cut at 30 characters by PostgreSQL) may hold line breaks; a line has none
           (re.compile(r'(COPY [\w.]+, line \d+, column [^:\n]+): "[\s\S]{0,36}'), r"\1: (values not shown)"),
           (re.compile(r'(COPY [\w.]+, line \d+): "[^\n]*'), r"\1: (values not shown)"))
MAX_ERROR_TEXT = 2000  # characters of an error text kept: a Spark stack trace can run to megabytes


def error_text(text: str, limit: int = MAX_ERROR_TEXT) -> str:
    """An error's text as the ledger and the logs keep it: without the record values a
    database error quotes, cut to `limit` characters (saying how much was cut). The
    ledger and the logs keep `MAX_ERROR_TEXT` (2,000); the view shows at most 1,000
    (exactly_once.operate.overview.ERROR_CHARACTERS)."""
    for pattern, replacement in _VALUES:
        text = pattern.sub(replacement, text)
    return text if len(text) <= limit else f"{text[:limit]}… ({len(text) - limit} more characters cut)"


def error_message(error: BaseException) -> str:
    """A database error's own message (psycopg2's primary message), or the error's text."""
    diag = getattr(error, "diag", None)
    return ((diag.message_primary if diag is not None else None) or str(error)).strip()
