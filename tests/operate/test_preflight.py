"""The preflight on real Kafka and PostgreSQL: each broken setup is reported naming what is at
fault, by `python -m exactly_once check` and by the first task of a run (`tasks.begin_checkpoint`,
the run path), which then plans nothing, so no Spark job can start; a configuration version
that passed is not checked again."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import uuid
from contextlib import closing
from pathlib import Path

import psycopg2
import pytest
from confluent_kafka import KafkaError, KafkaException

from exactly_once.config import PipelineConfig, load_config
from exactly_once.connections import connection_problems
from exactly_once.errors import is_retryable
from exactly_once.kafka_client import KafkaClient
from exactly_once.ledger.kafka_offsets import KafkaOffsets
from exactly_once.ledger.protocol import Ledger
from exactly_once.ledger.transactions import Transactions
from exactly_once.ledger.versions import config_version
from exactly_once.operate import preflight
from exactly_once.orchestration import tasks
from exactly_once.problems import PreflightFailed
from exactly_once_stack.settings import ROOT
from tests.ledger.harness import TRANSFORM, make_pipeline, pipeline_config

DAG_FILE = '''\
from airflow.sdk import dag
from exactly_once.orchestration.checkpoint_tasks import checkpoint_tasks
from exactly_once.config import load_config


@dag(dag_id="{name}", schedule=None)
def pipeline():
    checkpoint_tasks(load_config({config!r}))


pipeline()
'''


def execute(db_url: str, statement: str) -> list[tuple]:
    with closing(psycopg2.connect(db_url)) as conn, conn, conn.cursor() as cur:
        cur.execute(statement)
        return cur.fetchall() if cur.description else []


def first_task(db_url: str, servers: str, config: PipelineConfig) -> PreflightFailed | None:
    """The first task's work for one run; its PreflightFailed, or None once it began the checkpoint."""
    with KafkaOffsets(KafkaClient.at(servers)) as kafka:
        try:
            tasks.begin_checkpoint(Ledger(config, lambda: psycopg2.connect(db_url)), kafka, "run1", None, None)
        except PreflightFailed as failed:
            return failed
    return None


def checkpoints(db_url: str, config: PipelineConfig) -> int:
    return execute(db_url, f"SELECT count(*) FROM exactly_once.checkpoints WHERE pipeline = '{config.name}'")[0][0]


# Without a transform the value's fields are what the rows hold, so their types are checked too.
NO_TRANSFORM = {"transform": None, "sinks": [{"name": "events", "table": "{s}.events", "mode": "append"}]}

