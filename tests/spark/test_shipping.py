"""The job's code archive and the choice of how a job runs, without Spark: what the archive
holds, that the library reads its SQL from inside it (a driver with no checkout), and the
runner each Spark connection type selects."""

from __future__ import annotations

import json
import subprocess
import sys
import zipfile

import pytest

from exactly_once.errors import ConfigError
from exactly_once.kafka_client import KafkaClient
from exactly_once.spark.runners import ConnectRunner, SubmitRunner, job_runner
from exactly_once.spark.settings import JobSettings
from exactly_once.spark.shipping import code_archive
from exactly_once_demo.pipeline import config

UDF_VARIANT = config(transform="exactly_once_demo.pipeline:prepare_with_udf")


def test_the_archive_holds_the_library_its_sql_and_the_transforms_package_and_is_named_by_its_content():
    archive = code_archive(UDF_VARIANT)
    names = zipfile.ZipFile(archive).namelist()
    assert {"exactly_once/__init__.py", "exactly_once/spark/job.py", "exactly_once/sql/ledger.sql",
            "exactly_once/sql/merge/keyed.sql", "exactly_once_demo/udfs.py", "exactly_once_demo/pipeline.py"} \
        <= set(names)
    assert not [n for n in names if "__pycache__" in n or n.endswith(".pyc")]
    assert code_archive(UDF_VARIANT) == archive  # the same content: the same file


def test_a_driver_without_the_checkout_reads_the_sql_from_the_archive(tmp_path):
    archive = code_archive(UDF_VARIANT)
    read = subprocess.run(
        [sys.executable, "-c", "import exactly_once.sqlfiles as f; print(f.SQL_DIR); "
                               "print(len(f.named('ledger.sql')), len(f.named('merge/keyed.sql')))"],
        env={"PYTHONPATH": str(archive), "PATH": "/usr/bin:/bin"}, cwd=tmp_path, capture_output=True, text=True)
    assert read.returncode == 0, read.stderr
    where, counts = read.stdout.splitlines()
    assert str(archive) in where
    assert all(int(n) > 0 for n in counts.split())


@pytest.mark.parametrize("connection, runner", [
    ({"conn_type": "spark", "host": "local[2]"}, SubmitRunner),
    ({"conn_type": "spark", "host": "spark://127.0.0.1", "port": 7077}, SubmitRunner),
    ({"conn_type": "spark_connect", "host": "127.0.0.1", "port": 15002}, ConnectRunner),
])
def test_the_connections_type_chooses_how_the_job_runs(connection, runner, monkeypatch):
    monkeypatch.setenv("AIRFLOW_CONN_SPARK_TRIAL", json.dumps(connection))
    settings = JobSettings("postgresql://localhost/x", KafkaClient.at("localhost:9092"))
    assert type(job_runner("spark_trial", "trial", UDF_VARIANT, settings)) is runner


def test_cluster_deploy_mode_is_refused_naming_the_connection(monkeypatch):
    monkeypatch.setenv("AIRFLOW_CONN_SPARK_TRIAL", json.dumps(
        {"conn_type": "spark", "host": "yarn", "extra": {"deploy-mode": "cluster"}}))
    settings = JobSettings("postgresql://localhost/x", KafkaClient.at("localhost:9092"))
    with pytest.raises(ConfigError, match="connection 'spark_trial': deploy-mode 'cluster'"):
        job_runner("spark_trial", "trial", UDF_VARIANT, settings)
