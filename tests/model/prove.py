"""`./dev prove`: checks the protocol's models with spin, one configuration at a time, and prints
each one's state space, time and result: the ledger's (model/ledger.pml and what it includes),
the publisher's of a kafka sink (model/publisher.pml) and the upgrade's rename of staging
tables (model/upgrade.pml). A configuration with a `finding` is one where spin shows a defect
of the code as it is: it passes while spin finds the violation, and says so once it is gone.

Each configuration is a set of processes (scheduled runs, a backfill, a reprocessing, an
operator, the clock, retention's prune steps) and a budget of faults over a whole execution,
explored exhaustively: every interleaving, every crash point, every order. The state space
grows by orders of magnitude with each process and each fault, so the faults are split
across configurations; `--full` adds the larger ones (minutes each), CI runs the default set but reprocessing.

    ./dev prove [--full] [--only NAME ...] [--keep DIR]
"""

from __future__ import annotations

import argparse
import re
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

MODEL = Path(__file__).resolve().parents[2] / "model" / "ledger.pml"
MODELS = MODEL.parent  # ledger.pml (with its includes), publisher.pml, upgrade.pml
NO_FAULTS = {"CRASHES": 0, "DUPLICATES": 0, "JOB_FAILURES": 0, "REFUSALS": 0, "DB_ERRORS": 0, "EXPIRIES": 0}
ALONE = {"SECOND_RUN": 0, "BACKFILL": 0, "REPROCESS": 0, "OPERATOR": 0}


@dataclass(frozen=True)
class Configuration:
    name: str
    what: str
    bounds: dict[str, int]
    full_only: bool = False
    model: str = "ledger.pml"
    finding: str | None = None  # a violation spin shows in the code as it is (a finding, not yet fixed)
    min_states: int = 1000  # fewer: the processes blocked at once, and the model proves nothing

    def defines(self) -> list[str]:
        return [f"-D{name}={value}" for name, value in {**NO_FAULTS, **self.bounds}.items()]


CONFIGURATIONS = (
    Configuration("two-runs", "two scheduled runs racing over the offsets, a lease running out (a sibling "
                  "takes over)", {"BACKFILL": 0, "REPROCESS": 0, "OPERATOR": 0, "EXPIRIES": 1}),
    Configuration("crashes-and-zombies", "one run: two crashes anywhere, a duplicate staging write, a lease "
                  "running out (zombie jobs, retried tasks)", {**ALONE, "CRASHES": 2, "DUPLICATES": 1, "EXPIRIES": 1}),
    Configuration("commit-failures", "one run: a final table refusing rows, two errors no record causes, a "
                  "crash, an operator", {**ALONE, "OPERATOR": 1, "REFUSALS": 1, "DB_ERRORS": 2, "CRASHES": 1}),
    Configuration("stalls", "one run: two job failures (one no retry fixes), two lease expiries, an operator",
                  {**ALONE, "OPERATOR": 1, "JOB_FAILURES": 2, "EXPIRIES": 2}),
    Configuration("reprocessing", "a run and a reprocessing of what it committed, a crash",
                  {**ALONE, "REPROCESS": 1, "CRASHES": 1}),
    Configuration("recovery-to-the-end", "one run with a crash and a job failure, an operator, then a fault-free "
                  "run: every offset counts once", {**ALONE, "OPERATOR": 1, "CRASHES": 1, "JOB_FAILURES": 1,
                                                    "FINAL_ROUNDS": 1}),
    Configuration("prune", "retention beside a run and a reprocessing: a checkpoint committed before, the reprocess "
                  "horizon passing, two prune steps folding a checkpoint each (never while a commit runs)",
                  {**ALONE, "REPROCESS": 1, "COMMITTED_BEFORE": 1, "PRUNE": 2, "HORIZONS": 1}),
    Configuration("parallel-runs", "two scheduled runs and a backfill racing over the offsets, no fault",
                  {"OPERATOR": 0, "REPROCESS": 0}, full_only=True),
    Configuration("reprocessing-zombies", "a run and a reprocessing, a crash and a duplicate staging write",
                  {**ALONE, "REPROCESS": 1, "CRASHES": 1, "DUPLICATES": 1}, full_only=True),
    Configuration("recovery-after-faults", "one run with a crash, a job failure, a refusal and a lease running "
                  "out, an operator, then two fault-free runs", {**ALONE, "OPERATOR": 1, "CRASHES": 1,
                                                                 "JOB_FAILURES": 1, "REFUSALS": 1, "EXPIRIES": 1,
                                                                 "FINAL_ROUNDS": 2}, full_only=True),
    Configuration("prune-crashes", "retention beside a run and a reprocessing of what it committed: the horizon "
                  "passing, a prune step, a crash", {**ALONE, "REPROCESS": 1, "PRUNE": 1, "CRASHES": 1},
                  full_only=True),
    # model/publisher.pml: two publishers of one kafka sink, commits adding outbox rows in any order.
    Configuration("publishers", "two publishers of one sink, as the code is: Kafka's progress read under the "
                  "sink's lock, two crashes, a transaction aborted past its timeout",
                  {"PROGRESS_UNDER_LOCK": 1, "CRASHES": 2, "ABORTS": 1}, model="publisher.pml"),
    Configuration("publishers-progress-before-lock", "the same, Kafka's progress read before the sink's lock (as "
                  "the code first had it)", {"CRASHES": 1, "ABORTS": 1}, model="publisher.pml",
                  finding="a publisher reads Kafka's progress, then another (which fenced it) publishes, records "
                          "and prunes; the first takes the sink's lock and finds the database ahead of what it "
                          "read from Kafka: OutboxMismatch (Kafka behind the database), none warranted"),
    Configuration("publishers-again", "two publishers of one sink publishing twice each, Kafka's progress read "
                  "under the sink's lock, a crash, a transaction aborted past its timeout",
                  {"PROGRESS_UNDER_LOCK": 1, "RUNS": 2, "CRASHES": 1, "ABORTS": 1}, model="publisher.pml",
                  full_only=True),
    # model/upgrade.pml: a checkpoint pre-committed before the upgrade, its rows under the earlier name.
    Configuration("upgrade", "a checkpoint pre-committed under the earlier staging names: its commit task "
                  "(migrating first) and a later run's begin in any order, two crashes, an operator",
                  {"CRASHES": 2}, model="upgrade.pml", min_states=100),
    Configuration("upgrade-stalls", "the same, its commit failing twice for no record's fault (a stall), a crash",
                  {"CRASHES": 1, "DB_ERRORS": 2}, model="upgrade.pml", min_states=100,
                  finding="the documented limit of resumed_by: the run's own commit try fails for a reason a "
                          "retry may pass, a later run's recovery stalls the checkpoint, and Airflow's automatic "
                          "retry (numbered and started like a cleared task's try) commits it"),
)


