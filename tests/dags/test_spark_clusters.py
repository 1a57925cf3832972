"""The demo DAG beyond local[2], through `airflow dags test` on real processes: a standalone
master with two workers, and a Spark Connect server (exactly_once_stack.spark_cluster),
each with the demo's UDF variant, whose Python code executors import only from the code
archive the job ships, and with one fault of the mode mid-job. The tables equal the
oracle, to the row. The Connect run is a variant (./dev test -m variant): CI runs Spark
Connect in tests/spark/test_connect_isolation.py. The other cluster faults: ./dev faults
--scenarios p q r s."""

from __future__ import annotations

import json
import os
import signal
import subprocess
from contextlib import closing
from datetime import datetime, timezone

import psycopg2
import pytest

from exactly_once_demo.produce import produce
from exactly_once_stack import spark_cluster
from exactly_once_stack.settings import ROOT, passwords, process_environment, spark_connection
from tests.dags.test_kafka_connection import JOB_PROCESSES, Processes, assert_no_secret_in
from tests.exactly_once_demo.oracle import assert_tables_equal_the_oracle
from tests.faults.world import UDF_TRANSFORM, wait_for

# Heavy (./dev test -m heavy), as every cluster fault is: CI runs the job on local[2] and over
# Spark Connect (tests/spark/test_connect_isolation.py).
pytestmark = pytest.mark.heavy

DAG_FILE = f'''\
from datetime import timedelta

import pendulum
from airflow.sdk import DeltaDataIntervalTimetable, dag
from exactly_once.orchestration.checkpoint_tasks import checkpoint_tasks
from exactly_once_demo.pipeline import config


@dag(dag_id="orders_exactly_once", schedule=DeltaDataIntervalTimetable(timedelta(minutes=10)),
     start_date=pendulum.datetime(2026, 1, 1, tz="UTC"), catchup=False)
def orders_with_a_udf():  # the demo DAG, with the demo's UDF variant
    checkpoint_tasks(config(transform="{UDF_TRANSFORM}"))


DAG = orders_with_a_udf()
DAG.get_task("increment").retry_delay = timedelta(seconds=3)  # the test's retry need not wait 30 s
'''
POINT = "increment.before_write"  # the attempt's records are read and cached; nothing is staged yet


@pytest.fixture(scope="module")
def clusters(stack_env):
    """Starts a mode's services on first use (`clusters(mode)`); stops those it started at the end."""
    started = []

    def start(mode: str) -> str:
        started.extend(name for name in spark_cluster.start(mode) if name not in started)
        return mode
    yield start
    spark_cluster.stop_named(started)


def test_executors_cannot_import_the_transform_without_the_shipped_archive(clusters, tmp_path):
    """The control: the UDF variant's code fails on the standalone cluster's executors
    without the archive the job ships (with it, the test below commits)."""
    master = spark_connection(clusters("standalone"))
    probe = tmp_path / "probe.py"
    probe.write_text(PROBE)
    without = subprocess.run(["spark-submit", "--master", f"{master['host']}:{master['port']}", str(probe)],
                             env=process_environment(), capture_output=True, text=True, timeout=300)
    said = without.stdout + without.stderr
    assert "ModuleNotFoundError: No module named 'exactly_once_demo'" in said
    assert "An exception was thrown from the Python worker" in said  # on an executor, not the driver


@pytest.fixture(params=["standalone", pytest.param("connect", marks=pytest.mark.variant)])  # ./dev faults r too
def cluster(request, clusters) -> str:
    return clusters(request.param)


def test_the_udf_variant_on_the_cluster_equals_the_oracle_through_a_fault(cluster, clusters, fresh_demo, kafka_servers,
                                                                         tmp_path):
    (tmp_path / "dags").mkdir()
    (tmp_path / "dags" / "orders_udf.py").write_text(DAG_FILE)
    produce(kafka_servers, 1000)
    log = tmp_path / "dags-test.log"
    env = {**process_environment(), "AIRFLOW__CORE__DAGS_FOLDER": str(tmp_path / "dags"),
           "AIRFLOW_CONN_SPARK_DEFAULT": json.dumps(spark_connection(cluster)),
           "EXACTLY_ONCE_FAULTS": f"{POINT}=sleep:3"}
    job = Processes((*JOB_PROCESSES, "CoarseGrainedExecutorBackend")).start()  # sampled until the run ends
    with open(log, "wb") as out:
        run = subprocess.Popen(["airflow", "dags", "test", "orders_exactly_once",
                                datetime.now(timezone.utc).isoformat()], env=env, cwd=ROOT, stdout=out,
                               stderr=subprocess.STDOUT, start_new_session=True)
    try:
        assert wait_for(log, f"fault injected at {POINT}", run), log.read_text()[-4000:]
        if cluster == "standalone":  # a worker and its executor killed: Spark recomputes their part
            killed = spark_cluster.kill_a_worker()
        else:  # the server restarted: the attempt fails, a retry commits on the new server
            spark_cluster.stop("connect")
            spark_cluster.start("connect")
        assert run.wait(600) == 0, log.read_text()[-6000:]
    finally:
        job.stop()
        if run.poll() is None:  # with its spark-submit: it would hold the cluster's cores
            os.killpg(run.pid, signal.SIGKILL)
        clusters(cluster)  # the killed worker again

    assert_tables_equal_the_oracle(fresh_demo, kafka_servers)
    output = log.read_text(errors="replace")
    if cluster == "standalone":
        assert killed and "Lost executor" in output
        assert f"--master {spark_connection(cluster)['host']}:" in output and "--py-files" in output
        assert [state for state, _ in attempts(fresh_demo)][-1] == "committed"
    else:
        assert "of type 'spark_connect'" in output and "NO_ACTIVE_SESSION" in output
        assert [state for state, _ in attempts(fresh_demo)] == ["aborted", "committed"]
    assert {transform for _, transform in attempts(fresh_demo)} == {UDF_TRANSFORM}
    # The job's processes on the cluster (a standalone executor, the Connect server) hold no
    # password: the Kafka client's TLS and SASL settings reached them inside the plan.
    assert any(program in line for line, _ in job.seen for program in ("CoarseGrainedExecutorBackend",
                                                                          "SparkConnectServer"))
    assert_no_secret_in(sorted(job.seen), output, [passwords()["kafka_pipeline"], passwords()["pipeline"]])


def attempts(db_url: str) -> list[tuple[str, str]]:
    """Each attempt of the demo pipeline: its state and the transform of the configuration it ran."""
    with closing(psycopg2.connect(db_url)) as conn, conn.cursor() as cur:
        cur.execute("SELECT a.state::text, v.config->>'transform' FROM exactly_once.attempts a "
                    "JOIN exactly_once.checkpoints c ON c.id = a.checkpoint_id "
                    "JOIN exactly_once.config_versions v ON v.pipeline = c.pipeline AND v.version = a.config_version "
                    "WHERE c.pipeline = 'orders' ORDER BY a.checkpoint_id, a.attempt")
        return cur.fetchall()


PROBE = '''\
from decimal import Decimal
from pyspark.sql import SparkSession

spark = SparkSession.builder.getOrCreate()
from exactly_once_demo.udfs import revenue  # the driver finds it beside Airflow; executors must not

[row] = spark.createDataFrame([(2, Decimal("1.50"))], "qty int, price decimal(12,2)") \\
    .select(revenue("qty", "price").alias("r")).collect()
print("revenue", row.r)
'''
