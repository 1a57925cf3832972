"""A pipeline's schema registry connection (`source.schema_registry`, an Airflow connection of
type http) against the local stack's real registry (Apicurio, HTTPS with a certificate of the
stack's CA, basic auth): the preflight asks it for its subjects over its TLS with its login.
A refused login, a CA that did not sign its certificate, a URL that is no registry API and a
setting the library does not know are problems no retry fixes, each naming the connection;
a registry that does not answer may pass by itself; `check` reports them per pipeline. An
Avro reader schema held by the registry must be there, give the pipeline's columns, and
read its subject's latest version."""

from __future__ import annotations

import json
import uuid

import pytest

from exactly_once import ddl
from exactly_once.config import Source, load_config
from exactly_once.connections import schema_registry, schema_registry_problems
from exactly_once_stack import tls
from exactly_once_stack.settings import SCHEMA_REGISTRY_API, TLS
from tests.ledger.harness import make_pipeline
from tests.operate.test_preflight import DAG_FILE, check_cli, execute

REGISTRY = "schema_registry_default"
SOURCE = Source.model_validate({"topics": ["t"], "schema_registry": REGISTRY, "value_schema": {"id": "string"}})


@pytest.fixture
def registry(stack_env, monkeypatch):
    """Sets schema_registry_default to the stack's connection changed by `changes` (to its
    extra, for the keys of the extra); returns the connection as set."""
    stack = json.loads(stack_env["AIRFLOW_CONN_SCHEMA_REGISTRY_DEFAULT"])

    def connection(**changes) -> dict:
        extra = {**stack["extra"], **changes.pop("extra", {})}
        changed = {**stack, **changes, "extra": {k: v for k, v in extra.items() if v is not None}}
        monkeypatch.setenv("AIRFLOW_CONN_SCHEMA_REGISTRY_DEFAULT", json.dumps(changed))
        return changed
    return connection


def test_the_stacks_registry_answers_over_its_tls_with_its_login(registry):
    connection = registry()
    assert schema_registry_problems(SOURCE) == []
    assert isinstance(schema_registry(REGISTRY).get("/subjects"), list)
    assert connection["password"] not in repr(schema_registry(REGISTRY))


def test_a_wrong_password_is_a_problem_no_retry_fixes_and_the_password_is_never_shown(registry):
    url = registry(password="not-the-password")["extra"]["url"]
    [problem] = schema_registry_problems(SOURCE)
    assert str(problem) == f"connection {REGISTRY!r}: the schema registry {url} refuses its login: HTTP 401 Unauthorized"
    assert not problem.passing
    registry(login=None, password=None)  # no login at all: the same refusal
    assert "refuses its login: HTTP 401" in str(schema_registry_problems(SOURCE)[0])


def test_a_ca_that_did_not_sign_its_certificate_is_named_with_openssls_reason(registry, tmp_path):
    url = registry(extra={"ssl.ca.location": str(tls.make_ca(tmp_path, "another CA").ca)})["extra"]["url"]
    [problem] = schema_registry_problems(SOURCE)
    assert str(problem) == (f"connection {REGISTRY!r}: the schema registry {url}'s certificate fails verification "
                            "with the connection's CA: self-signed certificate in certificate chain")
    assert not problem.passing
    registry(extra={"ssl.ca.location": None, "ssl.ca.pem": TLS.ca.read_text()})  # the CA inline works the same
    assert schema_registry_problems(SOURCE) == []


def test_a_url_that_is_no_registry_api_and_an_unknown_setting_are_named(registry):
    root = registry()["extra"]["url"].removesuffix(SCHEMA_REGISTRY_API)
    registry(extra={"url": root})
    [no_api] = schema_registry_problems(SOURCE)
    assert "no Confluent-compatible schema registry API at" in no_api.message and "/apis/ccompat/v7" in no_api.message
    registry(extra={"basic.auth.user.info": "pipeline:secret"})
    [unknown] = schema_registry_problems(SOURCE)
    assert unknown.message.startswith("'basic.auth.user.info' is no schema registry setting this library knows")
    assert "secret" not in unknown.message
    registry(extra={"ssl.ca.location": "/no/such/ca.pem"})
    assert "ssl.ca.location '/no/such/ca.pem' cannot be read as a PEM file" in schema_registry_problems(SOURCE)[0].message


def test_a_registry_that_does_not_answer_may_pass_by_itself(registry):
    registry(extra={"url": f"https://127.0.0.1:1{SCHEMA_REGISTRY_API}"})
    [problem] = schema_registry_problems(SOURCE)
    assert "does not answer: [Errno 111] Connection refused" in problem.message and problem.passing


