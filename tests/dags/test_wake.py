"""Runs woken by records (exactly_once.orchestration.wake), with the scheduler, dag-processor,
triggerer and api-server running: the demo pipeline's DAG scheduled only by
`wake_on_records` (a 2-second poll, a 15-second minimum gap, `max_active_runs=1`) and idle.
Records produced to its topic start a run that commits them within WOKEN_WITHIN; a burst of
1,000 records starts one or two runs, not a thousand; with nothing waiting, no run starts;
the tables equal the oracle.
"""

from __future__ import annotations

import time
from datetime import datetime, timezone

import pytest

from exactly_once_demo.oracle import checkpoints
from exactly_once_demo.pipeline import TOPIC
from exactly_once_demo.produce import ensure_topic, produce
from tests.dags.window import Api, services
from tests.exactly_once_demo.oracle import assert_tables_equal_the_oracle

# Heavy (./dev test -m heavy): runs of the scheduler's, minutes long; CI runs the scheduler in
# tests/dags/test_pipelines_view.py.
pytestmark = pytest.mark.heavy

WOKEN_WITHIN = 120  # seconds from the records' transaction to the woken run's end: a 2 s poll, a run of ~40 s
MIN_GAP = 15

DAG = '''\
from datetime import datetime, timedelta

from airflow.sdk import dag
from exactly_once.orchestration.checkpoint_tasks import checkpoint_tasks
from exactly_once.orchestration.wake import wake_on_records
from exactly_once_demo.pipeline import config

CONFIG = config()


@dag(dag_id="{dag_id}", schedule=wake_on_records(CONFIG, min_gap=timedelta(seconds={min_gap}),
                                               poll_every=timedelta(seconds=2)),
     start_date=datetime(2026, 1, 1), catchup=False, is_paused_upon_creation=True, max_active_runs=1)
def woken():
    checkpoint_tasks(CONFIG)


woken()
'''


@pytest.fixture
def woken_dag(tmp_path, stack_env, fresh_demo, kafka_servers):
    """The DAG, parsed, unpaused on the demo's empty topic, its watcher registered."""
    dag_id = f"orders_woken_{datetime.now(timezone.utc):%H%M%S}"
    (tmp_path / f"{dag_id}.py").write_text(DAG.format(dag_id=dag_id, min_gap=MIN_GAP))
    with services(tmp_path, []) as _:
        api = Api(stack_env["AIRFLOW__API__BASE_URL"], dag_id)
        api.wait(f"DAG {dag_id} parsed", lambda: dag_id in {
            d["dag_id"] for d in api.call("GET", "/dags", params={"dag_id_pattern": dag_id})["dags"]}, 120)
        ensure_topic(kafka_servers, TOPIC)  # fresh_demo deleted it: a topic gone would wake a failing run
        api.call("PATCH", f"/dags/{dag_id}", json={"is_paused": False})
        api.wait("the watcher registered", lambda: any(a["watchers"] for a in api.call(
            "GET", "/assets", params={"name_pattern": "records_waiting"})["assets"]), 180)
        yield api


def woken_runs(api: Api) -> list[dict]:
    return [r for r in api.call("GET", f"/dags/{api.dag_id}/dagRuns", params={"limit": 100})["dag_runs"]
            if r["run_type"] == "asset_triggered"]


def settled(api: Api) -> list[dict]:
    """The woken runs, once none is queued or running."""
    return api.wait("the woken runs ended", lambda: (lambda runs: runs if all(
        r["state"] in ("success", "failed") for r in runs) else None)(woken_runs(api)), WOKEN_WITHIN)


def ended(run: dict) -> float:
    return datetime.fromisoformat(run["end_date"]).timestamp()


def records_committed(db_url: str) -> int:
    return sum(records or 0 for *_, state, records in checkpoints(db_url) if state == "committed")


def test_records_wake_one_run_that_commits_them_and_a_burst_wakes_one_or_two(fresh_demo, kafka_servers, woken_dag):
    api = woken_dag
    produced = time.time()
    produce(kafka_servers, 50, seed=1)
    [first, *_] = api.wait("a woken run", lambda: [r for r in woken_runs(api) if r["state"] == "success"],
                           WOKEN_WITHIN)
    print(f"records to the woken run's commit: {ended(first) - produced:.1f} s")
    assert records_committed(fresh_demo) == 50
    assert [state for _, _, state, records in checkpoints(fresh_demo) if records] == ["committed"]

    # Idle: nothing waits, nothing wakes it.
    runs = settled(api)
    time.sleep(MIN_GAP + 5)
    assert [r["dag_run_id"] for r in woken_runs(api)] == [r["dag_run_id"] for r in runs]

    burst = time.time()
    produce(kafka_servers, 1000, seed=2)
    api.wait("the burst committed", lambda: records_committed(fresh_demo) >= 1050, WOKEN_WITHIN)
    time.sleep(MIN_GAP)  # a second wake-up, if any, has come
    woken = [r for r in settled(api) if r["dag_run_id"] not in {before["dag_run_id"] for before in runs}]
    print(f"burst to its first woken run's commit: {min(ended(r) for r in woken) - burst:.1f} s; runs: {len(woken)}")
    assert 1 <= len(woken) <= 2 and {r["state"] for r in woken} == {"success"}, woken
    assert records_committed(fresh_demo) == 1050
    assert_tables_equal_the_oracle(fresh_demo, kafka_servers)
