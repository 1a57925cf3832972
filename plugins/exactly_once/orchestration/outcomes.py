"""What the orchestrator does after a task, decided in one place: the DAG's tasks
(exactly_once.orchestration.checkpoint_tasks) and the tests' task runner (tests/faults) both ask here.

    begin found nothing to read        SKIP   increment and commit are skipped
    a retryable failure                RETRY  the task is tried again (with back-off)
    a permanent one                    FAIL   no retry: a fenced attempt, a wrong table or
                                              configuration, data lost to retention, bad
                                              records under the `fail` policy
"""

from __future__ import annotations

from enum import Enum

from exactly_once.errors import is_retryable
from exactly_once.ledger.checkpoints import Begun


class TaskOutcome(Enum):
    DONE = "done"
    SKIP = "skip"
    RETRY = "retry"
    FAIL = "fail"


def after_begin(begun: Begun) -> TaskOutcome:
    return TaskOutcome.SKIP if begun.checkpoint.is_empty else TaskOutcome.DONE


def after_error(error: BaseException) -> TaskOutcome:
    return TaskOutcome.RETRY if is_retryable(error) else TaskOutcome.FAIL
