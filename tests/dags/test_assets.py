"""A downstream DAG scheduled on a sink's asset, with the scheduler, dag-processor, triggerer
and api-server running: every commit task's try 1 fails after COMMIT, before it claims the
checkpoint's announcement (a fault), so each checkpoint is committed by one try and announced
by its retry, which finds it committed.
The downstream DAG counts, in the sink's table, the rows of the checkpoint each triggering
event names (its ranges) and finds exactly the event's rows, for every committed checkpoint,
once: a commit task cleared afterwards, and a run with nothing new, announce nothing; the
kafka sink's topic is announced by the publish task. (Which commits announce is the ledger's
word: tests/ledger/test_announcements.py.)
"""

from __future__ import annotations

import json
import os
from datetime import datetime, timezone

import pytest

from exactly_once_demo.oracle import checkpoints
from exactly_once_demo.pipeline import CONFIG, DELTAS_TOPIC, TOPIC
from exactly_once_demo.produce import produce
from tests.dags.window import Api, WindowDag, services
from tests.exactly_once_demo.oracle import assert_tables_equal_the_oracle

# Heavy (./dev test -m heavy): runs of the scheduler's, minutes long; CI runs the scheduler in
# tests/dags/test_pipelines_view.py.
pytestmark = pytest.mark.heavy

FAULT = {"EXACTLY_ONCE_FAULTS": "commit_task.try1.after_commit=raise"}
ORDERS_ASSET = f"exactly_once.{CONFIG.name}.orders"
DELTAS_ASSET = f"exactly_once.{CONFIG.name}.sku_minute_deltas"
ORDERS_ALIAS = f"exactly_once:{CONFIG.name}:orders"  # what a downstream DAG schedules on

DOWNSTREAM = '''\
from datetime import datetime

from airflow.sdk import AssetAlias, dag, task


@dag(dag_id="{dag_id}", schedule=AssetAlias("{alias}"), start_date=datetime(2026, 1, 1), catchup=False,
     is_paused_upon_creation=False, max_active_runs=1)
def downstream():
    @task
    def count_the_checkpoints_rows(**context):
        from contextlib import closing

        from exactly_once.connections import connector

        counted = []
        with closing(connector()()) as conn, conn.cursor() as cur:
            # An alias's first run gets its events from before the DAG existed: earlier tests' DAGs of the demo.
            for event in [e for e in context["triggering_asset_events"][AssetAlias("{alias}")]
                          if e.source_dag_id == "{pipeline_dag}"]:
                found = 0
                for r in event.extra["ranges"]:
                    cur.execute("SELECT count(*) FROM " + event.extra["table"] + " WHERE kafka_topic = %s "
                                "AND kafka_partition = %s AND kafka_offset >= %s AND kafka_offset < %s",
                                (r["topic"], r["partition"], r["from_offset"], r["to_offset"]))
                    found += cur.fetchone()[0]
                print("asset event extra:", event.extra)
                counted.append({{"checkpoint_id": event.extra["checkpoint_id"], "rows": event.extra["rows"],
                                "found": found}})
        return counted

    count_the_checkpoints_rows()


downstream()
'''


@pytest.fixture
def dags(tmp_path, stack_env):
    """The demo pipeline (manual runs) and a DAG scheduled on its orders sink's asset."""
    pipeline = WindowDag(f"orders_assets_{datetime.now(timezone.utc):%H%M%S}", datetime(2026, 1, 1),
                         pipeline=(CONFIG.name, TOPIC, "demo", DELTAS_TOPIC))  # the demo, with its kafka sink
    downstream = f"{pipeline.dag_id}_downstream"
    (tmp_path / f"{downstream}.py").write_text(DOWNSTREAM.format(dag_id=downstream, alias=ORDERS_ALIAS,
                                                                         pipeline_dag=pipeline.dag_id))
    with services(tmp_path, [pipeline], **FAULT) as apis:
        api = apis[pipeline.dag_id]
        below = Api(api.base, downstream)
        below.wait(f"DAG {downstream} parsed", lambda: downstream in {
            d["dag_id"] for d in below.call("GET", "/dags", params={"dag_id_pattern": downstream})["dags"]}, 120)
        api.call("PATCH", f"/dags/{api.dag_id}", json={"is_paused": False})
        yield api, below


