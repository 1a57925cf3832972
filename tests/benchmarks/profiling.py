"""Where a checkpoint's time goes (`./dev bench --profile`): the increment job's Spark event
log as a timeline of its SQL executions (each with its jobs' stages: tasks, their run, CPU and
GC time), the CPU of the job's threads (tests/benchmarks/job_cpu.py), and PostgreSQL's
statements during the job and during the commit, by total time (pg_stat_statements, which the
stack's server preloads). Written beside each repetition's logs
as `profile.md`; figures to read, not to compare across machines."""

from __future__ import annotations

import json
import re
from collections import defaultdict
from collections.abc import Iterator
from contextlib import closing, contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from psycopg2 import sql

from exactly_once_stack import postgres

if TYPE_CHECKING:
    from tests.benchmarks.spark_app import SparkRun

STATEMENTS = 12  # the heaviest, per part of the checkpoint


def event_log_conf(folder: Path) -> dict[str, str]:
    """Spark settings that write the application's event log into `folder`."""
    folder.mkdir(parents=True, exist_ok=True)
    return {"spark.eventLog.enabled": "true", "spark.eventLog.dir": folder.as_uri(),
            "spark.eventLog.rolling.enabled": "false", "spark.eventLog.compress": "false"}  # one file of JSON lines


@dataclass
class Stage:
    name: str
    tasks: int
    seconds: float
    run: float = 0.0   # the tasks' executor run time, summed
    cpu: float = 0.0
    gc: float = 0.0


@dataclass
class Execution:
    """One SQL execution (an action: a count, a write, a collect) and its jobs' stages."""
    started: float     # seconds since the application started (or the timeline's window)
    seconds: float
    plan: str          # the physical plan's top operator
    stages: list[Stage] = field(default_factory=list)


def timeline(event_log: Path, window: tuple[float, float] | None = None) -> list[Execution]:
    """The application's SQL executions; with `window` (seconds since the epoch, from and to),
    only those that started in it, timed from its start: one checkpoint's in a Spark Connect
    server's log, which every job on the server writes to. A line that is not JSON is skipped:
    a running application's log may end in one cut short."""
    executions: dict[int, Execution] = {}
    job_execution, stage_job, stages = {}, {}, {}
    task_times = defaultdict(lambda: [0.0, 0.0, 0.0])
    began = 0 if window is None else window[0] * 1000
    for line in event_log.read_text().splitlines():
        try:
            event = json.loads(line)
        except ValueError:  # cut short: the line a running application is writing
            continue
        kind = event["Event"].rsplit(".", 1)[-1]
        if kind == "SparkListenerApplicationStart" and window is None:
            began = event["Timestamp"]
        elif kind == "SparkListenerSQLExecutionStart":
            if window is not None and not window[0] * 1000 <= event["time"] <= window[1] * 1000:
                continue
            top = re.search(r"== Physical Plan ==\n(?:AdaptiveSparkPlan.*\n\+- )?(.*)",
                            event.get("physicalPlanDescription", ""))
            executions[event["executionId"]] = Execution((event["time"] - began) / 1000, 0.0,
                                                         (top.group(1) if top else "")[:100])
        elif kind == "SparkListenerSQLExecutionEnd" and event["executionId"] in executions:
            execution = executions[event["executionId"]]
            execution.seconds = (event["time"] - began) / 1000 - execution.started
        elif kind == "SparkListenerJobStart":
            job_execution[event["Job ID"]] = event["Properties"].get("spark.sql.execution.id")
            stage_job.update({stage: event["Job ID"] for stage in event["Stage IDs"]})
        elif kind == "SparkListenerStageCompleted":
            info = event["Stage Info"]
            stages[info["Stage ID"]] = Stage(info["Stage Name"][:40], info["Number of Tasks"],
                                             (info["Completion Time"] - info["Submission Time"]) / 1000)
        elif kind == "SparkListenerTaskEnd":
            metrics = event.get("Task Metrics") or {}
            times = task_times[event["Stage ID"]]
            times[0] += metrics.get("Executor Run Time", 0) / 1000
            times[1] += metrics.get("Executor CPU Time", 0) / 1e9
            times[2] += metrics.get("JVM GC Time", 0) / 1000
    for stage_id, stage in sorted(stages.items()):
        stage.run, stage.cpu, stage.gc = task_times[stage_id]
        execution_id = job_execution.get(stage_job.get(stage_id))
        if execution_id is not None and int(execution_id) in executions:
            executions[int(execution_id)].stages.append(stage)
    return [executions[e] for e in sorted(executions)]


