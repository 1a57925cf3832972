"""Airflow: every DAG file imports cleanly; a DAG runs through `airflow dags test`
against the PostgreSQL metadata database."""

import socket
import subprocess
from contextlib import closing

import psycopg2
from stack.settings import ROOT, db_url


def test_every_dag_file_imports_without_errors_or_network_io(stack_env, monkeypatch):
    from airflow.dag_processing.dagbag import DagBag

    def refuse(self, address):
        raise AssertionError(f"DAG files must not open connections at parse time (to {address})")

    monkeypatch.setattr(socket.socket, "connect", refuse)
    bag = DagBag(dag_folder=str(ROOT / "dags"))
    assert bag.import_errors == {}
    assert {p.name for p in (ROOT / "dags").glob("*.py")} == {d.fileloc.rsplit("/", 1)[1] for d in bag.dags.values()}


def test_smoke_dag_runs_end_to_end_with_dags_test(stack_env):
    run = subprocess.run(["airflow", "dags", "test", "stack_smoke"], env=stack_env, cwd=ROOT,
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
