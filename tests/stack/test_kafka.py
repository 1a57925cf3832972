"""The broker: transactions commit and abort, read_committed hides the aborted; its TLS
listeners take kafka_default's SCRAM login, a client certificate of the stack's CA, and
refuse what they must, and its certificates are kept across starts."""

import base64
import json
import socket
import ssl
import stat
import time
import uuid
from datetime import datetime, timedelta, timezone
from pathlib import Path

import pytest
from confluent_kafka import Consumer, KafkaError, TopicPartition
from confluent_kafka.admin import AdminClient
from cryptography import x509

from exactly_once_stack import kafka, tls
from exactly_once_stack.settings import LOOPBACK, TLS, ports
from tests.kafka_records import produce_transactions


def read_all(servers: str, topic: str, partition: int, isolation: str) -> list[tuple[int, bytes]]:
    consumer = Consumer({"bootstrap.servers": servers, "group.id": f"read-{isolation}",
                         "isolation.level": isolation, "enable.auto.commit": False})
    consumer.assign([TopicPartition(topic, partition, 0)])
    seen = []
    try:
        while True:
            msg = consumer.poll(5)
            if msg is None:
                return seen
            if msg.error() is None:
                seen.append((msg.offset(), msg.value()))
    finally:
        consumer.close()


def test_read_committed_sees_exactly_the_committed_records_with_marker_gaps(kafka_servers, topic):
    produced = produce_transactions(kafka_servers, topic, [
        (True, [(0, b"k", b"c1"), (0, b"k", b"c2")]),
        (False, [(0, b"k", b"a1"), (0, b"k", b"a2")]),
        (True, [(0, b"k", b"c3")]),
    ])

    committed = [(r.offset, r.value) for r in produced if r.committed]
    assert read_all(kafka_servers, topic, 0, "read_committed") == committed
    assert [v for _, v in read_all(kafka_servers, topic, 0, "read_uncommitted")] == [b"c1", b"c2", b"a1", b"a2", b"c3"]
    # Each transaction ends with a control marker that takes one offset.
    assert [r.offset for r in produced] == [0, 1, 3, 4, 6]
    consumer = Consumer({"bootstrap.servers": kafka_servers, "group.id": "wm", "isolation.level": "read_committed"})
    assert consumer.get_watermark_offsets(TopicPartition(topic, 0), timeout=10) == (0, 8)
    consumer.close()


# The broker's TLS listeners, with the certificates exactly_once_stack.tls makes. A refused
# client is seen through error_cb: librdkafka reports each failed attempt there at once
# (list_topics would only time out, with a generic _TRANSPORT).

def first_refusal(config: dict, seconds: float = 5) -> KafkaError:
    """The first error librdkafka reports for a client of `config` reaching the broker."""
    seen = []
    consumer = Consumer({**config, "group.id": "tls-probe", "error_cb": seen.append, "log_level": 0})
    try:
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            consumer.poll(0.1)
            refusals = [e for e in seen if e.code() != KafkaError._ALL_BROKERS_DOWN]
            if refusals:
                return refusals[0]
    finally:
        consumer.close()
    raise AssertionError(f"no refusal within {seconds} s, only {seen}")


def assert_certificate_not_verified(refused: KafkaError) -> None:
    """librdkafka reports a failed verification as _SSL, or as _TRANSPORT when the socket's
    error reaches error_cb first (CI saw both): the reason is what must be right."""
    assert refused.code() in (KafkaError._SSL, KafkaError._TRANSPORT), refused
    assert "certificate verify failed" in refused.str(), refused


def ssl_client(listener: str) -> dict:
    """A client of the SSL `listener` trusting the stack's CA, without a certificate of its own."""
    return {"bootstrap.servers": f"{LOOPBACK}:{ports()[listener]}", "security.protocol": "SSL",
            "ssl.ca.location": str(TLS.ca)}


def openssl_verdict(listener: str, ca: Path) -> str:
    """Why OpenSSL refuses `listener`'s certificate, which librdkafka does not say."""
    context = ssl.create_default_context(cafile=str(ca))
    with socket.create_connection((LOOPBACK, ports()[listener]), timeout=5) as sock:
        try:
            context.wrap_socket(sock, server_hostname=LOOPBACK).close()
        except ssl.SSLCertVerificationError as refused:
            return refused.verify_message
    return "accepted"


