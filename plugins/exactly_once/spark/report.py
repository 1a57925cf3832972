"""What the Spark job of an attempt reports to the task that started it, through a file the
task made private (`--report FILE`): what it staged, or how it failed and whether a retry
may help. The job's role writes no ledger row; the task records the report in the ledger,
a pre-commit or a failure (`exactly_once.orchestration.tasks.run_increment`).
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from pathlib import Path

from exactly_once.errors import JobFailure


@dataclass
class AttemptReport:
    """What the attempt did, for its log and the checkpoint history."""

    records: int = 0
    rows: dict[str, int] = field(default_factory=dict)
    seconds: dict[str, float] = field(default_factory=dict)

    @contextmanager
    def phase(self, name: str) -> Iterator[None]:
        """Times a phase; a phase run again (a write after isolation) adds to its seconds."""
        started = time.monotonic()
        try:
            yield
        finally:
            self.seconds[name] = round(self.seconds.get(name, 0.0) + time.monotonic() - started, 3)


def write_report(path: Path, report: AttemptReport) -> None:
    path.write_text(json.dumps(asdict(report)))


def write_failure(path: Path, failure: JobFailure) -> None:
    path.write_text(json.dumps({"failure": failure.reason, "retryable": failure.retryable}))


def read_report(path: Path) -> AttemptReport:
    """What the job staged, from its report; its `JobFailure` raised if it reported one,
    `JobEndedSilently` if it wrote none (killed, or crashed before it could)."""
    failure = reported_failure(path)
    if failure is not None:
        raise failure
    found = _reported(path)
    if found is None:
        raise JobEndedSilently(f"the increment job wrote no report to {path}")
    return AttemptReport(**found)


def reported_failure(path: Path) -> JobFailure | None:
    """The failure the job reported, if it did."""
    found = _reported(path)
    return JobFailure(found["failure"], found["retryable"]) if found and "failure" in found else None


def _reported(path: Path) -> dict | None:
    """The report, or None if there is none or the job was stopped while writing it."""
    text = path.read_text() if path.exists() else ""
    try:
        return json.loads(text) if text else None
    except ValueError:
        return None


class JobEndedSilently(Exception):
    """The job ended without its report: killed, or crashed before it could write it."""
