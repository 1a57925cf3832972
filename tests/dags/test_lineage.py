"""Each demo run reports its lineage through OpenLineage (the provider's listener, file
transport): the increment task's COMPLETE event has the topic as input and the sink tables and
the dead letters as outputs, in OpenLineage's naming, and belongs to the run whose checkpoint
the ledger holds."""

from __future__ import annotations

import json
from datetime import datetime, timezone

from exactly_once_demo.oracle import checkpoints
from exactly_once_demo.produce import produce
from exactly_once_stack.settings import environment, passwords
from tests.dags.test_orders_exactly_once import dags_test


def test_a_demo_run_reports_the_topic_in_and_the_tables_out(fresh_demo, kafka_servers, tmp_path):
    events = tmp_path / "openlineage.jsonl"
    produce(kafka_servers, 300)
    run = dags_test(datetime.now(timezone.utc), AIRFLOW__OPENLINEAGE__TRANSPORT=json.dumps(
        {"type": "file", "log_file_path": str(events), "append": True}))
    assert run.returncode == 0, run.stdout[-4000:] + run.stderr[-4000:]

    [(_, run_id, state, _)] = checkpoints(fresh_demo)
    assert state == "committed"
    [increment] = [e for e in map(json.loads, events.read_text().splitlines())
                   if e["job"]["name"] == "orders_exactly_once.increment" and e["eventType"] == "COMPLETE"]
    assert increment["run"]["facets"]["airflow"]["dagRun"]["run_id"] == run_id
    env = environment()
    kafka = json.loads(env["AIRFLOW_CONN_KAFKA_DEFAULT"])["extra"]["bootstrap.servers"]
    db = json.loads(env["AIRFLOW_CONN_PIPELINE_DB"])
    assert [(d["namespace"], d["name"]) for d in increment["inputs"]] == [(f"kafka://{kafka}", "orders")]
    assert [(d["namespace"], d["name"]) for d in increment["outputs"]] == [
        (f"postgres://{db['host']}:{db['port']}", f"pipeline.{table}")
        for table in ("demo.orders", "demo.sku_minute_totals", "demo.sku_last_price", "exactly_once.dead_letters")]
    written = events.read_text()
    assert passwords()["kafka_pipeline"] not in written and passwords()["pipeline"] not in written
