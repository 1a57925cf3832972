"""Backfills through Airflow's REST API with the scheduler, dag-processor, api-server and
triggerer running: three intervals with records in each, two runs at a time, once forwards
and once backwards (two windows of the demo pipeline) — each run's checkpoint reads exactly
the records Kafka stamped inside its data interval, none is empty, and the tables equal the
oracle; clearing a committed run's commit task and backfilling again with
`reprocess_behavior=completed` change nothing and launch no Spark job. (A backfill with the
`reprocess` parameter, which replays its runs' checkpoints, is tests/dags/test_ui.py's last
step, through the same API.) The DAGs are the demo pipeline on 6-second intervals
(tests/dags/window.py).
"""

from __future__ import annotations

import uuid
from datetime import datetime, timedelta

import pytest

from exactly_once_demo.oracle import attempts, checkpoints
from exactly_once_demo.produce import produce
from tests.dags.window import Api, WindowDag, next_boundary, services, wait_until
from tests.exactly_once_demo.oracle import assert_each_run_took_its_interval, assert_tables_equal_the_oracle, rows

# Heavy (./dev test -m heavy): CI plans backfills through the run path (tests/ledger/test_intervals.py)
# and runs the scheduler in tests/dags/test_pipelines_view.py.
pytestmark = pytest.mark.heavy

INTERVAL = timedelta(seconds=6)
RUNS = 3  # intervals per backfill: one more than a backfill runs at a time
AT_A_TIME = 2  # the backfills' max_active_runs


@pytest.fixture
def windows(tmp_path, stack_env):
    """Two windows of RUNS intervals each, one after the other, paused until backfilled."""
    start = next_boundary(INTERVAL, lead=timedelta(seconds=30))  # once the services had time to start
    dags = [WindowDag(f"orders_{name}_{uuid.uuid4().hex[:8]}", first, INTERVAL, first + (RUNS - 1) * INTERVAL)
            for name, first in (("forwards", start), ("backwards", start + RUNS * INTERVAL))]
    with services(tmp_path, dags) as apis:
        yield [(apis[dag.dag_id], dag.start, dag.last) for dag in dags]


def backfill(api: Api, first: datetime, last: datetime, **options) -> int:
    """A backfill of the window, which then runs: a paused DAG runs no backfill."""
    created = api.backfill(first, last, max_active_runs=AT_A_TIME, **options)
    api.call("PATCH", f"/dags/{api.dag_id}", json={"is_paused": False})
    return created


def began_in_order_of(runs: list[dict], db_url: str) -> list[str]:
    """The runs' logical dates in the order their checkpoints began."""
    began = {run_id: checkpoint_id for checkpoint_id, run_id, _, _ in checkpoints(db_url)}
    return [r["logical_date"] for r in sorted(runs, key=lambda r: began[r["dag_run_id"]])]


def test_backfills_forwards_and_backwards_split_the_intervals_and_clearing_or_reprocessing_changes_nothing(
        fresh_demo, kafka_servers, windows):
    [(forwards, start, last), (backwards, later_start, later_last)] = windows
    for api in (forwards, backwards):
        assert api.call("GET", f"/dags/{api.dag_id}")["is_paused"], "a window DAG must wait paused for its backfill"
    for i in range(2 * RUNS):  # one batch inside each interval of both windows
        wait_until(start + i * INTERVAL + timedelta(seconds=1))
        produce(kafka_servers, 150, seed=i)
        if i == RUNS:  # the forwards window's intervals are over: backfill them while the next ones fill
            # (after this interval's batch: the API's answer may take seconds on a busy machine)
            forwards_backfill = backfill(forwards, start, last)
    wait_until(later_last + INTERVAL + timedelta(seconds=1))
    backwards_backfill = backfill(backwards, later_start, later_last, run_backwards=True)
    runs = forwards.finished_runs(forwards_backfill, start, last)
    later_runs = backwards.finished_runs(backwards_backfill, later_start, later_last)
    assert sorted(r["state"] for r in runs + later_runs) == ["success"] * 2 * RUNS, runs + later_runs
    per_run = assert_each_run_took_its_interval(fresh_demo, kafka_servers, runs + later_runs)
    after = assert_tables_equal_the_oracle(fresh_demo, kafka_servers)
    by_run = {run_id: (state, records) for _, run_id, state, records in checkpoints(fresh_demo)}
    assert set(by_run) == set(per_run) and {state for state, _ in by_run.values()} == {"committed"}, by_run
    # Two at a time: the last interval's run (forwards), the first one's (backwards) waits.
    order, later_order = began_in_order_of(runs, fresh_demo), began_in_order_of(later_runs, fresh_demo)
    assert order[AT_A_TIME:] == sorted(r["logical_date"] for r in runs)[AT_A_TIME:], order
    assert later_order[AT_A_TIME:] == sorted(r["logical_date"] for r in later_runs)[:1], later_order
    spark_attempts = attempts(fresh_demo)

    # Clear the commit task of a committed run: it runs again, commits nothing new.
    cleared = runs[0]["dag_run_id"]
    forwards.call("POST", f"/dags/{forwards.dag_id}/clearTaskInstances",
                  json={"dag_run_id": cleared, "task_ids": ["commit"], "dry_run": False, "only_failed": False,
                        "reset_dag_runs": True})
    forwards.wait("the cleared run", lambda: forwards.run_state(cleared) == "success")
    assert rows(fresh_demo) == after

    # Backfill the same intervals again, completed runs included: every task reruns, nothing changes.
    again = forwards.finished_runs(forwards.backfill(start, last, reprocess="completed", max_active_runs=AT_A_TIME),
                                   start, last)
    assert sorted(r["state"] for r in again) == ["success"] * RUNS, again
    assert rows(fresh_demo) == after
    assert attempts(fresh_demo) == spark_attempts  # no Spark job was launched
    assert {run_id: (state, records) for _, run_id, state, records in checkpoints(fresh_demo)} == by_run
