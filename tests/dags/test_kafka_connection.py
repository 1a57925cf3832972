"""The pipeline reaches Kafka through the Airflow connection kafka_default, which the local
stack points at the broker's SASL_SSL listener (SCRAM-SHA-512, a certificate of the stack's
private CA, `ssl.ca.location`): the planner (confluent-kafka) and Spark's Kafka source both
log in with it and verify the broker. Mutual TLS (the SSL listener, which requires a client
certificate) with the material inline in the connection, over Spark Connect and on
spark-submit: variants (`./dev test -m variant`), as is Spark Connect over the stack's
SASL_SSL connection (tests/dags/test_spark_clusters.py); CI runs Connect in
tests/spark/test_connect_isolation.py (plaintext Kafka), and tests/shared/test_kafka_client.py
turns inline PEM into Spark's settings. The job's processes (command lines and environments, sampled from /proc while they
run) and the run's logs — Airflow's masking of connection fields turned off, and the Kafka
clients logging their config at INFO — hold no password, key or key password.
The successful SASL_SSL run's lineage (OpenLineage) is checked too."""

from __future__ import annotations

import json
import os
import tempfile
import threading
import time
from datetime import datetime, timezone
from pathlib import Path

import pytest

from exactly_once_demo.oracle import checkpoints
from exactly_once_demo.produce import produce
from exactly_once_stack import spark_cluster
from exactly_once_stack.settings import SPARK_CONF_DIR, TLS, environment, passwords, ports, spark_connection
from tests.dags.test_orders_exactly_once import dags_test
from tests.exactly_once_demo.oracle import assert_tables_equal_the_oracle

# The processes of a job: spark-submit's JVM and the Python driver (the launcher, launch-increment-HASH.py), a
# Spark Connect client's process (exactly_once.spark.job), the Python workers Spark forks, a
# Spark Connect server.
JOB_PROCESSES = ("launch-increment-", "exactly_once.spark.job", "pyspark.daemon", "pyspark/daemon",
                 "SparkConnectServer")


def test_the_demo_commits_exactly_once_over_sasl_ssl_with_the_stacks_private_ca(fresh_demo, kafka_servers, tmp_path):
    login = json.loads(environment()["AIRFLOW_CONN_KAFKA_DEFAULT"])["extra"]
    assert (login["security.protocol"], login["sasl.mechanism"]) == ("SASL_SSL", "SCRAM-SHA-512")
    assert login["ssl.ca.location"] == str(TLS.ca)
    events = tmp_path / "openlineage.jsonl"
    run, seen = run_the_demo(kafka_servers, tmp_path, AIRFLOW__OPENLINEAGE__TRANSPORT=json.dumps(
        {"type": "file", "log_file_path": str(events), "append": True}))
    assert_committed_exactly_once(fresh_demo, kafka_servers)
    assert_no_secret_in(seen, run, [login["sasl.password"], passwords()["pipeline"]])
    assert "sasl.jaas.config = [hidden]" in run  # the Java client logged its config, the login hidden
    assert "ssl.truststore.certificates = [hidden]" in run
    assert_the_lineage_of_the_run(events, checkpoints(fresh_demo)[0][1])


@pytest.fixture(scope="module")
def connect_server(stack_env):
    """The stack's Spark Connect server, started if it was not running (and then stopped)."""
    started = spark_cluster.start("connect")
    yield [service.log for service in spark_cluster.services("connect")]
    spark_cluster.stop_named(started)


@pytest.mark.variant
@pytest.mark.parametrize("runner", ["spark-submit", "connect"])
def test_the_demo_commits_exactly_once_over_mutual_tls_with_the_material_inline(runner, request, fresh_demo,
                                                                                  kafka_servers, tmp_path):
    """The connection holds the PEM itself (a secrets backend's usual form): the client's key
    reaches Spark's Kafka source through the settings file (spark-submit) or inside the plan
    the task sends the Connect server, which opens the Kafka connections."""
    key = TLS.client_key.read_text()
    mutual = {"conn_type": "kafka", "extra": {
        "bootstrap.servers": f"127.0.0.1:{ports()['kafka_ssl']}", "security.protocol": "SSL",
        "ssl.ca.pem": TLS.ca.read_text(), "ssl.certificate.pem": TLS.client_certificate.read_text(),
        "ssl.key.pem": key}}
    spark, server_logs = {}, []
    if runner == "connect":
        server_logs = request.getfixturevalue("connect_server")
        spark = {"AIRFLOW_CONN_SPARK_DEFAULT": json.dumps(spark_connection("connect"))}
    run, seen = run_the_demo(kafka_servers, tmp_path, AIRFLOW_CONN_KAFKA_DEFAULT=json.dumps(mutual), **spark)
    assert_committed_exactly_once(fresh_demo, kafka_servers)
    key_body = "".join(key.splitlines()[1:-1])
    logs = run + "".join(log.read_text(errors="replace") for log in server_logs)
    assert_no_secret_in(seen, logs, [key_body, "PRIVATE KEY", passwords()["pipeline"]])
    if runner == "connect":
        assert any("SparkConnectServer" in line for line, _ in seen)  # the server's processes were sampled
    else:
        assert "ssl.keystore.key = [hidden]" in run


