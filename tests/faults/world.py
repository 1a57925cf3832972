"""One scenario's world: a copy of the demo pipeline on a topic and tables of its own,
the records produced to it, and pipeline runs made of task processes (tests/faults/task.py),
each try in its own process, with faults switched on per try and actions (kill, pause,
restart) taken when a task's output shows it reached a fault point.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Callable
from contextlib import closing
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path

import psycopg2

from exactly_once.config import PipelineConfig
from exactly_once.faults import ENV as FAULTS
from exactly_once.ledger.invariants import violations
from exactly_once.ledger.migrate import migrate
from exactly_once.ledger.protocol import Ledger
from exactly_once.orchestration.outcomes import TaskOutcome
from exactly_once_demo.oracle import committed_orders
from exactly_once_demo.pipeline import config as demo_config
from exactly_once_demo.prepare import create_tables
from exactly_once_demo.produce import ensure_topic, produce
from exactly_once_stack.settings import LOCAL, ROOT, process_environment, spark_connection
from tests.exactly_once_demo.oracle import expected
from tests.kafka_records import committed_records
from tests.oracle import Comparison, Tables, actual, compare

ARTIFACTS = LOCAL / "artifacts" / "faults"
TASK_TIMEOUT = 600
RETRY_DELAY = 3  # seconds between tries of a task (the DAG's commit task waits 5 s, then longer)
ALL_TRIES = 0  # a fault for every try of a task
UDF_TRANSFORM = "exactly_once_demo.pipeline:prepare_with_udf"


@dataclass
class Try:
    task: str
    number: int
    returncode: int
    log: Path
    result: dict | None

    @property
    def output(self) -> str:
        return self.log.read_text(errors="replace")

    @property
    def outcome(self) -> TaskOutcome:
        """What the DAG does after this try; a process killed before it said so: retry."""
        if self.returncode == 0:
            return TaskOutcome.DONE
        lines = self.output.strip().splitlines()
        try:
            said = json.loads(lines[-1]) if lines else {}
        except ValueError:
            said = {}
        return TaskOutcome(said.get("outcome", "retry")) if isinstance(said, dict) else TaskOutcome.RETRY


@dataclass
class Run:
    run_id: str
    checkpoint: int | None = None
    state: str = "running"          # success | failed
    empty: bool = False
    tries: list[Try] = field(default_factory=list)

    def tries_of(self, task: str) -> list[Try]:
        return [t for t in self.tries if t.task == task]


@dataclass
class Verdict:
    records: int
    comparison: Comparison
    invariants: list[str]
    states: str                       # checkpoints per final state
    attempts: str                     # Spark attempts per final state
    expectations: list[str]           # what the scenario itself found wrong

    @property
    def passed(self) -> bool:
        return self.comparison.exact and not self.invariants and not self.expectations


class World:
    def __init__(self, scenario: str, seed: int, servers: str, db_url: str, spark: str = "local",
                 publishes: bool = False, **options):
        """`spark`: where the jobs run (exactly_once_stack.spark_cluster); beyond local, with the demo's
        UDF variant, which executors run only with the code the job ships. `publishes`: the demo's
        deltas go to a topic of the world's too (a kafka sink), and each run ends with a `publish` task."""
        self.name = f"fm_{scenario}_{seed}_{int(time.time()) % 100000}"
        self.seed, self.servers, self.db_url, self.spark = seed, servers, db_url, spark
        if spark != "local":
            options.setdefault("transform", UDF_TRANSFORM)
        self.deltas_topic = f"{self.name}_deltas" if publishes else None
        if publishes:
            ensure_topic(servers, self.deltas_topic)
        self.config: PipelineConfig = demo_config(self.name, self.name, self.name, deltas_topic=self.deltas_topic,
                                                  **options)
        self.folder = ARTIFACTS / self.name
        self.folder.mkdir(parents=True, exist_ok=True)
        self.records: list = []                 # every committed record produced, read back
        self._read_up_to: dict[int, int] = {}
        self._runs = 0
        self._produced = 0
        with closing(psycopg2.connect(db_url)) as conn:
            migrate(conn)
            create_tables(conn, self.name)
        self.register()

    def register(self, **options) -> None:
        """Registers the pipeline (again, with changed options: the next task reads them)."""
        if options:
            self.config = self.config.model_copy(update=options)
        Ledger(self.config, lambda: psycopg2.connect(self.db_url)).register()

    # -- records ----------------------------------------------------------------------

    def produce(self, n: int) -> None:
        """N demo orders in transactions of 500, every 7th aborted, every 997th malformed,
        every 499th with a NUL in its sku (a dead letter)."""
        produce(self.servers, n, seed=self.seed * 1000 + self._produced, topic=self.name)
        self._produced += 1
        read = committed_orders(self.servers, self.name, self._read_up_to)
        self.records += read
        for m in read:
            self._read_up_to[m.partition()] = max(self._read_up_to.get(m.partition(), 0), m.offset() + 1)

    # -- runs ---------------------------------------------------------------------------

    def run(self, faults: dict[tuple[str, int], str] | None = None,
            when: dict[tuple[str, int], tuple[str, Callable[[Run], None]]] | None = None,
            retries: dict[str, int] | None = None, run_id: str | None = None,
            interval_end: datetime | None = None, reprocess: bool = False,
            publish_options: tuple[str, ...] = ()) -> Run:
        """A pipeline run: begin, then increment and commit (and, with a kafka sink, publish) with
        retries, as the DAG does (a try whose outcome is FAIL is not retried); with `reprocess`, the
        run's parameter. `faults[(task, try)]` is EXACTLY_ONCE_FAULTS for that try (try ALL_TRIES:
        every try); `when[(task, try)] = (fault point, action)`: the action runs once the try
        reaches the point; `publish_options`: the publish task's (tests/faults/task.py)."""
        faults, when = faults or {}, when or {}
        retries = {"begin": 0, "increment": 2, "commit": 2, "publish": 2, **(retries or {})}
        self._runs += 1
        run = Run(run_id or f"run{self._runs}")
        end = (interval_end or datetime.now(timezone.utc)).isoformat()
        begin = ["--run-id", run.run_id, "--interval-end", end, *(["--reprocess"] if reprocess else [])]
        steps = [("begin", begin), ("increment", None), ("commit", None),
                 *([("publish", list(publish_options))] if self.deltas_topic else [])]
        for task, arguments in steps:
            for number in range(1, retries[task] + 2):
                fault = faults.get((task, number)) or faults.get((task, ALL_TRIES))
                args = arguments if arguments is not None else [
                    "--checkpoint-id", str(run.checkpoint), "--try", str(number)]
                tried = self.task(task, args, run, number, fault, when.get((task, number)))
                run.tries.append(tried)
                if tried.returncode == 0 or tried.outcome is TaskOutcome.FAIL:
                    break
                time.sleep(RETRY_DELAY)
            if tried.returncode != 0:
                run.state = "failed"
                return run
            if task == "begin":
                run.checkpoint, run.empty = tried.result["checkpoint"], tried.result["empty"]
                if run.empty:
                    break
        run.state = "success"
        return run

    def start(self, task: str, arguments: list[str], run: Run, number: int, fault: str | None
              ) -> tuple[subprocess.Popen, Path]:
        log = self.folder / f"{run.run_id}-{task}-try{number}.log"
        env = {**process_environment(), FAULTS: fault or "",
               "AIRFLOW_CONN_SPARK_DEFAULT": json.dumps(spark_connection(self.spark))}
        with open(log, "wb") as out:
            process = subprocess.Popen(
                [sys.executable, "-m", "tests.faults.task", task, "--pipeline", self.name, *arguments],
                stdout=out, stderr=subprocess.STDOUT, env=env, cwd=ROOT, start_new_session=True)
        return process, log

    def task(self, task: str, arguments: list[str], run: Run, number: int, fault: str | None = None,
             action: tuple[str, Callable[[Run], None]] | None = None) -> Try:
        process, log = self.start(task, arguments, run, number, fault)
        if action is not None:
            point, act = action
            if wait_for(log, f"fault injected at {point}", process):
                act(run)
        returncode = process.wait(TASK_TIMEOUT)
        return finished(task, number, returncode, log)

    def normal_runs(self, limit: int = 4) -> list[Run]:
        """Runs without faults until one finds nothing to read: the pipeline has caught up."""
        done = []
        for _ in range(limit):
            done.append(self.run())
            if done[-1].state == "success" and done[-1].empty and not self.open_checkpoints():
                return done
        raise AssertionError(f"{self.name}: not caught up after {limit} normal runs: {[r.state for r in done]}")

    # -- what the ledger says -----------------------------------------------------------

    def query(self, statement: str, *params) -> list[tuple]:
        with closing(psycopg2.connect(self.db_url)) as conn, conn, conn.cursor() as cur:
            cur.execute(statement, params)
            return cur.fetchall() if cur.description else []

    def state(self, checkpoint: int) -> str:
        return self.query("SELECT state::text FROM exactly_once.checkpoints WHERE id = %s", checkpoint)[0][0]

    def open_checkpoints(self) -> list[int]:
        return [i for i, in self.query("SELECT id FROM exactly_once.checkpoints WHERE pipeline = %s AND state IN "
                                       "('planned', 'running', 'precommitted') ORDER BY id", self.name)]

    def tables(self) -> Tables:
        return actual(self.db_url, self.config, self.servers)

    # -- spark-submit processes of an attempt -----------------------------------------------

    def spark_processes(self, checkpoint: int, attempt: int) -> list[int]:
        """The job's processes of one attempt: spark-submit's JVM and the Python driver, or the
        Spark Connect client's process."""
        wanted = f"--pipeline {self.name} --checkpoint-id {checkpoint} --attempt {attempt} --token "
        return [pid for pid, cmdline in _processes() if JOB_MARKER in cmdline and wanted in cmdline]

    def signal_task(self, task: str, sig: int) -> int:
        """Signals the one running process of a task of this world's runs (tests/faults/task.py)."""
        wanted = f"tests.faults.task {task} --pipeline {self.name} "
        [pid] = [pid for pid, cmdline in _processes() if wanted in cmdline + " "]
        os.kill(pid, sig)
        return pid

    def published(self) -> list:
        """The records of the world's deltas topic a read_committed consumer sees."""
        return committed_records(self.servers, self.deltas_topic)

    def wait_until_unlocked(self, checkpoint: int, timeout: float = 30) -> None:
        """Returns once no transaction holds the checkpoint's row (a killed task's session is gone)."""
        deadline = time.monotonic() + timeout
        with closing(psycopg2.connect(self.db_url)) as conn, conn.cursor() as cur:
            while True:
                try:
                    cur.execute("SELECT FROM exactly_once.checkpoints WHERE id = %s FOR UPDATE NOWAIT", (checkpoint,))
                    conn.rollback()
                    return
                except psycopg2.errors.LockNotAvailable:
                    conn.rollback()
                    if time.monotonic() > deadline:
                        raise TimeoutError(f"checkpoint {checkpoint}: still locked after {timeout} s") from None
                    time.sleep(0.2)

    def outbox_rows(self) -> int:
        return self.query("SELECT count(*) FROM exactly_once.outbox WHERE pipeline = %s", self.name)[0][0]

    def signal_attempt(self, checkpoint: int, attempt: int, sig: int) -> list[int]:
        pids = self.spark_processes(checkpoint, attempt)
        if not pids:
            raise AssertionError(f"no spark-submit process of checkpoint {checkpoint} attempt {attempt}")
        for pid in pids:
            os.kill(pid, sig)
        return pids

    # -- the verdict ----------------------------------------------------------------------

    def verdict(self, expectations: list[str], lost_to_retention: Callable[[object], bool] = lambda m: False
                ) -> Verdict:
        """The final tables against the oracle of every committed record produced (less those
        retention deleted before they were read, when the pipeline allows it), and the ledger's
        invariants."""
        kept = [m for m in self.records if not lost_to_retention(m)]
        comparison = compare(expected(self.config, kept), self.tables())
        with closing(psycopg2.connect(self.db_url)) as conn:
            broken = violations(conn, self.config)
        return Verdict(len(kept), comparison, broken, self._count_states("checkpoints"),
                       self._count_states("attempts"), expectations)

    def _count_states(self, of: str) -> str:
        """'<state> <count>, …' of the pipeline's checkpoints or attempts."""
        return ", ".join(f"{state} {n}" for state, n in self.query(STATE_COUNTS[of], self.name))


