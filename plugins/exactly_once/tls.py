"""A connection's TLS settings, in librdkafka's names: the Kafka connection's, for the two
clients that use it, and the schema registry connection's (`exactly_once.schema_registry`,
through Python's `ssl`: `client_context`). librdkafka (the planner) takes PEM from files
(`ssl.ca.location`, `ssl.certificate.location`, `ssl.key.location`) or inline (`ssl.ca.pem`, `ssl.certificate.pem`, `ssl.key.pem`, with
`ssl.key.password` for an encrypted key); the Java client (Spark's Kafka source) takes the same
PEM inline as `ssl.truststore.certificates`, `ssl.keystore.certificate.chain` and
`ssl.keystore.key`.

Spark's executors, and a Spark Connect server, open their Kafka connections on machines that
cannot read the task's files, so the material travels inline (`inline`): in the job's private
settings file (`exactly_once.spark.settings`), then in the read's options, which Spark ships
with the plan (over the Connect channel to a Connect server) and the Kafka client's own log
prints as [hidden]. The Java client gets the key unencrypted, as PKCS#8 (the only PEM key form
it reads): its password never leaves the task.
"""

from __future__ import annotations

import logging
import socket
import ssl
import tempfile
from collections.abc import Mapping
from pathlib import Path

from cryptography.hazmat.primitives import serialization

from exactly_once.errors import ConfigError

log = logging.getLogger(__name__)

# Each piece of material: librdkafka's file setting, its inline setting, the Java client's.
CA = ("ssl.ca.location", "ssl.ca.pem", "ssl.truststore.certificates")
CERTIFICATE = ("ssl.certificate.location", "ssl.certificate.pem", "ssl.keystore.certificate.chain")
KEY = ("ssl.key.location", "ssl.key.pem", "ssl.keystore.key")
KEY_PASSWORD = "ssl.key.password"
SYSTEM_CAS = "probe"  # librdkafka's ssl.ca.location for the system's CAs, the Java client's default
NO_HOST_CHECK = ("ssl.endpoint.identification.algorithm", "none")
NO_VERIFICATION = ("enable.ssl.certificate.verification", "false")  # the Java client has no such switch
# The librdkafka settings read here (the Java client verifies certificates unless told otherwise).
SETTINGS = (*CA[:2], *CERTIFICATE[:2], *KEY[:2], KEY_PASSWORD, NO_VERIFICATION[0])


def inline(connection: str, config: Mapping[str, str]) -> dict[str, str]:
    """The config with each PEM file's content in place of its location."""
    found = dict(config)
    for location, pem, _java in (CA, CERTIFICATE, KEY):
        if location in found and found[location] != SYSTEM_CAS:
            found[pem] = _read(connection, location, found.pop(location))
    return found


def java_settings(connection: str, config: Mapping[str, str]) -> dict[str, str]:
    """The Java client's TLS settings of a librdkafka config (files read here, when the config
    still names them)."""
    given = inline(connection, config)
    if str(given.get(NO_VERIFICATION[0])).lower() == NO_VERIFICATION[1]:
        raise ConfigError(f"connection {connection!r}: enable.ssl.certificate.verification false has no equivalent "
                          "in Spark's Kafka client; give the brokers' CA (ssl.ca.location or ssl.ca.pem) instead")
    if given.get(NO_HOST_CHECK[0]) == NO_HOST_CHECK[1]:
        log.warning("connection %r: %s is 'none': the brokers' certificates are not checked against their host "
                    "names", connection, NO_HOST_CHECK[0])
    java = {}
    if CA[1] in given:
        java.update({"ssl.truststore.type": "PEM", CA[2]: given[CA[1]]})
    if (CERTIFICATE[1] in given) != (KEY[1] in given):
        present, absent = (CERTIFICATE, KEY) if CERTIFICATE[1] in given else (KEY, CERTIFICATE)
        raise ConfigError(f"connection {connection!r}: a client certificate needs both {present[0]} (or "
                          f"{present[1]}) and {absent[0]} (or {absent[1]}); only the first is given")
    if KEY[1] in given:
        java.update({"ssl.keystore.type": "PEM", CERTIFICATE[2]: given[CERTIFICATE[1]],
                     KEY[2]: _pkcs8(connection, given[KEY[1]], given.get(KEY_PASSWORD))})
    return java


def secrets(config: Mapping[str, str]) -> list[str]:
    """The config's values that are secret (the key and its password), for scrubbing."""
    return [config[k] for k in (KEY[1], KEY_PASSWORD) if config.get(k)]


def client_context(connection: str, config: Mapping[str, str]) -> ssl.SSLContext:
    """Python's TLS context of these settings: their CA (none: the system's, as librdkafka's
    default), their host name check, their client certificate and key."""
    given = inline(connection, config)
    context = ssl.create_default_context(cadata=given.get(CA[1]))
    context.check_hostname = given.get(NO_HOST_CHECK[0]) != NO_HOST_CHECK[1]
    if CERTIFICATE[1] in given and KEY[1] in given:
        # Python loads a certificate and key from files only: private ones, removed at once.
        with tempfile.TemporaryDirectory(prefix="exactly_once-tls-") as folder:  # mode 0700
            certificate, key = Path(folder) / "certificate.pem", Path(folder) / "key.pem"
            certificate.write_text(given[CERTIFICATE[1]])
            key.touch(0o600)
            key.write_text(given[KEY[1]])
            context.load_cert_chain(certificate, key, given.get(KEY_PASSWORD))
    return context


def verification_failure(connection: str, config: Mapping[str, str], timeout: float = 5) -> str | None:
    """Why the first broker's certificate fails verification with this config's CA and host
    name check, in OpenSSL's words ("certificate has expired", "IP address mismatch, …",
    "self-signed certificate in certificate chain"), or None if it passes or cannot be asked.
    librdkafka says "certificate verify failed" for every cause; a handshake of our own names it."""
    host, _, port = config["bootstrap.servers"].split(",")[0].strip().rpartition(":")
    host = host.strip("[]")
    try:
        with socket.create_connection((host, int(port)), timeout=timeout) as raw, \
                client_context(connection, config).wrap_socket(raw, server_hostname=host):
            return None
    except ssl.SSLCertVerificationError as failed:
        return failed.verify_message
    except (OSError, ValueError):  # no answer, or not TLS: the caller reports what librdkafka said
        return None


def _read(connection: str, setting: str, path: str) -> str:
    try:
        return Path(path).read_text()
    except (OSError, UnicodeDecodeError) as unreadable:
        raise ConfigError(f"connection {connection!r}: {setting} {path!r} cannot be read as a PEM file: "
                          f"{unreadable.__class__.__name__}: {getattr(unreadable, 'strerror', None) or unreadable}"
                          ) from None


def _pkcs8(connection: str, pem: str, password: str | None) -> str:
    """The key as unencrypted PKCS#8 PEM, whichever PEM form (PKCS#1, SEC1, PKCS#8, encrypted
    or not) it was given in; ConfigError naming the setting, never quoting the key."""
    try:
        key = serialization.load_pem_private_key(pem.encode(), password.encode() if password else None)
    except (ValueError, TypeError) as unreadable:
        # cryptography's words say whether a password is wrong, missing or not needed; they never quote the key
        raise ConfigError(f"connection {connection!r}: the client key ({KEY[0]} or {KEY[1]}) cannot be read"
                          f"{' with ' + KEY_PASSWORD if password else ''}: {unreadable}") from None
    return key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                             serialization.NoEncryption()).decode()