def run_the_demo(kafka_servers: str, tmp_path: Path, **env) -> tuple[str, list[tuple[str, str]]]:
    """One demo run over 500 fresh orders, Spark and the Kafka clients logging at INFO and
    Airflow masking nothing; its output, and the job's processes seen while it ran."""
    produce(kafka_servers, 500)
    time.sleep(0.01)
    end = datetime.now(timezone.utc)
    verbose = tmp_path / "spark-conf"
    verbose.mkdir()
    (verbose / "spark-defaults.conf").write_text((SPARK_CONF_DIR / "spark-defaults.conf").read_text())
    (verbose / "log4j2.properties").write_text(
        (SPARK_CONF_DIR / "log4j2.properties").read_text().replace("rootLogger.level = warn", "rootLogger.level = info"))
    settings_files = set(Path(tempfile.gettempdir()).glob("exactly_once-job-*.json"))  # left by killed tasks
    with Processes(JOB_PROCESSES) as job:
        run = dags_test(end, SPARK_CONF_DIR=str(verbose), AIRFLOW__CORE__HIDE_SENSITIVE_VAR_CONN_FIELDS="False",
                        **env)
    said = run.stdout + run.stderr
    assert run.returncode == 0, said[-4000:]
    assert set(Path(tempfile.gettempdir()).glob("exactly_once-job-*.json")) == settings_files
    assert job.seen, "no process of the job was seen"
    return said, sorted(job.seen)


def assert_committed_exactly_once(db_url: str, kafka_servers: str) -> None:
    assert_tables_equal_the_oracle(db_url, kafka_servers)
    assert [state for _, _, state, _ in checkpoints(db_url)] == ["committed"]


def assert_no_secret_in(processes: list[tuple[str, str]], logs: str, secrets: list[str]) -> None:
    """No secret in the job's command lines and environments, nor in the run's logs."""
    assert all(secrets)
    for cmdline, environ in processes:
        assert "--settings" in cmdline or "launch-increment-" not in cmdline
        leaked = [s[:4] + "…" for s in secrets if s in cmdline or s in environ]
        assert not leaked, f"{leaked} in the process {cmdline[:200]}"
    assert not [s[:4] + "…" for s in secrets if s in logs]


def assert_the_lineage_of_the_run(events: Path, run_id: str) -> None:
    """The run's increment task reported (OpenLineage, the provider's listener, file transport)
    the topic in and the sink tables, the dead letters and the kafka sink's topic out, in
    OpenLineage's naming."""
    [increment] = [e for e in map(json.loads, events.read_text().splitlines())
                   if e["job"]["name"] == "orders_exactly_once.increment" and e["eventType"] == "COMPLETE"]
    assert increment["run"]["facets"]["airflow"]["dagRun"]["run_id"] == run_id
    env = environment()
    kafka = json.loads(env["AIRFLOW_CONN_KAFKA_DEFAULT"])["extra"]["bootstrap.servers"]
    db = json.loads(env["AIRFLOW_CONN_PIPELINE_DB"])
    assert [(d["namespace"], d["name"]) for d in increment["inputs"]] == [(f"kafka://{kafka}", "orders")]
    assert [(d["namespace"], d["name"]) for d in increment["outputs"]] == [
        *((f"postgres://{db['host']}:{db['port']}", f"pipeline.{table}")
          for table in ("demo.orders", "demo.sku_minute_totals", "demo.sku_last_price", "exactly_once.dead_letters")),
        (f"kafka://{kafka}", "sku_minute_deltas")]  # the kafka sink's topic
    written = events.read_text()
    assert passwords()["kafka_pipeline"] not in written and passwords()["pipeline"] not in written


class Processes:
    """The command lines and environments of the processes whose command line holds one of
    `programs`, sampled every 0.1 s from /proc while the block runs."""

    def __init__(self, programs: tuple[str, ...]):
        self.programs, self.seen, self._done = programs, set(), threading.Event()
        self._sampler = threading.Thread(target=self._sample, daemon=True)

    def _sample(self) -> None:
        while not self._done.wait(0.1):
            for process in Path("/proc").glob("[0-9]*"):
                try:
                    line = (process / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
                    if any(program in line for program in self.programs) and process.name != str(os.getpid()):
                        environ = (process / "environ").read_bytes().replace(b"\0", b"\n").decode(errors="replace")
                        self.seen.add((line, environ))
                except OSError:  # the process ended
                    continue

    def start(self) -> Processes:
        self._sampler.start()
        return self

    def stop(self) -> None:
        self._done.set()
        self._sampler.join()

    def __enter__(self) -> Processes:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()
