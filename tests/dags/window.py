"""A window of the demo pipeline for tests that need a running scheduler: a DAG with
`checkpoint_tasks(exactly_once_demo.pipeline.config(...))` on short intervals, written
into its own DAGs folder with an end_date closing the window and paused until the test
unpauses it, so no scheduled run can take the window's records before the test's
backfill does; the Airflow services reading that folder; and the REST API as the admin
user. The benchmarks use the same pieces for copies of the demo pipeline."""

from __future__ import annotations

import json
import time
import uuid
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Iterator

import requests

from exactly_once_stack import airflow
from exactly_once_stack.settings import environment, passwords

DAG_FILE = '''\
from datetime import datetime, timedelta

from airflow.sdk import DeltaDataIntervalTimetable, dag
from exactly_once.orchestration.checkpoint_tasks import checkpoint_tasks
from exactly_once_demo.pipeline import config


@dag(dag_id="{dag_id}", schedule={schedule}, start_date=datetime.fromisoformat("{start}"), end_date={end},
     catchup=False, is_paused_upon_creation=True, max_active_runs={max_active_runs})
def window():
    checkpoint_tasks(config(*{pipeline!r}, **{options!r}), commit_retries={commit_retries},
                     spark_conn_id={spark_conn_id!r})


window()
'''


class Api:
    """Airflow's REST API, as the admin user, about one DAG."""

    def __init__(self, base_url: str, dag_id: str):
        self.base, self.dag_id = base_url, dag_id
        token = requests.post(f"{base_url}/auth/token", timeout=30,
                              json={"username": "admin", "password": passwords()["airflow_admin"]})
        token.raise_for_status()
        self.session = requests.Session()
        self.session.headers["Authorization"] = f"Bearer {token.json()['access_token']}"

    def call(self, method: str, path: str, **kwargs) -> dict:
        answer = self.session.request(method, f"{self.base}/api/v2{path}", timeout=30, **kwargs)
        assert answer.ok, f"{method} {path}: {answer.status_code} {answer.text}"
        return answer.json()

    def wait(self, what: str, done, timeout: float = 600):
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            found = done()
            if found:
                return found
            time.sleep(2)
        raise AssertionError(f"{what}: not done after {timeout:.0f} s")

    def task_log(self, run_id: str, task_id: str, try_number: int = 1) -> str:
        log = self.call("GET", f"/dags/{self.dag_id}/dagRuns/{run_id}/taskInstances/{task_id}/logs/{try_number}",
                        headers={"Accept": "application/json"})
        # Whole records: a failure's exception is in a field of its own, not in "event".
        return "\n".join(json.dumps(line, ensure_ascii=False) for line in log["content"])

    def backfill(self, start: datetime, last: datetime, reprocess: str = "none", max_active_runs: int = 3,
                 run_backwards: bool = False, conf: dict | None = None) -> int:
        """Creates a backfill of the logical dates [start, last], `max_active_runs` runs at a time
        (the latest first when `run_backwards`), with the runs' `conf`; its id."""
        return self.call("POST", "/backfills", json={
            "dag_id": self.dag_id, "from_date": start.isoformat(), "to_date": last.isoformat(),
            "max_active_runs": max_active_runs, "reprocess_behavior": reprocess,
            "run_backwards": run_backwards, "dag_run_conf": conf or {}})["id"]

    def latest_backfill(self) -> int:
        return max(b["id"] for b in self.call("GET", "/backfills", params={"dag_id": self.dag_id})["backfills"])

    def finished_runs(self, backfill: int, start: datetime, last: datetime) -> list[dict]:
        """Waits until the backfill completed; the backfill runs of [start, last] (logical dates)."""
        self.wait(f"backfill {backfill}", lambda: self.call("GET", f"/backfills/{backfill}")["completed_at"])
        runs = self.call("GET", f"/dags/{self.dag_id}/dagRuns", params={"limit": 100})["dag_runs"]
        return [r for r in runs if r["run_type"] == "backfill"
                and start <= datetime.fromisoformat(r["logical_date"]) <= last]

    def run_state(self, run_id: str) -> str:
        return self.call("GET", f"/dags/{self.dag_id}/dagRuns/{run_id}")["state"]


def next_boundary(interval: timedelta, lead: timedelta) -> datetime:
    """The first interval boundary at least `lead` from now."""
    earliest = datetime.now(timezone.utc).timestamp() + lead.total_seconds()
    step = interval.total_seconds()
    return datetime.fromtimestamp((earliest // step + 1) * step, timezone.utc)


@dataclass(frozen=True)
class WindowDag:
    """A DAG of (a copy of) the demo pipeline: runs of `interval` for the logical dates
    start..last, or, without an interval, manual runs only (schedule None, no end)."""

    dag_id: str
    start: datetime
    interval: timedelta | None = None
    last: datetime | None = None
    pipeline: tuple[str, ...] = ()   # exactly_once_demo's config(*pipeline): the demo itself, or (name, topic, schema)
    commit_retries: int = 4
    max_active_runs: int = 3
    transform: str | None = None     # another transform than the demo's
    spark_conn_id: str = "spark_default"

    def write(self, folder: Path) -> None:
        timed = self.interval is not None
        (folder / f"{self.dag_id}.py").write_text(DAG_FILE.format(
            dag_id=self.dag_id, start=self.start.isoformat(), pipeline=self.pipeline,
            schedule=f"DeltaDataIntervalTimetable(timedelta(seconds={int(self.interval.total_seconds())}))"
            if timed else "None",
            end=f'datetime.fromisoformat("{self.last.isoformat()}")' if timed else "None",
            commit_retries=self.commit_retries, max_active_runs=self.max_active_runs,
            options={"transform": self.transform} if self.transform else {}, spark_conn_id=self.spark_conn_id))


@contextmanager
def services(folder: Path, dags: list[WindowDag], **service_env: str) -> Iterator[dict[str, Api]]:
    """The DAGs written into `folder`, the Airflow services reading it (`service_env`: extra
    variables for them), and an API client per DAG id, once every DAG is parsed."""
    for dag in dags:
        dag.write(folder)
    started = airflow.start_services(AIRFLOW__CORE__DAGS_FOLDER=str(folder), **service_env)
    try:
        base = environment()["AIRFLOW__API__BASE_URL"]
        apis = {dag.dag_id: Api(base, dag.dag_id) for dag in dags}
        for api in apis.values():
            api.wait(f"DAG {api.dag_id} parsed", lambda api=api: api.dag_id in {
                d["dag_id"] for d in api.call("GET", "/dags", params={"dag_id_pattern": api.dag_id})["dags"]}, 120)
        yield apis
    finally:
        airflow.stop_services(started)


@contextmanager
def window(folder: Path, interval: timedelta, start: datetime, last: datetime, commit_retries: int = 4,
           **service_env: str) -> Iterator[tuple[Api, WindowDag]]:
    """The demo's window DAG (logical dates start..last) in `folder`, the Airflow services
    reading it, and the API, once the DAG is parsed."""
    dag = WindowDag(f"orders_window_{uuid.uuid4().hex[:8]}", start, interval, last,  # no runs of an earlier test's
                    commit_retries=commit_retries)
    with services(folder, [dag], **service_env) as apis:
        yield apis[dag.dag_id], dag


def wait_until(moment: datetime) -> None:
    time.sleep(max(0.0, (moment - datetime.now(timezone.utc)).total_seconds()))
