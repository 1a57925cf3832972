"""The fault matrix: every scenario × seed against the real local services, as a table.

    ./dev faults                      every scenario, seed 1 (CI runs a slice: tests/faults)
    ./dev faults --seeds 1 2 3        more seeds
    ./dev faults --scenarios a i k    some scenarios

Prints scenario, seed, records, lost, duplicated, wrong, ledger invariants broken,
final checkpoint states and pass/fail; writes the table to .local/artifacts/faults/.
Exit status 1 if any row fails.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
import traceback
from dataclasses import dataclass

from exactly_once.operate.status_report import table
from exactly_once_stack import lifecycle
from exactly_once_stack.settings import process_environment
from tests.faults.scenarios import SCENARIOS, run_scenario
from tests.faults.world import ARTIFACTS, Verdict

HEADERS = ["scenario", "seed", "records", "lost", "duplicated", "wrong", "invariants broken", "checkpoints",
           "Spark attempts", "seconds", "result"]


@dataclass
class Row:
    scenario: str
    seed: int
    seconds: float
    verdict: Verdict | None = None
    error: str | None = None

    @property
    def passed(self) -> bool:
        return self.error is None and self.verdict.passed

    @property
    def problems(self) -> list[str]:
        if self.verdict is None:
            return [f"ERROR {self.error}"]
        v = self.verdict
        return v.expectations + v.invariants + v.comparison.examples

    def cells(self) -> list:
        """The row of the table; a failure shows its first problem, `problems` has them all."""
        name = f"{self.scenario}. {SCENARIOS[self.scenario][0]}"
        problems = self.problems
        result = "pass" if self.passed else f"FAIL {problems[0][:150]}" + (
            f" (and {len(problems) - 1} more)" if len(problems) > 1 else "")
        if self.verdict is None:
            return [name, self.seed, "", "", "", "", "", "", "", f"{self.seconds:.0f}", result]
        v, c = self.verdict, self.verdict.comparison
        return [name, self.seed, v.records, sum(c.lost.values()), sum(c.duplicated.values()), sum(c.wrong.values()),
                len(v.invariants), v.states, v.attempts, f"{self.seconds:.0f}", result]


def run_row(scenario: str, seed: int, servers: str, db_url: str) -> Row:
    started = time.monotonic()
    try:
        _, verdict = run_scenario(scenario, seed, servers, db_url)
    except Exception as error:  # noqa: BLE001 - a broken scenario is a row of the table, not the end of it
        traceback.print_exc()
        return Row(scenario, seed, time.monotonic() - started, error=f"{type(error).__name__}: {error}")
    return Row(scenario, seed, time.monotonic() - started, verdict)


def render(rows: list[Row]) -> str:
    return table(HEADERS, [row.cells() for row in rows])


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--scenarios", nargs="+", choices=list(SCENARIOS), default=list(SCENARIOS))
    parser.add_argument("--seeds", nargs="+", type=int, default=[1])
    args = parser.parse_args()
    started = lifecycle.up()
    try:
        env = process_environment()
        os.environ.update(env)
        rows = []
        for seed in args.seeds:
            for scenario in args.scenarios:
                rows.append(run_row(scenario, seed, env["KAFKA_BOOTSTRAP_SERVERS"], env["PIPELINE_DB_URL"]))
                print(render(rows[-1:]), flush=True)
    finally:
        lifecycle.down(started)
    report = render(rows)
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    (ARTIFACTS / f"matrix-{time.strftime('%Y%m%dT%H%M%S')}.txt").write_text(report + "\n")
    print(report)
    return 0 if all(row.passed for row in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
