"""An Avro pipeline through `airflow dags test` on the local stack, as a user deploys one: its
DAG file in a DAGs folder, `kafka_default` over SASL_SSL, the registry connection over HTTPS
with basic auth, the job through spark-submit with the registry handed over in its settings
file. One checkpoint holds records of three writer schemas, keys, headers, hostile records
and tombstones (tests/spark/avro_orders.py): the final tables and dead letters equal what
the records say, to the row."""

from __future__ import annotations

import os
import subprocess
from datetime import datetime, timezone

import pytest

from exactly_once_stack.settings import ROOT, process_environment
from tests.operate.test_preflight import DAG_FILE
from tests.spark.avro_orders import AvroOrders
from tests.spark.test_avro import produce_three_writers_and_hostile_records


# A variant (./dev test -m variant): tests/spark/test_avro.py runs the same records through the run path
# in CI, and tests/dags/test_orders_exactly_once.py the DAG through `airflow dags test`.
@pytest.mark.variant
def test_an_avro_pipeline_through_dags_test_equals_what_its_records_say(ledger_db, kafka_servers, topic, tmp_path):
    orders = AvroOrders(ledger_db, kafka_servers, topic)  # tombstones: delete
    produce_three_writers_and_hostile_records(orders, tombstone_reason=None)
    value = {"id": "bob9", "n": 9, "note": "last"}
    orders.produce([("ann", None, None, None, None), ("bob", orders.encoded(3, value), value, None, "web")])
    (tmp_path / "dags").mkdir()
    (tmp_path / "dags" / "avro_orders.py").write_text(
        DAG_FILE.format(name=orders.config.name, config=orders.config.model_dump(mode="json")))

    env = process_environment()
    env.update(AIRFLOW__CORE__DAGS_FOLDER=str(tmp_path / "dags"),
               PYTHONPATH=f"{ROOT}{os.pathsep}{env['PYTHONPATH']}")  # the transform is in the tests package
    run = subprocess.run(["airflow", "dags", "test", orders.config.name, datetime.now(timezone.utc).isoformat()],
                         env=env, capture_output=True, text=True, timeout=600, cwd=ROOT)
    assert run.returncode == 0, run.stdout[-4000:] + run.stderr[-4000:]
    assert "spark-submit" in run.stdout + run.stderr  # the job in its own process, the registry from its settings
    expected = orders.assert_exact()
    assert {row[0] for row in expected["latest"]} == {"bob", "cid"}  # ann's tombstone deleted her row