def timeline_table(executions: list[Execution]) -> str:
    lines = ["| at (s) | seconds | physical plan / stage | tasks | run (s) | CPU (s) | GC (s) |",
             "|---:|---:|---|---:|---:|---:|---:|"]
    for e in executions:
        lines.append(f"| {e.started:.2f} | **{e.seconds:.2f}** | `{e.plan}` | | | | |")
        lines += [f"| | {s.seconds:.2f} | · {s.name} | {s.tasks} | {s.run:.2f} | {s.cpu:.2f} | {s.gc:.2f} |"
                  for s in e.stages]
    return "\n".join(lines)


@contextmanager
def statements(database: str, into: dict[str, str], part: str) -> Iterator[None]:
    """The database's statement statistics over the block, as a table into `into[part]`.
    The stack's server tracks no statement but here: the database's sessions opened in the
    block do (the job's, the tasks')."""
    with closing(postgres.connect_admin(database)) as conn, conn.cursor() as cur:
        conn.autocommit = True
        cur.execute("CREATE EXTENSION IF NOT EXISTS pg_stat_statements")
        tracked = sql.SQL("ALTER DATABASE {} SET pg_stat_statements.track = {}").format(sql.Identifier(database),
                                                                                      sql.Literal("top"))
        cur.execute(tracked)
        try:
            cur.execute("SELECT pg_stat_statements_reset()")
            yield
        finally:
            cur.execute(sql.SQL("ALTER DATABASE {} RESET pg_stat_statements.track").format(sql.Identifier(database)))
        cur.execute("SELECT r.rolname, s.calls, s.total_exec_time / 1000, s.rows, left(regexp_replace(s.query, "
                    "'\\s+', ' ', 'g'), 110) FROM pg_stat_statements s JOIN pg_roles r ON r.oid = s.userid "
                    "WHERE s.dbid = (SELECT oid FROM pg_database WHERE datname = current_database()) "
                    "AND s.query NOT LIKE '%%pg_stat_statements%%' ORDER BY s.total_exec_time DESC LIMIT %s",
                    (STATEMENTS,))
        lines = ["| role | calls | seconds | rows | statement |", "|---|---:|---:|---:|---|"]
        lines += [f"| {role} | {calls} | {seconds:.2f} | {rows} | `{text.replace('|', '¦')}` |"
                  for role, calls, seconds, rows, text in cur.fetchall()]
        into[part] = "\n".join(lines)


def write_profile(path: Path, event_logs: Path, parts: dict[str, str], pipeline: str | None = None,
                  job: SparkRun | None = None, window: tuple[float, float] | None = None) -> None:
    """The timeline of the last event log in `event_logs` (only its executions in `window`, as
    `timeline`: a Connect server's), the CPU of the `job`'s threads when they were read, and the
    statements of `parts`, into `path`, titled by the pipeline's name (by default, the folder's)."""
    logs = sorted(event_logs.iterdir())
    served = "" if window is None else ", the Spark Connect server's, from the checkpoint's start"
    sections = [f"# Profile of {pipeline or path.parent.name}'s checkpoint", "",
                f"## The increment job's Spark timeline ({logs[-1].name}{served})", "",
                timeline_table(timeline(logs[-1], window))]
    if job is not None and job.cpu is not None:
        sections += ["", "## The increment job's CPU, by thread", "", job.cpu.table(job.seconds)]
    for part, table in parts.items():
        sections += ["", f"## PostgreSQL statements during {part}, heaviest first", "", table]
    path.write_text("\n".join(sections) + "\n")