def run(api: Api) -> str:
    run_id = api.call("POST", f"/dags/{api.dag_id}/dagRuns", json={"logical_date": None})["dag_run_id"]
    api.wait(f"run {run_id}", lambda: api.run_state(run_id) in ("success", "failed"))
    assert api.run_state(run_id) == "success", api.task_log(run_id, "commit", 1)
    return run_id


def events(api: Api, asset_name: str) -> list[dict]:
    """The asset events of the pipeline's DAG for one asset, oldest first."""
    return [e for e in api.call("GET", "/assets/events", params={
        "source_dag_id": api.dag_id, "limit": 100, "order_by": "timestamp"})["asset_events"] if e["name"] == asset_name]


def counted(below: Api) -> list[dict]:
    """What each finished run of the downstream DAG counted, oldest run first."""
    runs = below.call("GET", f"/dags/{below.dag_id}/dagRuns", params={"order_by": "run_after"})["dag_runs"]
    return [entry for r in runs if r["state"] == "success" for entry in below.call(
        "GET", f"/dags/{below.dag_id}/dagRuns/{r['dag_run_id']}/taskInstances/count_the_checkpoints_rows/"
               "xcomEntries/return_value", params={"deserialize": True})["value"]]


def test_a_downstream_dag_runs_once_per_committed_checkpoint_and_finds_exactly_its_rows(fresh_demo, kafka_servers,
                                                                                         dags):
    api, below = dags
    produce(kafka_servers, 300, seed=1)
    first = run(api)
    produce(kafka_servers, 200, seed=2)
    second = run(api)
    for run_id in (first, second):  # try 1 committed and failed; try 2 found it committed and announced it
        assert "fault injected at commit_task.try1.after_commit" in api.task_log(run_id, "commit", 1)
        assert "already committed" in api.task_log(run_id, "commit", 2)

    committed = {run_id: checkpoint_id for checkpoint_id, run_id, state, _ in checkpoints(fresh_demo)
                 if state == "committed"}
    announced = events(api, ORDERS_ASSET)
    assert [e["extra"]["checkpoint_id"] for e in announced] == [committed[first], committed[second]], announced
    assert [(e["source_run_id"], e["source_task_id"]) for e in announced] == [(first, "commit"), (second, "commit")]
    extra = announced[0]["extra"]
    assert extra["pipeline"] == CONFIG.name and extra["sink"] == "orders" and extra["dag_run_id"] == first
    assert set(extra["rows_per_sink"]) == {"orders", "sku_minute_totals", "sku_last_price"}, extra
    assert extra["config_version"] and extra["reprocessing"] is None and extra["ranges"], extra
    published = events(api, DELTAS_ASSET)  # the publish task announces the kafka sink's topic
    server = json.loads(os.environ["AIRFLOW_CONN_KAFKA_DEFAULT"])["extra"]["bootstrap.servers"].split(",")[0]
    assert [(e["extra"]["sink"], e["uri"]) for e in published] == [
        ("sku_minute_deltas", f"kafka://{server}/{DELTAS_TOPIC}")] * len(published), published
    assert published and all(e["extra"]["records"] > 0 for e in published), published

    below.wait("the downstream DAG counted both checkpoints", lambda: len(counted(below)) == 2, 300)
    tables = assert_tables_equal_the_oracle(fresh_demo, kafka_servers)
    downstream = counted(below)
    assert [c["checkpoint_id"] for c in downstream] == [committed[first], committed[second]], downstream
    assert all(c["found"] == c["rows"] > 0 for c in downstream), downstream
    assert sum(c["rows"] for c in downstream) == len(tables["orders"])

    # The commit task of the first run cleared (a replayed commit), then a run with nothing new.
    api.call("POST", f"/dags/{api.dag_id}/clearTaskInstances",
             json={"dag_run_id": first, "task_ids": ["commit"], "dry_run": False, "only_failed": False,
                   "reset_dag_runs": True})
    api.wait("the cleared run", lambda: api.run_state(first) == "success")
    assert "already committed" in api.task_log(first, "commit", 3)
    run(api)
    assert [e["extra"]["checkpoint_id"] for e in events(api, ORDERS_ASSET)] == [committed[first], committed[second]]
