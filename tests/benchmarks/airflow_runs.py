"""Pipeline runs through Airflow with its scheduler running, timed: a run with no new
records, and a backfill of 10 intervals run 3 at a time and one at a time.

The DAGs are copies of the demo pipeline (tests/dags/window.py): `empty` takes manual
runs only; the two backfill DAGs read the same topic, each into a ledger name and
tables of its own, over the same 10 past intervals, one batch of orders produced
inside each. Times come from Airflow's own run records: from the request (trigger or
backfill) to the end of the last run.
"""

from __future__ import annotations

import uuid
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone
from pathlib import Path

from exactly_once_demo.pipeline import config as demo_config
from exactly_once_demo.produce import ensure_topic, produce
from tests.benchmarks import copies
from tests.benchmarks.copies import Q
from tests.dags.window import Api, WindowDag, next_boundary, services, wait_until
from tests.exactly_once_demo.oracle import compare_with_the_oracle

INTERVAL = timedelta(seconds=5)
ORDERS_PER_INTERVAL = 1000
RUN_TIMEOUT = 1800


@dataclass(frozen=True)
class Backfill:
    runs: int
    seconds: float          # backfill requested → its last run ended
    records: int            # committed records the runs' checkpoints read, in all
    empty_runs: int         # runs that read nothing: their interval's records held by another run

    @property
    def per_run(self) -> float:
        return self.seconds / self.runs


@dataclass(frozen=True)
class AirflowFigures:
    empty_run: float                # trigger → run ended; its increment and commit were skipped
    sequential: Backfill
    parallel: Backfill


def _pipeline(name: str, topic: str) -> tuple[str, str, str]:
    return name, topic, name  # config(name, topic, schema)


def measure(servers: str, db_url: str, folder: Path, intervals: int = 10) -> AirflowFigures:
    suffix = uuid.uuid4().hex[:6]  # Airflow keeps DAGs and runs of earlier benchmark runs
    empty = _pipeline("bench_af_empty", "bench_af_empty")
    sequential = _pipeline("bench_af_sequential", "bench_af_backfill")
    parallel = _pipeline("bench_af_parallel", "bench_af_backfill")
    pipelines = [empty, sequential, parallel]
    for pipeline in pipelines:  # all first: two of them share a topic
        copies.remove(servers, db_url, demo_config(*pipeline), [pipeline[2]])
    for pipeline in pipelines:
        copies.create_demo_tables(db_url, pipeline[2])
        ensure_topic(servers, pipeline[1])  # now: creating it inside an interval would make its batch late

    start = next_boundary(INTERVAL, lead=timedelta(seconds=2))
    last = start + (intervals - 1) * INTERVAL
    dags = [WindowDag(f"bench_empty_{suffix}", start - timedelta(days=1), pipeline=empty),
            WindowDag(f"bench_backfill_sequential_{suffix}", start, INTERVAL, last, sequential, max_active_runs=1),
            WindowDag(f"bench_backfill_parallel_{suffix}", start, INTERVAL, last, parallel, max_active_runs=3)]
    dags_folder = folder / "dags"
    dags_folder.mkdir(parents=True, exist_ok=True)
    for old in dags_folder.glob("*.py"):
        old.unlink()
    try:
        # The batches go in while the services start (no Spark job competes with them yet).
        with ThreadPoolExecutor(1) as background:
            batches = background.submit(_produce_intervals, servers, sequential[1], start, intervals)
            with services(dags_folder, dags) as apis:
                empty_api, sequential_api, parallel_api = (apis[d.dag_id] for d in dags)
                batches.result()
                wait_until(last + INTERVAL + timedelta(seconds=1))
                timed = [_backfill(api, start, last, n, db_url, pipeline)
                         for api, n, pipeline in ((sequential_api, 1, sequential), (parallel_api, 3, parallel))]
                empty_seconds = _empty_run(empty_api, servers, empty[1])
        for pipeline in (sequential, parallel):
            _check_oracle(servers, db_url, pipeline)
        return AirflowFigures(empty_seconds, *timed)
    finally:
        for pipeline in pipelines:
            copies.remove(servers, db_url, demo_config(*pipeline), [pipeline[2]])