# (what breaks the harness's pipeline: config overrides, SQL on its schema {s}) -> what the report says
BROKEN = {
    "missing topic": ({"source": {"topics": ["no_such_topic"], "value_schema": {"id": "string", "k": "string",
                                                                              "n": "bigint"}}}, "",
                      ["source.topics: 'no_such_topic': Kafka topic 'no_such_topic' does not exist"]),
    "missing table": ({}, "DROP TABLE {s}.events",
                      ["sink 'events': table {s}.events: does not exist\n    fix: CREATE TABLE \"{s}\".\"events\" (\n"
                       "             \"id\" text NOT NULL,\n"]),
    "missing kafka_offset column": (
        {}, "ALTER TABLE {s}.events DROP COLUMN kafka_offset",
        ["sink 'events': table {s}.events: column kafka_offset: is missing: the append mode needs it\n"
         "    fix: ALTER TABLE \"{s}\".\"events\" ADD COLUMN \"kafka_offset\" bigint NOT NULL;",
         # its unique constraint went with it
         "sink 'events': table {s}.events: has no unique index or constraint on exactly "
         "['kafka_offset', 'kafka_partition', 'kafka_topic'], which the append mode merges on"]),
    "a value's field of the wrong type": (
        NO_TRANSFORM, "ALTER TABLE {s}.events ALTER COLUMN n TYPE date USING NULL",
        ["sink 'events': table {s}.events: column n: is date and gets Spark bigint values: PostgreSQL says "
         "'column \"n\" is of type date but expression is of type bigint'\n"
         "    fix: ALTER TABLE \"{s}\".\"events\" ALTER COLUMN \"n\" TYPE bigint USING \"n\"::bigint;"]),
    "an offset column too narrow": (
        {}, "ALTER TABLE {s}.latest ALTER COLUMN kafka_offset TYPE integer",
        ["sink 'latest': table {s}.latest: column kafka_offset: is integer, which cannot hold every Kafka value "
         "it gets (Spark bigint)\n    fix: ALTER TABLE \"{s}\".\"latest\" ALTER COLUMN \"kafka_offset\" TYPE bigint "
         "USING \"kafka_offset\"::bigint;"]),
    "no unique key for upsert": (
        {}, "ALTER TABLE {s}.latest DROP CONSTRAINT latest_pkey",
        ["sink 'latest': table {s}.latest: has no unique index or constraint on exactly ['k'], which the upsert "
         "mode merges on\n    fix: ALTER TABLE \"{s}\".\"latest\" ADD UNIQUE (\"k\");"]),
    "a column no record fills": (
        NO_TRANSFORM, "ALTER TABLE {s}.events ADD COLUMN region text",
        ["sink 'events': table {s}.events: column region: takes its value from no field of source.key_schema or "
         "source.value_schema and is none of the library's ['kafka_offset', 'kafka_partition', 'kafka_timestamp', 'kafka_topic']"]),
    "a column named like one the ledger adds": (
        {}, "ALTER TABLE {s}.events ADD COLUMN attempt integer",
        ["sink 'events': table {s}.events: column attempt: has the name of a column the ledger adds to the sink's "
         "staging table (checkpoint_id, attempt, writer_task): rename it"]),
    "a foreign key to a sink listed after": (
        {}, "ALTER TABLE {s}.events ADD FOREIGN KEY (k) REFERENCES {s}.latest (k)",
        ["sink 'events': table {s}.events: has a foreign key to the table of sink 'latest', which is listed after "
         "it: list 'latest' first"]),
    "transform import error": ({"transform": "tests.no_such_module:prepare"}, "",
                               ["transform 'tests.no_such_module:prepare': module 'tests.no_such_module' does "
                                "not import: ModuleNotFoundError: No module named 'tests.no_such_module'"]),
    "transform missing": ({"transform": "tests.spark.transforms:no_such_function"}, "",
                          ["transform 'tests.spark.transforms:no_such_function': module 'tests.spark.transforms' "
                           "has no function 'no_such_function'"]),
}


@pytest.mark.parametrize("case", BROKEN)
def test_a_broken_setup_is_reported_naming_it_and_its_first_task_plans_nothing(ledger_db, kafka_servers, topic,
                                                                                case):
    overrides, breaking, expected = BROKEN[case]
    config = make_pipeline(ledger_db, topic)
    # the overrides' tables are in the pipeline's schema {s}, named after it
    config = load_config(json.loads(json.dumps({**config.model_dump(mode="json"), **overrides})
                                    .replace("{s}", config.name)))
    if breaking:
        execute(ledger_db, breaking.format(s=config.name))
    expected = [line.format(s=config.name) for line in expected]

    with KafkaOffsets(KafkaClient.at(kafka_servers)) as kafka:
        problems = preflight.check(config, kafka, lambda: psycopg2.connect(ledger_db))
    assert len(problems) == len(expected), problems
    for problem, line in zip(problems, expected):
        assert str(problem).startswith(line)

    failed = first_task(ledger_db, kafka_servers, config)
    assert failed is not None and failed.problems == problems
    assert str(failed).startswith(f"pipeline {config.name!r}: {len(problems)} problem(s) found before any Spark job")
    assert checkpoints(ledger_db, config) == 0  # nothing planned: no Spark job can start