@dataclass(frozen=True)
class Result:
    configuration: Configuration
    states: int
    transitions: int
    depth: int
    seconds: float
    errors: int
    output: str


def check(configuration: Configuration, workdir: Path, memory_mb: int = 6000) -> Result:
    """Generates the verifier for one configuration, compiles it and runs it exhaustively."""
    for part in MODELS.glob("*.pml"):  # the models and the files ledger.pml includes
        shutil.copy(part, workdir / part.name)
    started = time.monotonic()
    subprocess.run(["spin", "-a", *configuration.defines(), configuration.model], cwd=workdir, check=True,
                   capture_output=True, text=True)
    subprocess.run(["gcc", "-O2", "-w", "-DSAFETY", "-DCOLLAPSE", f"-DMEMLIM={memory_mb}", "-o", "pan", "pan.c"],
                   cwd=workdir, check=True)
    run = subprocess.run(["./pan", "-m1000000", "-c1"], cwd=workdir, capture_output=True, text=True)
    seconds = time.monotonic() - started
    out = run.stdout + run.stderr
    if "reached -DMEMLIM bound" in out or "max search depth too small" in out:
        raise RuntimeError(f"{configuration.name}: the search did not finish (memory or depth bound):\n{out}")
    return Result(configuration, _number(r"([\d.e+]+) states, stored", out), _number(r"([\d.e+]+) transitions", out),
                  _number(r"depth reached (\d+)", out), seconds, _number(r"errors: (\d+)", out), out)


def _number(pattern: str, text: str) -> int:
    found = re.search(pattern, text)
    if found is None:
        raise RuntimeError(f"spin's output has no {pattern!r}:\n{text}")
    return int(float(found.group(1)))


def trail(configuration: Configuration, workdir: Path) -> str:
    """The counterexample spin wrote, step by step."""
    return subprocess.run(["spin", "-t", "-p", *configuration.defines(), configuration.model], cwd=workdir,
                          capture_output=True, text=True).stdout


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--full", action="store_true", help="also the configurations that take minutes")
    parser.add_argument("--only", nargs="+", metavar="NAME", help="these configurations only")
    parser.add_argument("--keep", type=Path, help="keep the verifiers and any trail in this folder")
    args = parser.parse_args(argv)
    chosen = [c for c in CONFIGURATIONS if (args.full or not c.full_only) and (not args.only or c.name in args.only)]
    print("spin on model/*.pml, exhaustive search, assertions and invalid end states")
    print(f"{'configuration':<30} {'states':>12} {'transitions':>13} {'depth':>6} {'seconds':>8}  result")
    failed = False
    for configuration in chosen:
        workdir = args.keep / configuration.name if args.keep else Path(tempfile.mkdtemp(prefix="prove-"))
        workdir.mkdir(parents=True, exist_ok=True)
        try:
            result = check(configuration, workdir)
            verdict = "holds" if result.errors == 0 else "VIOLATED"
            if configuration.finding:
                verdict = f"VIOLATED as known ({configuration.finding})" if result.errors else \
                    "holds: the known finding is gone, update its configuration"
            print(f"{configuration.name:<30} {result.states:>12,} {result.transitions:>13,} {result.depth:>6} "
                  f"{result.seconds:>8.1f}  {verdict}: {configuration.what}", flush=True)
            if bool(result.errors) != bool(configuration.finding):
                failed = True
                print(result.output, trail(configuration, workdir)[-20000:], sep="\n")
        finally:
            if not args.keep:
                shutil.rmtree(workdir, ignore_errors=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