def _produce_intervals(servers: str, topic: str, start: datetime, intervals: int) -> None:
    """A batch inside each interval; one that ends after its interval's end would be
    taken by the next interval's run, so it stops the benchmark."""
    for i in range(intervals):
        wait_until(start + i * INTERVAL + timedelta(seconds=0.3))
        produce(servers, ORDERS_PER_INTERVAL, seed=i, topic=topic)
        late = datetime.now(timezone.utc) - (start + (i + 1) * INTERVAL)
        if late.total_seconds() >= 0:
            raise RuntimeError(f"the batch of interval {i} ended {late.total_seconds():.1f} s after the interval: "
                               f"this machine needs intervals longer than {INTERVAL}")


def _when(text: str) -> datetime:
    return datetime.fromisoformat(text)


def _empty_run(api: Api, servers: str, topic: str) -> float:
    """A first run takes a batch of orders; the second finds nothing new: timed, and its
    increment and commit must have been skipped (no Spark job)."""
    produce(servers, ORDERS_PER_INTERVAL, topic=topic)
    api.call("PATCH", f"/dags/{api.dag_id}", json={"is_paused": False})
    first = api.call("POST", f"/dags/{api.dag_id}/dagRuns", json={"logical_date": None})["dag_run_id"]
    finished_run(api, first)
    requested = datetime.now(timezone.utc)
    second = api.call("POST", f"/dags/{api.dag_id}/dagRuns", json={"logical_date": None})["dag_run_id"]
    run = finished_run(api, second)
    tasks = api.call("GET", f"/dags/{api.dag_id}/dagRuns/{second}/taskInstances")["task_instances"]
    states = {t["task_id"]: t["state"] for t in tasks}
    if states != {"begin_checkpoint": "success", "increment": "skipped", "commit": "skipped"}:
        raise AssertionError(f"the run with nothing new ran tasks: {states}")
    return (_when(run["end_date"]) - requested).total_seconds()


def finished_run(api: Api, run_id: str) -> dict:
    """The run's record once it ended; AssertionError unless it succeeded."""
    def ended():
        run = api.call("GET", f"/dags/{api.dag_id}/dagRuns/{run_id}")
        return run if run["state"] in ("success", "failed") else None

    run = api.wait(f"run {run_id}", ended, RUN_TIMEOUT)
    if run["state"] != "success":
        raise AssertionError(f"{api.dag_id} run {run_id} failed")
    return run


def _backfill(api: Api, start: datetime, last: datetime, at_once: int, db_url: str,
              pipeline: tuple[str, str, str]) -> Backfill:
    requested = datetime.now(timezone.utc)
    api.backfill(start, last, max_active_runs=at_once)
    api.call("PATCH", f"/dags/{api.dag_id}", json={"is_paused": False})
    expected = round((last - start) / INTERVAL) + 1

    def ended():
        runs = [r for r in api.call("GET", f"/dags/{api.dag_id}/dagRuns", params={"limit": 100})["dag_runs"]
                if r["run_type"] == "backfill"]
        return runs if len(runs) == expected and all(r["state"] in ("success", "failed") for r in runs) else None

    runs = api.wait(f"backfill of {api.dag_id}", ended, RUN_TIMEOUT)
    failed = [r["dag_run_id"] for r in runs if r["state"] != "success"]
    if failed:
        raise AssertionError(f"{api.dag_id}: backfill runs failed: {failed}")
    records = [n for n, in copies.execute(db_url, Q["checkpoint_records"], {"pipeline": pipeline[0]})]
    return Backfill(len(runs), (max(_when(r["end_date"]) for r in runs) - requested).total_seconds(),
                    sum(n or 0 for n in records), sum(1 for n in records if n is None))


def _check_oracle(servers: str, db_url: str, pipeline: tuple[str, str, str]) -> None:
    comparison, _ = compare_with_the_oracle(db_url, servers, demo_config(*pipeline))
    if not comparison.exact:
        raise AssertionError(f"{pipeline[0]}: tables differ from the oracle: {comparison}")
