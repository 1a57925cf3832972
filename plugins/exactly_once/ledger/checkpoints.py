"""The values of the protocol: states, checkpoints, what pre-commit hands to commit,
what recovery did, and the outcome of each step. Plain immutable values, no I/O.

The states' values are the SQL enum's (sql/migrations/0001_ledger.sql), where the
transitions are drawn.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime
from enum import Enum

from exactly_once.ledger.planning import OffsetRange


class State(str, Enum):
    """A checkpoint's state (exactly_once.checkpoint_state)."""

    PLANNED = "planned"
    RUNNING = "running"
    STALLED = "stalled"       # failed for one cause until an operator acts; keeps its ranges
    PRECOMMITTED = "precommitted"
    COMMITTED = "committed"
    ABORTED = "aborted"

    @property
    def open(self) -> bool:
        """An attempt may still start (planned, running; stalled, by an operator's hand)."""
        return self in (State.PLANNED, State.RUNNING, State.STALLED)


class AttemptState(str, Enum):
    """An attempt's state (exactly_once.attempt_state)."""

    RUNNING = "running"
    PRECOMMITTED = "precommitted"
    COMMITTED = "committed"
    ABORTED = "aborted"


class Outcome(Enum):
    """What a step did when it did not fail. Refusals are `ProtocolError`s."""

    COMMITTED = "committed now"
    ALREADY_COMMITTED = "already committed"
    ABORTED = "aborted now"
    STALLED = "stalled now"    # aborted, and held for an operator (`stalls`)
    UNCHANGED = "unchanged"    # nothing to do: already ended, or no longer the current attempt


@dataclass(frozen=True)
class Staged:
    """What an attempt staged in one table: its row count, which the writer counted as it
    wrote, pre-commit found in the table, and the commit finds again."""

    rows: int


@dataclass(frozen=True)
class TaskTry:
    """A task's try as Airflow numbers and starts it, asking the ledger to go on with a
    checkpoint (`Checkpoint.resumed_by`): clearing a task starts a try numbered after its last."""

    number: int
    started: datetime


@dataclass(frozen=True)
class Checkpoint:
    id: int
    dag_run_id: str
    state: State
    attempt: int                       # the current attempt's fencing token; 0 before the first
    ranges: tuple[OffsetRange, ...]
    interval_start: datetime | None = None
    interval_end: datetime | None = None
    lease_until: datetime | None = None
    precommitted_attempt: int | None = None
    staged: Mapping[str, Staged] | None = None   # recorded at pre-commit
    records: int | None = None                   # Kafka records the pre-committed attempt read
    reason: str | None = None                    # why it was last aborted or sent back
    replays: int | None = None                   # a reprocessing: the committed checkpoint it replays
    commit_failures: int = 0                     # failed commits of one cause in a row
    stalled_at: datetime | None = None           # when it last stalled (None: before this was recorded)

    def resumed_by(self, task: TaskTry | None) -> bool:
        """Whether a task's try is an operator's act on this stalled checkpoint: a cleared task,
        whose try is not its first and began once the checkpoint had stalled. A first try, or
        one that began before the stall (or an unknown one), is its run's own, which merely
        ran late or was queued: it resumes nothing."""
        return (task is not None and task.number > 1
                and (self.stalled_at is None or task.started >= self.stalled_at))

    @property
    def awaits_commit(self) -> bool:
        """Its pre-commit stands: pre-committed, or stalled at commit (which keeps it)."""
        return self.state in (State.PRECOMMITTED, State.STALLED) and self.precommitted_attempt is not None

    @property
    def slot(self) -> int:
        """The checkpoint whose contribution to the sinks this one's rows are: itself, or
        the one it replays."""
        return self.replays or self.id

    @property
    def is_empty(self) -> bool:
        return all(r.size == 0 for r in self.ranges)

    @property
    def committable(self) -> Committable:
        """What its pre-commit recorded: the one attempt commit may promote."""
        if not self.awaits_commit:
            raise ValueError(f"checkpoint {self.id} is {self.state.value}: nothing is pre-committed")
        return Committable(self.id, self.precommitted_attempt, self.ranges, self.staged, self.replays)

    def is_current(self, attempt: int) -> bool:
        """Whether `attempt` may still write and pre-commit (it is not fenced)."""
        return self.state is State.RUNNING and self.attempt == attempt


@dataclass(frozen=True)
class Attempt:
    """One attempt as the ledger recorded it."""

    checkpoint_id: int
    attempt: int
    state: AttemptState
    reason: str | None
    retryable: bool | None             # whether a retry may help, once it failed; None while it has not


def cause(reason: str) -> str:
    """What two failures must share to count as the same cause: the reason without its
    numbers and hex ids (attempt and checkpoint ids, Spark stage and task ids, timings,
    UUIDs, object addresses)."""
    return re.sub(r"0x[0-9a-fA-F]+|\b[0-9a-fA-F-]*\d[0-9a-fA-F-]*\b|\d+", "#", reason)


# Classes of PostgreSQL errors that a later try of the same commit may not meet again:
# a lost connection, a serialization failure or deadlock, a lack of resources, a
# statement cancelled (a timeout), an operator's intervention.
TRANSIENT_SQLSTATE_CLASSES = ("08", "40", "53", "57", "58")


def commit_stalls(sqlstate: str | None, failures: int, stall_after: int) -> bool:
    """Whether a commit that failed `failures` times in a row for one cause stalls its
    checkpoint: at once when no retry can fix the cause (a permission, a missing column,
    a clash in the ledger), after `stall_after` failures when a retry might."""
    transient = sqlstate is None or sqlstate.startswith(TRANSIENT_SQLSTATE_CLASSES)
    return not transient or failures >= stall_after


def stalls(failures: list[Attempt], stall_after: int) -> bool:
    """Whether a checkpoint's failed attempts (newest first) stall it: the newest failed in
    a way no retry can fix, or the newest `stall_after` failed for one cause."""
    if not failures:
        return False
    if failures[0].retryable is False:
        return True
    newest = failures[:stall_after]
    return len(newest) == stall_after and len({cause(f.reason or "") for f in newest}) == 1


@dataclass(frozen=True)
class Committable:
    """What pre-commit hands to commit (Flink's committable): a value."""

    checkpoint_id: int
    attempt: int
    ranges: tuple[OffsetRange, ...]
    staged: Mapping[str, Staged]
    replays: int | None = None         # a reprocessing's commit replaces this checkpoint's contribution

    @property
    def slot(self) -> int:
        return self.replays or self.checkpoint_id


@dataclass(frozen=True)
class Recovery:
    committed: tuple[int, ...] = ()    # pre-committed checkpoints committed now
    aborted: tuple[int, ...] = ()      # abandoned checkpoints whose ranges go to the next plan
    sent_back: tuple[int, ...] = ()    # pre-committed, but their staged rows changed: to run again
    stale_staging_rows: int = 0        # rows of fenced or crashed attempts or of committed checkpoints, deleted


@dataclass(frozen=True)
class Begun:
    checkpoint: Checkpoint
    recovery: Recovery
    new: bool                          # False: this DAG run had begun it before (a retry reuses the plan)