def test_every_problem_is_listed_at_once_and_fixing_them_lets_the_run_begin(ledger_db, kafka_servers, topic):
    config = make_pipeline(ledger_db, topic, transform="tests.no_such_module:prepare")
    execute(ledger_db, f"DROP TABLE {config.name}.totals; "
                       f"ALTER TABLE {config.name}.latest DROP CONSTRAINT latest_pkey")
    failed = first_task(ledger_db, kafka_servers, config)
    assert [p.subject for p in failed.problems] == [
        "transform 'tests.no_such_module:prepare'", f"sink 'latest': table {config.name}.latest",
        f"sink 'totals': table {config.name}.totals"]
    # The suggested DDL is the fix: with it (and a transform that imports) the run begins. Where
    # the transform decides a column's type the DDL says so.
    assert '    "smallest" text NOT NULL,  -- made by the transform: give it the transform\'s type' \
        in failed.problems[2].fix
    for problem in failed.problems[1:]:
        execute(ledger_db, problem.fix)
    fixed = load_config({**config.model_dump(mode="json"), "transform": TRANSFORM})
    assert first_task(ledger_db, kafka_servers, fixed) is None
    assert checkpoints(ledger_db, fixed) == 1


def test_the_transform_is_imported_once_per_version_and_tables_are_checked_on_every_run(
        ledger_db, kafka_servers, topic, tmp_path, monkeypatch):
    module = f"transform_{uuid.uuid4().hex[:8]}"
    (tmp_path / f"{module}.py").write_text("def prepare(rows):\n    return rows\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    config = make_pipeline(ledger_db, topic, transform=f"{module}:prepare")
    transaction = Transactions(lambda: psycopg2.connect(ledger_db)).transaction
    with KafkaOffsets(KafkaClient.at(kafka_servers)) as kafka:
        assert preflight.require(config, kafka, transaction) is True
        assert preflight.require(config, kafka, transaction) is False  # imported before, for this version

        execute(ledger_db, f"ALTER TABLE {config.name}.latest ALTER COLUMN kafka_offset TYPE integer")
        with pytest.raises(PreflightFailed, match=r"column kafka_offset: is integer") as narrowed:
            preflight.require(config, kafka, transaction)  # a table changed after a pass is still found
        assert narrowed.value.retryable is False
        execute(ledger_db, f"ALTER TABLE {config.name}.latest ALTER COLUMN kafka_offset TYPE bigint")

        version = config_version(config)
        (tmp_path / f"{module}.py").write_text("def prepare(rows):\n    return rows.limit(1)\n")
        assert config_version(config) != version  # the transform's code is part of the version
        assert preflight.require(config, kafka, transaction) is True


def test_a_broker_that_does_not_answer_is_a_problem_a_retry_may_pass(ledger_db, topic):
    config = make_pipeline(ledger_db, topic)
    with KafkaOffsets(KafkaClient.at("127.0.0.1:1"), timeout=2) as nowhere, \
            pytest.raises(PreflightFailed, match=rf"- Kafka: no answer about topic {topic!r}: ") as failed:
        preflight.require(config, nowhere, Transactions(lambda: psycopg2.connect(ledger_db)).transaction)
    assert failed.value.retryable is True and is_retryable(failed.value)


def test_connections_are_checked_naming_them_and_the_password_never_shown(ledger_db, monkeypatch):
    settings = json.loads(os.environ["AIRFLOW_CONN_PIPELINE_DB"])
    monkeypatch.setenv("AIRFLOW_CONN_PIPELINE_DB", json.dumps({**settings, "password": "wrong-secret"}))
    monkeypatch.delenv("AIRFLOW_CONN_SPARK_DEFAULT")
    problems = connection_problems()
    assert str(problems[0]) == ("connection 'spark_default': is not defined (Admin → Connections in the UI, or "
                                "AIRFLOW_CONN_SPARK_DEFAULT)")
    assert str(problems[1]).startswith("connection 'pipeline_db': the pipeline database refuses it: ")
    assert 'password authentication failed for user "pipeline"' in str(problems[1])
    assert len(problems) == 2 and "wrong-secret" not in str(problems[1])
    assert not any(p.passing for p in problems) and not PreflightFailed("p", problems).retryable

    monkeypatch.setenv("AIRFLOW_CONN_PIPELINE_DB", json.dumps({**settings, "port": 1}))  # nothing listens there
    [unanswered] = connection_problems(("pipeline_db",))
    assert "Connection refused" in unanswered.message and unanswered.passing


def check_cli(target: Path | str, *, without: str | None = None, **env) -> subprocess.CompletedProcess:
    environment = {name: value for name, value in {**os.environ, **env}.items() if name != without}
    return subprocess.run([sys.executable, "-m", "exactly_once", "check", str(target)], capture_output=True,
                          text=True, timeout=120, env=environment, cwd=ROOT)


def airflow_cli(*arguments: str) -> None:
    subprocess.run(["airflow", *arguments], check=True, capture_output=True, timeout=120, cwd=ROOT)


@pytest.mark.heavy  # CI: the same checks in process above, and the first task's report in Airflow below
def test_the_check_command_lists_every_problem_with_exit_status_1(ledger_db, topic, tmp_path):
    config = make_pipeline(ledger_db, topic)
    dag_file = tmp_path / "broken.py"
    dag_file.write_text(DAG_FILE.format(name=config.name, config=config.model_dump(mode="json")))
    assert check_cli(dag_file).stdout == f"pipeline {config.name!r}: ready\n"
    # A connection defined in Airflow's metadata database (the UI's Admin → Connections) resolves too.
    airflow_cli("connections", "add", "spark_default", "--conn-type", "spark", "--conn-host", "local[2]")
    try:
        from_metastore = check_cli(dag_file, without="AIRFLOW_CONN_SPARK_DEFAULT")
    finally:
        airflow_cli("connections", "delete", "spark_default")
    assert from_metastore.stdout == f"pipeline {config.name!r}: ready\n", from_metastore.stderr
    # A pipeline by name: the configuration it last registered.
    assert check_cli(config.name).stdout == (f"pipeline {config.name!r}: 1 problem(s) found before any Spark job\n"
                                             f"- pipeline {config.name!r}: is not registered in the ledger (it "
                                             "never ran): give its DAG file\n")
    Ledger(config, lambda: psycopg2.connect(ledger_db)).register()
    assert check_cli(config.name).stdout == f"pipeline {config.name!r}: ready\n"

    execute(ledger_db, f"ALTER TABLE {config.name}.events DROP COLUMN kafka_offset")
    settings = json.loads(os.environ["AIRFLOW_CONN_PIPELINE_DB"])
    broken = check_cli(dag_file, AIRFLOW_CONN_PIPELINE_DB=json.dumps({**settings, "password": "wrong-secret"}))
    assert broken.returncode == 1
    lines = broken.stdout.splitlines()
    assert lines[0] == f"pipeline {config.name!r}: 1 problem(s) found before any Spark job"
    assert lines[1].startswith("- connection 'pipeline_db': the pipeline database refuses it: ")
    assert "wrong-secret" not in broken.stdout + broken.stderr

    found = check_cli(dag_file)
    assert found.returncode == 1, found.stderr
    assert found.stdout.splitlines()[:3] == [
        f"pipeline {config.name!r}: 2 problem(s) found before any Spark job",
        f"- sink 'events': table {config.name}.events: column kafka_offset: is missing: the append mode needs it",
        f'    fix: ALTER TABLE "{config.name}"."events" ADD COLUMN "kafka_offset" bigint NOT NULL;']

    dag_file.write_text(dag_file.read_text().replace("'bigint'", "'bigint, x string'"))
    unloadable = check_cli(dag_file)
    assert unloadable.returncode == 1
    assert unloadable.stdout.startswith(f"DAG file {dag_file}: 1 problem(s) found before any Spark job\n"
                                        f"- DAG file {dag_file}: does not import: exactly_once.errors.ConfigError: ")
    assert f"pipeline config {config.name!r}: source.value_schema.n: " in unloadable.stdout


def test_in_airflow_the_first_task_fails_the_run_with_the_report_and_no_spark_job_starts(ledger_db, topic,
                                                                                      tmp_path):
    config = make_pipeline(ledger_db, topic, transform="tests.no_such_module:prepare")
    execute(ledger_db, f"DROP TABLE {config.name}.events")
    (tmp_path / "broken.py").write_text(DAG_FILE.format(name=config.name, config=config.model_dump(mode="json")))
    run = subprocess.run(["airflow", "dags", "test", config.name], capture_output=True, text=True, timeout=300,
                         env={**os.environ, "AIRFLOW__CORE__DAGS_FOLDER": str(tmp_path)}, cwd=ROOT)
    log = run.stdout + run.stderr
    assert run.returncode != 0, log[-4000:]
    assert (f"AirflowFailException: pipeline {config.name!r}: 2 problem(s) found before any Spark job\n"
            f"- transform 'tests.no_such_module:prepare': module 'tests.no_such_module' does not import: "
            "ModuleNotFoundError") in log
    assert f"- sink 'events': table {config.name}.events: does not exist\n    fix: CREATE TABLE" in log
    assert checkpoints(ledger_db, config) == 0  # the increment task never had a checkpoint to run


def test_the_version_covers_every_module_of_the_shipped_transform_package(ledger_db, topic, tmp_path, monkeypatch):
    package = f"transforms_{uuid.uuid4().hex[:8]}"
    (tmp_path / package).mkdir()
    (tmp_path / package / "__init__.py").write_text("")
    (tmp_path / package / "prices.py").write_text("RATE = 1\n")
    (tmp_path / package / "shop.py").write_text("from . import prices\n\ndef prepare(rows):\n    return rows\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    config = make_pipeline(ledger_db, topic, transform=f"{package}.shop:prepare")

    version = config_version(config)
    (tmp_path / package / "prices.py").write_text("RATE = 2\n")  # a helper the job ships changes
    assert config_version(config) != version


class _Offsets:
    """Kafka's offsets as KafkaOffsets gives them, for a topic of 4 partitions: the question
    about all of them fails with `topic_error` (None: it is answered), one about partition 2
    alone with LEADER_NOT_AVAILABLE."""

    def __init__(self, topic_error: int | None):
        self.topic_error, self.asked_one_by_one = topic_error, []

    def partitions(self, topic: str) -> list[int]:
        return [0, 1, 2, 3]

    def topic_offsets(self, topic, interval_start, interval_end, start_time=None):
        if self.topic_error is not None:
            raise KafkaException(KafkaError(self.topic_error))

    def offsets(self, topic, partition, interval_start, interval_end, start_time=None):
        self.asked_one_by_one.append(partition)
        if partition == 2:
            raise KafkaException(KafkaError(KafkaError.LEADER_NOT_AVAILABLE))


def test_a_partition_whose_offsets_cannot_be_read_is_named_as_a_problem_a_retry_may_pass():
    config = pipeline_config("preflight_leaderless", "orders")
    answered = _Offsets(topic_error=None)
    assert preflight.topic_problems(config, answered) == [] and answered.asked_one_by_one == []

    leaderless = _Offsets(topic_error=KafkaError.LEADER_NOT_AVAILABLE)
    problems = preflight.topic_problems(config, leaderless)
    assert [(p.subject, p.passing) for p in problems] == [("source.topics: 'orders' partition 2", True)]
    assert problems[0].message.startswith("its offsets cannot be read: ")
    assert leaderless.asked_one_by_one == [0, 1, 2, 3]  # only once the topic's question at once failed

    unanswered = _Offsets(topic_error=KafkaError._TIMED_OUT)  # no broker answers: not asked again one by one
    problems = preflight.topic_problems(config, unanswered)
    assert [(p.subject, p.passing) for p in problems] == [("Kafka", True)] and unanswered.asked_one_by_one == []
