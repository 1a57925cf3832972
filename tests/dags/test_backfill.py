"""Backfills through Airflow's REST API with the scheduler, dag-processor, api-server and
triggerer running: three intervals with three runs in parallel give exactly the oracle;
clearing a committed run's commit task and backfilling again with
`reprocess_behavior=completed` change nothing and launch no Spark job. The DAG is the
demo pipeline on 10-second intervals (tests/dags/window.py).
"""

from __future__ import annotations

from datetime import datetime, timedelta

import pytest

from exactly_once_demo.oracle import attempts, checkpoints, committed_orders
from exactly_once_demo.produce import produce
from tests.dags.window import next_boundary, wait_until
from tests.dags.window import window as window_dag
from tests.exactly_once_demo.oracle import assert_tables_equal_the_oracle, rows

INTERVAL = timedelta(seconds=10)


@pytest.fixture
def window(tmp_path, stack_env):
    start = next_boundary(INTERVAL, lead=timedelta(seconds=30))  # once the services had time to start
    last = start + 2 * INTERVAL  # the logical date (interval start) of the third interval
    with window_dag(tmp_path, INTERVAL, start, last) as api:
        yield api, start, last


def test_backfill_in_parallel_equals_the_oracle_and_clearing_or_reprocessing_changes_nothing(
        fresh_demo, kafka_servers, window):
    api, start, last = window
    assert api.call("GET", f"/dags/{api.dag_id}")["is_paused"], "the window DAG must wait paused for the backfill"
    for i in range(3):  # one batch inside each interval
        wait_until(start + i * INTERVAL + timedelta(seconds=1))
        produce(kafka_servers, 400, seed=i)
    wait_until(last + INTERVAL + timedelta(seconds=1))
    # The backfill first: the scheduled run that unpausing makes finds its interval taken.
    backfill = api.backfill(start, last)
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
    api.wait("the cleared run", lambda: api.run_state(cleared) == "success")
    assert rows(fresh_demo) == after

    # Backfill the same intervals again, completed runs included: every task reruns, nothing changes.
    again = api.finished_runs(api.backfill(start, last, reprocess="completed"), start, last)
    assert sorted(r["state"] for r in again) == ["success"] * 3, again
    assert rows(fresh_demo) == after
    assert attempts(fresh_demo) == spark_attempts  # no Spark job was launched
    assert {run_id: (state, records) for _, run_id, state, records in checkpoints(fresh_demo)} == by_run
