"""A pipeline's schema registry connection (`source.schema_registry`, an Airflow connection of
type http) against the local stack's real registry (Apicurio, HTTPS with a certificate of the
stack's CA, basic auth): the preflight asks it for its subjects over its TLS with its login.
A refused login, a CA that did not sign its certificate, a URL that is no registry API and a
setting the library does not know are problems no retry fixes, each naming the connection;
a registry that does not answer may pass by itself; `check` reports them per pipeline."""

from __future__ import annotations

import json

import pytest

from exactly_once.connections import schema_registry, schema_registry_problems
from exactly_once_stack import tls
from exactly_once_stack.settings import SCHEMA_REGISTRY_API, TLS
from tests.ledger.harness import make_pipeline
from tests.operate.test_preflight import DAG_FILE, check_cli

REGISTRY = "schema_registry_default"


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
    assert schema_registry_problems(REGISTRY) == []
    assert isinstance(schema_registry(REGISTRY).get("/subjects"), list)
    assert connection["password"] not in repr(schema_registry(REGISTRY))


def test_a_wrong_password_is_a_problem_no_retry_fixes_and_the_password_is_never_shown(registry):
    url = registry(password="not-the-password")["extra"]["url"]
    [problem] = schema_registry_problems(REGISTRY)
    assert str(problem) == f"connection {REGISTRY!r}: the schema registry {url} refuses its login: HTTP 401 Unauthorized"
    assert not problem.passing
    registry(login=None, password=None)  # no login at all: the same refusal
    assert "refuses its login: HTTP 401" in str(schema_registry_problems(REGISTRY)[0])


def test_a_ca_that_did_not_sign_its_certificate_is_named_with_openssls_reason(registry, tmp_path):
    url = registry(extra={"ssl.ca.location": str(tls.make_ca(tmp_path, "another CA").ca)})["extra"]["url"]
    [problem] = schema_registry_problems(REGISTRY)
    assert str(problem) == (f"connection {REGISTRY!r}: the schema registry {url}'s certificate fails verification "
                            "with the connection's CA: self-signed certificate in certificate chain")
    assert not problem.passing
    registry(extra={"ssl.ca.location": None, "ssl.ca.pem": TLS.ca.read_text()})  # the CA inline works the same
    assert schema_registry_problems(REGISTRY) == []


def test_a_url_that_is_no_registry_api_and_an_unknown_setting_are_named(registry):
    root = registry()["extra"]["url"].removesuffix(SCHEMA_REGISTRY_API)
    registry(extra={"url": root})
    [no_api] = schema_registry_problems(REGISTRY)
    assert "no Confluent-compatible schema registry API at" in no_api.message and "/apis/ccompat/v7" in no_api.message
    registry(extra={"basic.auth.user.info": "pipeline:secret"})
    [unknown] = schema_registry_problems(REGISTRY)
    assert unknown.message.startswith("'basic.auth.user.info' is no schema registry setting this library knows")
    assert "secret" not in unknown.message
    registry(extra={"ssl.ca.location": "/no/such/ca.pem"})
    assert "ssl.ca.location '/no/such/ca.pem' cannot be read as a PEM file" in schema_registry_problems(REGISTRY)[0].message


def test_a_registry_that_does_not_answer_may_pass_by_itself(registry):
    registry(extra={"url": f"https://127.0.0.1:1{SCHEMA_REGISTRY_API}"})
    [problem] = schema_registry_problems(REGISTRY)
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