def test_check_reports_a_pipelines_registry_with_its_other_problems(registry, ledger_db, topic, tmp_path):
    config = make_pipeline(ledger_db, topic, source={"topics": [topic], "schema_registry": REGISTRY,
                                                      "value_schema": {"id": "string", "k": "string", "n": "bigint"}})
    dag_file = tmp_path / "with_registry.py"
    dag_file.write_text(DAG_FILE.format(name=config.name, config=config.model_dump(mode="json")))
    connection = registry()
    assert check_cli(dag_file).stdout == f"pipeline {config.name!r}: ready\n"
    refused = check_cli(dag_file, AIRFLOW_CONN_SCHEMA_REGISTRY_DEFAULT=json.dumps({**connection, "password": "not-the-password"}))
    assert refused.returncode == 1
    assert refused.stdout.splitlines() == [
        f"pipeline {config.name!r}: 1 problem(s) found before any Spark job",
        f"- connection {REGISTRY!r}: the schema registry {connection['extra']['url']} refuses its login: HTTP 401 "
        "Unauthorized"]


def test_a_reader_schema_of_the_registry_must_exist_give_the_columns_and_read_the_latest_version(registry):
    from confluent_kafka.schema_registry import Schema

    from tests.spark.avro_orders import registry_client

    registry()
    client, subject = registry_client(), f"orders-{uuid.uuid4().hex[:8]}-value"
    order = {"type": "record", "name": "Order", "fields": [{"name": "id", "type": "string"},
                                                           {"name": "n", "type": "long"}]}
    client.register_schema(subject, Schema(json.dumps(order), "AVRO"))

    def problems(version: int, columns: dict) -> list[str]:
        source = Source.model_validate({"topics": ["t"], "schema_registry": REGISTRY, "value_format": "avro",
                                        "value_schema": columns,
                                        "value_reader_schema": {"subject": subject, "version": version}})
        return [str(p) for p in schema_registry_problems(source)]

    assert problems(1, {"id": "string", "n": "bigint"}) == []
    assert problems(2, {"id": "string"}) == [
        f"source.value_reader_schema: the schema registry ('{REGISTRY}') has no subject {subject!r} version 2 "
        "(source.value_reader_schema)"]
    assert problems(1, {"id": "string", "n": "int"}) == [
        "source.value_reader_schema: source.value_reader_schema does not give source.value_schema's columns: n: the "
        "Avro schema makes it bigint, the configuration says int"]
    # Version 2 drops n (BACKWARD allows it: v2 reads v1's records); v1, without a default for n,
    # cannot read v2's.
    client.register_schema(subject, Schema(json.dumps({**order, "fields": order["fields"][:1]}), "AVRO"))
    assert problems(2, {"id": "string"}) == []
    [cannot] = problems(1, {"id": "string", "n": "bigint"})
    assert cannot.startswith(f"source.value_reader_schema: subject {subject!r} version 1 cannot read the subject's "
                             "latest version")


def test_the_guides_avro_pipeline_without_a_transform_passes_check_once_its_tables_exist(registry, ledger_db, topic,
                                                                                       tmp_path):
    """docs/guide/formats.md's configuration: an upsert keyed by the key's field, no transform."""
    from confluent_kafka.schema_registry import Schema

    from tests.spark.avro_orders import READER, registry_client

    registry()
    subject, name = f"{topic}-value", f"p{uuid.uuid4().hex[:10]}"
    registry_client().register_schema(subject, Schema(json.dumps(READER), "AVRO"))
    config = load_config({
        "name": name,
        "source": {"topics": [topic], "schema_registry": REGISTRY, "value_format": "avro",
                   "value_reader_schema": {"subject": subject, "version": 1},
                   "value_schema": {"id": "string", "n": "bigint", "note": "string"},
                   "key_format": "string", "key_schema": {"customer": "string"}, "tombstones": "delete"},
        "sinks": [{"name": "orders", "table": f"{name}.orders", "mode": "append"},
                  {"name": "latest", "table": f"{name}.latest", "mode": "upsert", "keys": ["customer"]}]})
    tables = [ddl.create_table(config, sink) for sink in config.sinks]
    assert all('"customer" text NOT NULL' in table and "made by the transform" not in table for table in tables)
    execute(ledger_db, f"CREATE SCHEMA {name};\n" + "\n".join(tables))
    dag_file = tmp_path / "guide_avro.py"
    dag_file.write_text(DAG_FILE.format(name=name, config=config.model_dump(mode="json")))
    ready = check_cli(dag_file)
    assert (ready.returncode, ready.stdout) == (0, f"pipeline {name!r}: ready\n"), ready.stdout + ready.stderr
