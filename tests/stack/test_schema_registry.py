"""The schema registry (Apicurio Registry, its Confluent-compatible API): HTTPS only, on 127.0.0.1,
with a certificate of the stack's CA; HTTP basic auth as schema_registry_default's user, whose
password is on no command line; BACKWARD compatibility; and confluent-kafka's SchemaRegistryClient,
configured from schema_registry_default as the tests' producers will be, registers an Avro schema."""

import json
import stat
import uuid

import psutil
import pytest
import requests

from exactly_once_stack import process, schema_registry, tls

CCOMPAT = schema_registry.CCOMPAT
ORDER = {"type": "record", "name": "Order", "namespace": "exactly_once.tests",
         "fields": [{"name": "id", "type": "long"}]}


@pytest.fixture(scope="module")
def connection(stack_env) -> dict:
    """schema_registry_default, as Airflow and the tests' producers read it."""
    return json.loads(stack_env["AIRFLOW_CONN_SCHEMA_REGISTRY_DEFAULT"])


def url(connection: dict, path: str = "") -> str:
    """`path` on the registry's host (the connection's url is the Confluent API's root)."""
    return connection["extra"]["url"].removesuffix(CCOMPAT) + path


def login(connection: dict) -> tuple[str, str]:
    return connection["login"], connection["password"]


def test_it_serves_https_only_on_loopback_with_a_certificate_of_the_stack_ca(connection):
    answer = requests.get(url(connection, f"{CCOMPAT}/config"), auth=login(connection),
                          verify=connection["extra"]["ssl.ca.location"], timeout=10)
    assert (answer.status_code, answer.json()) == (200, {"compatibilityLevel": "BACKWARD"})

    # One listener, the HTTPS one on 127.0.0.1 (Java shows it as IPv4-mapped): no plain HTTP
    # port, no management port, nothing on 0.0.0.0.
    listening = {(c.laddr.ip, c.laddr.port) for c in psutil.Process(schema_registry.pid()).net_connections("inet")
                 if c.status == psutil.CONN_LISTEN}
    port = int(connection["extra"]["url"].split(":")[2].split("/")[0])
    assert listening in ({("127.0.0.1", port)}, {("::ffff:127.0.0.1", port)})
    # Plain HTTP to it gets no answer: the connection closes during what should be a TLS handshake.
    with pytest.raises(requests.ConnectionError, match="Remote end closed connection without response"):
        requests.get(url(connection, "/health/ready").replace("https:", "http:"), timeout=10)


def test_a_client_trusting_another_ca_refuses_its_certificate(connection, tmp_path):
    unrelated = tls.make_ca(tmp_path, "unrelated CA")
    with pytest.raises(requests.exceptions.SSLError, match="self-signed certificate in certificate chain"):
        requests.get(url(connection, "/health/ready"), verify=str(unrelated.ca), timeout=10)


@pytest.mark.parametrize("path", [f"{CCOMPAT}/subjects", f"{CCOMPAT}/config", "/apis/registry/v3/system/info"])
def test_every_api_needs_schema_registry_defaults_login(connection, path):
    user, password = login(connection)
    ca = connection["extra"]["ssl.ca.location"]
    for refused in (None, (user, "not-" + password), ("someone-else", password)):
        answer = requests.get(url(connection, path), auth=refused, verify=ca, timeout=10)
        assert (answer.status_code, answer.headers.get("www-authenticate")) == (401, "basic"), refused
    assert requests.get(url(connection, path), auth=(user, password), verify=ca, timeout=10).status_code == 200


def test_only_the_health_checks_answer_without_a_login_and_the_password_is_on_no_command_line(connection):
    answer = requests.get(url(connection, "/health/ready"), verify=connection["extra"]["ssl.ca.location"], timeout=10)
    assert (answer.status_code, answer.json()["status"]) == (200, "UP")

    registry = schema_registry.pid()
    assert connection["password"] not in process.command_line(registry)
    # It reads it from its config file, which only its owner may read.
    assert schema_registry.CONFIG.parent == schema_registry.HOME / "config"
    assert stat.S_IMODE(schema_registry.CONFIG.stat().st_mode) == 0o600
    assert f"pipeline={connection['password']}" in schema_registry.CONFIG.read_text()


def test_schema_registry_client_registers_an_avro_schema_and_backward_compatibility_holds(connection):
    from confluent_kafka.schema_registry import Schema, SchemaRegistryClient
    from confluent_kafka.schema_registry.error import SchemaRegistryError

    client = SchemaRegistryClient({**connection["extra"], "basic.auth.user.info": ":".join(login(connection))})
    subject = f"orders-{uuid.uuid4().hex[:8]}-value"
    first = client.register_schema(subject, Schema(json.dumps(ORDER), "AVRO"))
    assert json.loads(client.get_schema(first).schema_str) == ORDER

    # A new field without a default: the new schema cannot read the old records.
    breaking = {**ORDER, "fields": [*ORDER["fields"], {"name": "amount", "type": "long"}]}
    with pytest.raises(SchemaRegistryError) as refused:
        client.register_schema(subject, Schema(json.dumps(breaking), "AVRO"))
    assert refused.value.http_status_code == 409, refused.value
    compatible = {**ORDER, "fields": [*ORDER["fields"], {"name": "amount", "type": "long", "default": 0}]}
    second = client.register_schema(subject, Schema(json.dumps(compatible), "AVRO"))
    assert second != first
    assert [client.get_version(subject, n).schema_id for n in client.get_versions(subject)] == [first, second]
