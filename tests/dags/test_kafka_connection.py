"""The pipeline reaches Kafka through the Airflow connection kafka_default, which the local
stack points at the broker's SASL/PLAIN listener: the planner (confluent-kafka) and Spark's
Kafka source both log in with it. A wrong password fails the run at its first task, naming
the connection, before any checkpoint is planned; the job's command line never holds it.
The successful run's lineage (OpenLineage) is checked too: one demo run for both."""

from __future__ import annotations

import json
import tempfile
import threading
import time
from datetime import datetime, timezone
from pathlib import Path

import pytest
from confluent_kafka import KafkaException
from confluent_kafka.admin import AdminClient

from exactly_once_demo.oracle import attempts, checkpoints
from exactly_once_demo.produce import produce
from exactly_once_stack.settings import environment, passwords
from tests.dags.test_orders_exactly_once import dags_test
from tests.exactly_once_demo.oracle import assert_tables_equal_the_oracle


def test_the_demo_commits_exactly_once_over_sasl_and_a_wrong_password_fails_naming_the_connection(
        fresh_demo, kafka_servers, tmp_path):
    connection = json.loads(environment()["AIRFLOW_CONN_KAFKA_DEFAULT"])
    login = connection["extra"]
    assert login["security.protocol"] == "SASL_PLAINTEXT" and login["sasl.mechanism"] == "PLAIN"
    with pytest.raises(KafkaException):  # the listener kafka_default names takes no client without the login
        AdminClient({"bootstrap.servers": login["bootstrap.servers"]}).list_topics(timeout=5)

    produce(kafka_servers, 500)
    time.sleep(0.01)
    end = datetime.now(timezone.utc)
    refused = dags_test(end, AIRFLOW_CONN_KAFKA_DEFAULT=json.dumps(
        {**connection, "extra": {**login, "sasl.password": "not-" + login["sasl.password"]}}))
    said = refused.stdout + refused.stderr
    assert refused.returncode != 0
    assert "connection 'kafka_default': the Kafka brokers" in said and "Authentication failed" in said, said[-4000:]
    assert checkpoints(fresh_demo) == [] and attempts(fresh_demo) == 0  # refused before planning

    settings_files = set(Path(tempfile.gettempdir()).glob("exactly_once-job-*.json"))  # left by killed tasks
    events = tmp_path / "openlineage.jsonl"
    with CommandLines("jobs/increment.py") as job:
        run = dags_test(end, AIRFLOW__OPENLINEAGE__TRANSPORT=json.dumps(
            {"type": "file", "log_file_path": str(events), "append": True}))
    assert run.returncode == 0, (run.stdout + run.stderr)[-4000:]
    assert_tables_equal_the_oracle(fresh_demo, kafka_servers)
    assert [state for _, _, state, _ in checkpoints(fresh_demo)] == ["committed"]
    # The job got its connections in a file, now removed, never on its command line. (The
    # run's log cannot tell: Airflow masks every connection's password in task logs.)
    assert job.seen and all("--settings" in line and login["sasl.password"] not in line for line in job.seen)
    assert set(Path(tempfile.gettempdir()).glob("exactly_once-job-*.json")) == settings_files
    assert_the_lineage_of_the_run(events, checkpoints(fresh_demo)[0][1])


def assert_the_lineage_of_the_run(events: Path, run_id: str) -> None:
    """The run's increment task reported (OpenLineage, the provider's listener, file transport)
    the topic in and the sink tables and the dead letters out, in OpenLineage's naming."""
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


class CommandLines:
    """The command lines of the processes running `program` while the block runs, sampled
    every 0.1 s from /proc."""

    def __init__(self, program: str):
        self.program, self.seen, self._done = program, set(), threading.Event()
        self._sampler = threading.Thread(target=self._sample, daemon=True)

    def _sample(self) -> None:
        while not self._done.wait(0.1):
            for cmdline in Path("/proc").glob("[0-9]*/cmdline"):
                try:
                    line = cmdline.read_bytes().replace(b"\0", b" ").decode(errors="replace")
                except OSError:  # the process ended
                    continue
                if self.program in line:
                    self.seen.add(line)

    def __enter__(self) -> CommandLines:
        self._sampler.start()
        return self

    def __exit__(self, *exc) -> None:
        self._done.set()
        self._sampler.join()