def test_kafka_default_logs_in_with_scram_over_tls_and_a_wrong_password_is_refused(stack_env, topic):
    login = json.loads(stack_env["AIRFLOW_CONN_KAFKA_DEFAULT"])["extra"]
    assert (login["security.protocol"], login["sasl.mechanism"], login["ssl.ca.location"]) == (
        "SASL_SSL", "SCRAM-SHA-512", str(TLS.ca))
    assert topic in AdminClient(login).list_topics(timeout=10).topics

    wrong = first_refusal({**login, "sasl.password": "not-" + login["sasl.password"]})
    assert wrong.code() == KafkaError._AUTHENTICATION, wrong
    assert "invalid credentials with SASL mechanism SCRAM-SHA-512" in wrong.str()
    plain = first_refusal({**login, "sasl.mechanism": "PLAIN"})  # SCRAM-SHA-512 only
    assert plain.code() == KafkaError._AUTHENTICATION and "Unsupported SASL mechanism" in plain.str(), plain


def test_the_ssl_listener_takes_only_a_client_certificate_of_the_stack_ca(stack_env, topic, tmp_path):
    listener = ssl_client("kafka_ssl")
    mutual = {**listener, "ssl.certificate.location": str(TLS.client_certificate),
              "ssl.key.location": str(TLS.client_key)}
    assert topic in AdminClient(mutual).list_topics(timeout=10).topics

    unrelated = tls.make_ca(tmp_path, "unrelated CA")
    tls.make_leaf(unrelated, "client", tls.STACK_LEAVES["client"])
    for client in (listener, {**mutual, "ssl.certificate.location": str(unrelated.client_certificate),
                              "ssl.key.location": str(unrelated.client_key)}):
        # The broker's alert arrives after librdkafka's side of the handshake: _TRANSPORT, not _SSL.
        refused = first_refusal(client)
        assert refused.code() == KafkaError._TRANSPORT and "alert bad certificate" in refused.str(), refused


@pytest.mark.parametrize("listener, verdict", [
    ("kafka_expired", "certificate has expired"),
    ("kafka_other_host", "IP address mismatch, certificate is not valid for '127.0.0.1'."),
])
def test_a_broker_certificate_expired_or_for_another_host_fails_the_handshake(stack_env, listener, verdict):
    assert_certificate_not_verified(first_refusal(ssl_client(listener)))
    assert openssl_verdict(listener, TLS.ca) == verdict


def test_a_ca_other_than_the_stacks_does_not_trust_the_sasl_ssl_listener(stack_env, tmp_path):
    login = json.loads(stack_env["AIRFLOW_CONN_KAFKA_DEFAULT"])["extra"]
    unrelated = tls.make_ca(tmp_path, "unrelated CA")
    assert_certificate_not_verified(first_refusal({**login, "ssl.ca.location": str(unrelated.ca)}))
    assert openssl_verdict("kafka_sasl_ssl", unrelated.ca) == "self-signed certificate in certificate chain"


def test_the_certificates_are_kept_and_only_the_missing_or_expiring_made_again(tmp_path, monkeypatch):
    files = tls.ensure(tls.TlsFiles(tmp_path / "tls"))
    made = contents(files.folder)
    assert stat.S_IMODE(files.folder.stat().st_mode) == 0o700
    assert {name for name in made if stat.S_IMODE((files.folder / name).stat().st_mode) == 0o600} == {
        name for name in made if name.endswith((".key", ".keystore.pem"))}
    tls.ensure(files)
    assert contents(files.folder) == made

    files.key("client").unlink()
    monkeypatch.setattr(tls, "LEAF_LIFETIME", timedelta(days=10))  # a broker certificate about to expire
    tls.make_leaf(files, "broker", tls.STACK_LEAVES["broker"])
    monkeypatch.undo()
    tls.ensure(files)
    again = contents(files.folder)
    assert {name for name in made if again[name] != made[name]} == {  # not the one expired on purpose
        "broker.pem", "broker.key", "broker.keystore.pem", "client.pem", "client.key", "client.keystore.pem"}
    renewed = x509.load_pem_x509_certificate(again["broker.pem"])
    assert renewed.not_valid_after_utc > datetime.now(timezone.utc) + timedelta(days=300)


def contents(folder: Path) -> dict[str, bytes]:
    return {path.name: path.read_bytes() for path in folder.iterdir()}


def test_a_new_cluster_id_never_starts_with_a_dash(monkeypatch):
    """The storage tool takes an id starting with "-" for an option and fails the set-up: an
    id is drawn again, as Kafka's own `Uuid.randomUuid` does."""
    drawn = iter([uuid.UUID(bytes=b"\xf8" + bytes(15)), uuid.UUID(bytes=b"\x01" * 16)])
    monkeypatch.setattr(kafka.uuid, "uuid4", lambda: next(drawn))
    assert base64.urlsafe_b64encode(b"\xf8").startswith(b"-")  # the first draw would fail
    assert kafka.new_cluster_id() == base64.urlsafe_b64encode(b"\x01" * 16).decode().rstrip("=")
