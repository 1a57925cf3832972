"""Where the Spark job runs, timed through Airflow's running scheduler: a checkpoint of the
demo pipeline by spark-submit on local[2], on the standalone cluster (a master and two
workers of 1 core) and over Spark Connect (a warm server on local[2]), all started by
exactly_once_stack.spark_cluster. Each mode has a copy of the demo pipeline and a DAG of
manual runs with a Spark connection of its own; the repetitions interleave the modes.

    ./dev bench-spark [--orders 2000] [--reps 3] [--large 1000000] [--large-reps 1]

A run's time is Airflow's record of it: queued (the trigger) to its end. Each mode's
tables are checked against the oracle at the end. Prints the table (medians, every
repetition) and the Spark processes seen during a standalone and a Connect run.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import threading
import uuid
from datetime import datetime, timedelta, timezone

from exactly_once_demo.pipeline import config as demo_config
from exactly_once_demo.produce import ensure_topic, produce
from exactly_once_stack import lifecycle, spark_cluster
from exactly_once_stack.settings import LOCAL, environment, spark_connection
from tests.benchmarks import copies
from tests.benchmarks.airflow_runs import finished_run
from tests.dags.window import Api, WindowDag, services
from tests.exactly_once_demo.oracle import compare_with_the_oracle

MODES = ("local", "standalone", "connect")
FOLDER = LOCAL / "artifacts" / "bench-spark"


def _pipeline(mode: str) -> tuple[str, str, str]:
    name = f"bench_spark_{mode}"
    return name, name, name  # config(name, topic, schema)


TASKS = ("begin_checkpoint", "increment", "commit")


def _run(api: Api) -> dict[str, float]:
    """Triggers a run and waits for it: queued → end from Airflow's run record ("run"), and
    each task's duration from its task instance's."""
    run_id = api.call("POST", f"/dags/{api.dag_id}/dagRuns", json={"logical_date": None})["dag_run_id"]
    run = finished_run(api, run_id)
    tasks = api.call("GET", f"/dags/{api.dag_id}/dagRuns/{run_id}/taskInstances")["task_instances"]
    return {"run": (datetime.fromisoformat(run["end_date"]) - datetime.fromisoformat(run["queued_at"])).total_seconds(),
            **{t["task_id"]: t["duration"] for t in tasks}}


def _spark_processes() -> list[str]:
    """The Spark JVMs and Python workers running now: PID, RSS, what they are."""
    listing = subprocess.run(["ps", "-eo", "pid,rss,args", "--no-headers"], capture_output=True, text=True).stdout
    kinds = {"deploy.master.Master": "standalone master", "deploy.worker.Worker": "standalone worker",
             "CoarseGrainedExecutorBackend": "executor", "SparkConnectServer": "Spark Connect server",
             "launch-increment-": "spark-submit driver (JVM or Python) of an attempt",
             "pyspark.daemon": "Python worker daemon", "pyspark.worker": "Python worker"}
    found = []
    for line in listing.splitlines():
        pid, rss, args = line.split(None, 2)
        kind = next((k for marker, k in kinds.items() if marker in args), None)
        if kind:
            found.append(f"{pid:>7}  {int(rss) // 1024:>5} MiB  {kind}")
    return found


def _sample_during(seconds: float, into: list[str]) -> threading.Thread:
    def sample():
        threading.Event().wait(seconds)
        into.extend(_spark_processes())
    thread = threading.Thread(target=sample, daemon=True)
    thread.start()
    return thread


Figures = dict[str, dict[int, list[dict[str, float]]]]  # per mode, per size: each repetition's seconds


def measure(servers: str, db_url: str, sizes: list[tuple[int, int]]) -> tuple[Figures, dict[str, list[str]]]:
    """`sizes`: (orders per checkpoint, repetitions). Starts the cluster services not running,
    and stops those."""
    started = []
    try:
        for mode in MODES[1:]:
            started += spark_cluster.start(mode)
        return _runs(servers, db_url, sizes)
    finally:
        spark_cluster.stop_named(started)


def _runs(servers: str, db_url: str, sizes: list[tuple[int, int]]) -> tuple[Figures, dict[str, list[str]]]:
    suffix = uuid.uuid4().hex[:6]
    seconds: Figures = {mode: {} for mode in MODES}
    seen = {}
    for mode in MODES:
        pipeline = _pipeline(mode)
        copies.remove(servers, db_url, demo_config(*pipeline), [pipeline[2]])
        copies.create_demo_tables(db_url, pipeline[2])
        ensure_topic(servers, pipeline[1])
    dags = [WindowDag(f"bench_spark_{mode}_{suffix}", datetime.now(timezone.utc) - timedelta(days=1),
                      pipeline=_pipeline(mode), spark_conn_id=f"spark_{mode}") for mode in MODES]
    connections = {f"AIRFLOW_CONN_SPARK_{mode.upper()}": json.dumps(spark_connection(mode)) for mode in MODES}
    try:
        (FOLDER / "dags").mkdir(parents=True, exist_ok=True)
        with services(FOLDER / "dags", dags, **connections) as apis:
            for api in apis.values():
                api.call("PATCH", f"/dags/{api.dag_id}", json={"is_paused": False})
            for size, repetitions in sizes:
                for rep in range(repetitions):
                    for mode, dag in zip(MODES, dags):
                        produce(servers, size, seed=rep, topic=_pipeline(mode)[1])
                        if mode != "local" and mode not in seen:
                            seen[mode] = []
                            _sample_during(12, seen[mode])
                        seconds[mode].setdefault(size, []).append(_run(apis[dag.dag_id]))
                        print(f"{mode} {size} orders, repetition {rep + 1}: {seconds[mode][size][-1]}", flush=True)
        for mode in MODES:
            config = demo_config(*_pipeline(mode))
            comparison, _ = compare_with_the_oracle(db_url, servers, config)
            if not comparison.exact:
                raise AssertionError(f"{mode}: the tables differ from the oracle: {comparison}")
    finally:
        for mode in MODES:
            copies.remove(servers, db_url, demo_config(*_pipeline(mode)), [_pipeline(mode)[2]])
    return seconds, seen


def table(seconds: Figures) -> str:
    """Per size and mode: the run (median, then each repetition), and each task's median."""
    sizes = sorted({size for by_size in seconds.values() for size in by_size})
    lines = ["| orders per checkpoint | what | " + " | ".join(MODES) + " |", "|---" * (len(MODES) + 2) + "|"]
    for size in sizes:
        for what in ("run", *TASKS):
            cells = []
            for mode in MODES:
                runs = [r[what] for r in seconds[mode].get(size, [])]
                each = f" ({', '.join(f'{s:.1f}' for s in runs)})" if what == "run" else ""
                cells.append(f"{statistics.median(runs):.1f} s{each}" if runs else "")
            label = "trigger → run end" if what == "run" else f"· {what} task"
            lines.append(f"| {size:,} | {label} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--orders", type=int, default=2000)
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--large", type=int, default=1_000_000)
    parser.add_argument("--large-reps", type=int, default=1)
    args = parser.parse_args()
    started = lifecycle.up()
    try:
        env = environment()
        seconds, seen = measure(env["KAFKA_BOOTSTRAP_SERVERS"], env["PIPELINE_DB_URL"],
                                [(args.orders, args.reps), (args.large, args.large_reps)])
    finally:
        lifecycle.down(started)
    print("\nA checkpoint through the running scheduler (medians; the run's repetitions in brackets):\n")
    print(table(seconds))
    for mode, lines in seen.items():
        print(f"\nSpark processes 12 s into the first {mode} run:\n" + "\n".join(lines))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