STATE_COUNTS = {
    "checkpoints": "SELECT state::text, count(*) FROM exactly_once.checkpoints WHERE pipeline = %s "
                   "GROUP BY 1 ORDER BY 1",
    "attempts": "SELECT a.state::text, count(*) FROM exactly_once.attempts a JOIN exactly_once.checkpoints c "
                "ON c.id = a.checkpoint_id WHERE c.pipeline = %s GROUP BY 1 ORDER BY 1",
}


def finished(task: str, number: int, returncode: int, log: Path) -> Try:
    lines = log.read_text(errors="replace").strip().splitlines()
    result = None
    if returncode == 0 and lines:
        result = json.loads(lines[-1])
    return Try(task, number, returncode, log, result)


def wait_for(log: Path, text: str, process: subprocess.Popen | None = None, timeout: float = TASK_TIMEOUT) -> bool:
    """True once `text` is in the log; False if the process ended first."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if log.exists() and text in log.read_text(errors="replace"):
            return True
        if process is not None and process.poll() is not None:
            return text in log.read_text(errors="replace")
        time.sleep(0.1)
    raise TimeoutError(f"{log.name}: no {text!r} within {timeout} s")


# In the command line of every process of an attempt's job, and of nothing else: its arguments (tasks.job_arguments).
JOB_MARKER = "--token "


def _processes() -> list[tuple[int, str]]:
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace").strip()
            except OSError:
                continue
            found.append((int(entry.name), cmdline))
    return found
