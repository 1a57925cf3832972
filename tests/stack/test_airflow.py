"""Airflow: every DAG file imports cleanly, dags/ holds only the product's DAGs; the local
stack's smoke DAG runs through `airflow dags test` against the PostgreSQL metadata
database, from a DAGs folder of its own."""

import socket
import subprocess
from contextlib import closing

import psycopg2
import pytest

from exactly_once_stack.settings import ROOT, db_url

SMOKE = ROOT / "exactly_once_stack" / "smoke"  # the local stack's check, a DAGs folder of its own


def dag_bag(folder, monkeypatch):
    from airflow.dag_processing.dagbag import DagBag

    def refuse(self, address):
        raise AssertionError(f"DAG files must not open connections at parse time (to {address})")

    monkeypatch.setattr(socket.socket, "connect", refuse)
    bag = DagBag(dag_folder=str(folder))
    assert bag.import_errors == {}
    return bag


def test_every_dag_file_imports_without_errors_or_network_io_and_declares_a_product_dag(stack_env, monkeypatch):
    bag = dag_bag(ROOT / "dags", monkeypatch)
    assert {p.name for p in (ROOT / "dags").glob("*.py")} == {d.fileloc.rsplit("/", 1)[1] for d in bag.dags.values()}
    assert "orders_exactly_once" in bag.dag_ids
    assert [d.dag_id for d in bag.dags.values() if "stack" in d.tags] == []  # checks of the local stack live apart


def test_the_smoke_dag_imports_without_errors_or_network_io_from_its_own_folder(stack_env, monkeypatch):
    bag = dag_bag(SMOKE, monkeypatch)
    assert {d.dag_id: d.fileloc for d in bag.dags.values()} == {"stack_smoke": str(SMOKE / "dag.py")}


@pytest.mark.heavy  # CI: the demo's DAG runs through `airflow dags test` (tests/dags/test_orders_exactly_once.py)
def test_smoke_dag_runs_end_to_end_with_dags_test(stack_env):
    run = subprocess.run(["airflow", "dags", "test", "stack_smoke"],
                         env={**stack_env, "AIRFLOW__CORE__DAGS_FOLDER": str(SMOKE)}, cwd=ROOT,
                         capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stdout[-4000:] + run.stderr[-4000:]
    with closing(psycopg2.connect(db_url("airflow"))) as conn, conn.cursor() as cur:
        cur.execute("SELECT run_id, state FROM dag_run WHERE dag_id = 'stack_smoke' ORDER BY id DESC LIMIT 1")
        run_id, state = cur.fetchone()
        assert state == "success"
        cur.execute("SELECT task_id, state FROM task_instance WHERE dag_id = 'stack_smoke' AND run_id = %s", (run_id,))
        assert dict(cur.fetchall()) == {"produce": "success", "count_in_spark": "success", "verify": "success"}
    with closing(psycopg2.connect(stack_env["PIPELINE_DB_URL"])) as conn, conn.cursor() as cur:
        cur.execute("SELECT records FROM stack_smoke_counts WHERE run_id = %s", (run_id,))
        assert cur.fetchall() == [(5,)]
