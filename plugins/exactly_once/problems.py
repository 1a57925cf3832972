"""Problems found in a pipeline's setup before it runs, each naming what is at fault."""

from __future__ import annotations

from dataclasses import dataclass

from exactly_once.errors import PipelineError


@dataclass(frozen=True)
class Problem:
    subject: str             # what is at fault: a field, a topic, a table's column, a connection
    message: str
    fix: str | None = None   # a statement that would fix it
    passing: bool = False    # may pass by itself (a broker or database that did not answer)

    def __str__(self) -> str:
        fix = "" if self.fix is None else "\n    fix: " + self.fix.replace("\n", "\n         ")
        return f"{self.subject}: {self.message}{fix}"


class PreflightFailed(PipelineError, ValueError):
    """A pipeline that cannot run as it stands; the message lists every problem found. A retry
    may help only when every problem may pass by itself."""

    def __init__(self, pipeline: str, problems: list[Problem]):
        self.problems = problems
        self.retryable = all(p.passing for p in problems)  # type: ignore[misc]  # per instance
        super().__init__(report(f"pipeline {pipeline!r}", problems))


def report(checked: str, problems: list[Problem]) -> str:
    """What the preflight found about what it checked (a pipeline, a DAG file)."""
    if not problems:
        return f"{checked}: ready"
    return (f"{checked}: {len(problems)} problem(s) found before any Spark job\n"
            + "\n".join(f"- {p}" for p in problems))
