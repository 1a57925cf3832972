"""Backfills through Airflow's REST API with the scheduler, dag-processor, api-server and
triggerer running: three intervals with three runs in parallel give exactly the oracle;
clearing a committed run's commit task and backfilling again with
`reprocess_behavior=completed` change nothing and launch no Spark job.

The DAG is the demo pipeline (`checkpoint_tasks(demo.orders.CONFIG)`) on 10-second
intervals, written for the test into its own DAGs folder: its end_date closes the
window and it stays paused until the backfill exists, so no scheduled run can take the
window's records before the backfill does.
"""

from __future__ import annotations

import time
import uuid
from datetime import datetime, timedelta, timezone

import pytest
import requests

from demo.produce import produce
from stack import airflow
from stack.settings import environment, passwords
from tests.dags.demo_oracle import (assert_tables_equal_the_oracle, attempts, checkpoints, committed_orders,
                                    tables)

INTERVAL = timedelta(seconds=10)
DAG_FILE = '''\
from datetime import datetime, timedelta

from airflow.sdk import DeltaDataIntervalTimetable, dag
from demo.orders import CONFIG
from exactly_once.airflow_tasks import checkpoint_tasks


@dag(dag_id="{dag_id}", schedule=DeltaDataIntervalTimetable(timedelta(seconds={seconds})),
     start_date=datetime.fromisoformat("{start}"), end_date=datetime.fromisoformat("{end}"), catchup=False,
     is_paused_upon_creation=True, max_active_runs=3)
def window():
    checkpoint_tasks(CONFIG)


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
        return "\n".join(str(line.get("event", line)) if isinstance(line, dict) else str(line)
                         for line in log["content"])

    def backfill(self, start: datetime, last: datetime, reprocess: str) -> int:
        return self.call("POST", "/backfills", json={
            "dag_id": self.dag_id, "from_date": start.isoformat(), "to_date": last.isoformat(),
            "max_active_runs": 3, "reprocess_behavior": reprocess})["id"]

    def finished_runs(self, backfill: int, start: datetime, last: datetime) -> list[dict]:
        """Waits until the backfill completed; its DAG runs."""
        self.wait(f"backfill {backfill}", lambda: self.call("GET", f"/backfills/{backfill}")["completed_at"])
        runs = self.call("GET", f"/dags/{self.dag_id}/dagRuns", params={"limit": 100})["dag_runs"]
        return [r for r in runs if start <= datetime.fromisoformat(r["logical_date"]) <= last]


@pytest.fixture
def window(tmp_path, stack_env):
    """A DAGs folder with the window's DAG; the Airflow services reading it."""
    now = datetime.now(timezone.utc)
    # The first interval starts on a 10-second boundary once the services had time to start.
    start = datetime.fromtimestamp((now.timestamp() // 10 + 4) * 10, timezone.utc)
    last = start + 2 * INTERVAL  # the logical date (interval start) of the third interval
    dag_id = f"orders_backfill_window_{uuid.uuid4().hex[:8]}"  # no runs left from an earlier test's window
    (tmp_path / "window.py").write_text(DAG_FILE.format(dag_id=dag_id, seconds=int(INTERVAL.total_seconds()),
                                                         start=start.isoformat(), end=last.isoformat()))
    started = airflow.start_services(AIRFLOW__CORE__DAGS_FOLDER=str(tmp_path))
    try:
        api = Api(environment()["AIRFLOW__API__BASE_URL"], dag_id)
        api.wait("the window DAG parsed", lambda: dag_id in {
            d["dag_id"] for d in api.call("GET", "/dags", params={"dag_id_pattern": dag_id})["dags"]}, 120)
        yield api, start, last
    finally:
        airflow.stop_services(started)


def wait_until(moment: datetime) -> None:
    time.sleep(max(0.0, (moment - datetime.now(timezone.utc)).total_seconds()))


def test_backfill_in_parallel_equals_the_oracle_and_clearing_or_reprocessing_changes_nothing(
        fresh_demo, kafka_servers, window):
    api, start, last = window
    assert api.call("GET", f"/dags/{api.dag_id}")["is_paused"], "the window DAG must wait paused for the backfill"
    for i in range(3):  # one batch inside each interval
        wait_until(start + i * INTERVAL + timedelta(seconds=1))
        produce(kafka_servers, 400, seed=i)
    wait_until(last + INTERVAL + timedelta(seconds=1))
    # The backfill first: the scheduled run that unpausing makes finds its interval taken.
    backfill = api.backfill(start, last, reprocess="none")
    api.call("PATCH", f"/dags/{api.dag_id}", json={"is_paused": False})
    runs = api.finished_runs(backfill, start, last)
    intervals = {(datetime.fromisoformat(r["data_interval_start"]), datetime.fromisoformat(r["data_interval_end"]))
                 for r in runs}
    assert intervals == {(start + i * INTERVAL, start + (i + 1) * INTERVAL) for i in range(3)}
    assert sorted(r["state"] for r in runs) == ["success"] * 3, runs
    after = assert_tables_equal_the_oracle(fresh_demo, kafka_servers)
    by_run = {run_id: (state, records) for _, run_id, state, records in checkpoints(fresh_demo)}
    assert {r["dag_run_id"] for r in runs} == set(by_run)
    assert all(state == "committed" for state, _ in by_run.values()), by_run
    # Runs begin in any order, and a run takes everything up to its interval's end: a run that
    # begins after a later interval's run finds its records taken, and its log names the holder.
    assert sum(records or 0 for _, records in by_run.values()) == len(committed_orders(kafka_servers))
    for run_id, (_, records) in by_run.items():
        if records is None:
            assert "are already held by checkpoint(s)" in api.task_log(run_id, "begin_checkpoint")
    spark_attempts = attempts(fresh_demo)

    # Clear the commit task of a committed run: it runs again, commits nothing new.
    cleared = runs[0]["dag_run_id"]
    api.call("POST", f"/dags/{api.dag_id}/clearTaskInstances",
             json={"dag_run_id": cleared, "task_ids": ["commit"], "dry_run": False, "only_failed": False,
                   "reset_dag_runs": True})
    api.wait("the cleared run",
             lambda: api.call("GET", f"/dags/{api.dag_id}/dagRuns/{cleared}")["state"] == "success")
    assert tables(fresh_demo) == after

    # Backfill the same intervals again, completed runs included: every task reruns, nothing changes.
    again = api.finished_runs(api.backfill(start, last, reprocess="completed"), start, last)
    assert sorted(r["state"] for r in again) == ["success"] * 3, again
    assert tables(fresh_demo) == after
    assert attempts(fresh_demo) == spark_attempts  # no Spark job was launched
    assert {run_id: (state, records) for _, run_id, state, records in checkpoints(fresh_demo)} == by_run
