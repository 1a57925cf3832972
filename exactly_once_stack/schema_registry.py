"""The local stack's schema registry: Apicurio Registry, whose Confluent-compatible API
(/apis/ccompat/v7) confluent-kafka's SchemaRegistryClient, and so the Avro and Protobuf
serializers of the tests' producers, talk to.

Its Quarkus app is .local/jars/schema-registry, fetched from Maven Central by
exactly_once_stack/setup.sh; its config, log and PID file live in .local/schema-registry. It
serves HTTPS only, on 127.0.0.1, and takes HTTP basic auth as schema_registry_default's user
(settings.schema_registry_connection()) on every path but its health checks. Its storage is in
memory: each start begins empty, so each start sets the global compatibility again.
"""

from __future__ import annotations

import base64
import json
import os
import ssl
import urllib.request
from pathlib import Path

from exactly_once_stack import process, tls
from exactly_once_stack.settings import (JARS, LOCAL, LOOPBACK, SCHEMA_REGISTRY_API, TLS, java_home, ports,
                                         schema_registry_connection)

APP = JARS / "schema-registry"
HOME = LOCAL / "schema-registry"
# Quarkus reads $PWD/config/application.properties, and the registry runs in HOME: the password
# goes there, not on the command line, which `ps` shows to every user.
CONFIG = HOME / "config" / "application.properties"
LOG = HOME / "registry.log"
PID_FILE = HOME / "registry.pid"
MARKER = "apicurio-registry-app"
# The broker's certificate names what the registry needs (IP 127.0.0.1, DNS localhost), and is
# signed by the stack's CA; Quarkus reads its PEM chain and PKCS#8 key as they are.
LEAF = "broker"
# Apicurio's default is NONE: any change to a schema would be accepted. BACKWARD is Confluent's
# default: a consumer with the new schema still reads what the old one wrote.
COMPATIBILITY = "BACKWARD"
CCOMPAT = SCHEMA_REGISTRY_API


def url() -> str:
    return f"https://{LOOPBACK}:{ports()['schema_registry']}"


def _runner() -> Path:
    jars = sorted(APP.glob("apicurio-registry-app-*-runner.jar"))
    if not jars:
        raise RuntimeError(f"no Apicurio Registry in {APP}: run exactly_once_stack/setup.sh")
    return jars[-1]


def _command() -> list[str]:
    # A small heap, the serial collector and the C1 compiler only: it starts in seconds and stays
    # near 250 MB on a 2-core machine that also runs Kafka, PostgreSQL and Spark.
    return [f"{java_home()}/bin/java", "-Xmx256m", "-XX:+UseSerialGC", "-XX:TieredStopAtLevel=1",
            f"-Dquarkus.http.host={LOOPBACK}",
            f"-Dquarkus.http.ssl-port={ports()['schema_registry']}",
            f"-Dquarkus.http.ssl.certificate.files={TLS.certificate(LEAF)}",
            f"-Dquarkus.http.ssl.certificate.key-files={TLS.key(LEAF)}",
            # No plain HTTP listener at all, rather than one that redirects to HTTPS.
            "-Dquarkus.http.insecure-requests=disabled",
            "-jar", str(_runner())]


def _write_config() -> None:
    """The authentication settings, in a file that is 0600 from its first byte (written under a
    temporary name, then renamed over the old one) in a folder only its owner may list."""
    login = schema_registry_connection()
    text = f"""\
# Written by exactly_once_stack.schema_registry on every start.
# HTTP basic auth against Quarkus's embedded users, without an OIDC server: Apicurio's
# authentication mechanism takes basic auth when quarkus.http.auth.basic is true and OIDC
# (quarkus.oidc.tenant-enabled) is off, as it is by default.
quarkus.http.auth.basic=true
quarkus.security.users.embedded.plain-text=true
quarkus.security.users.embedded.users.{login['login']}={login['password']}
# Apicurio alone leaves some paths open (/apis/registry/v3/system/info, ...): every one needs a
# login but the health checks, which say only UP or DOWN and are what ready() asks.
quarkus.http.auth.permission.login.paths=/*
quarkus.http.auth.permission.login.policy=authenticated
quarkus.http.auth.permission.health.paths=/health/*
quarkus.http.auth.permission.health.policy=permit
"""
    HOME.mkdir(parents=True, exist_ok=True)
    CONFIG.parent.mkdir(mode=0o700, exist_ok=True)
    temporary = CONFIG.with_name(f".{CONFIG.name}.tmp")
    temporary.unlink(missing_ok=True)
    with os.fdopen(os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600), "w") as out:
        out.write(text)
    os.replace(temporary, CONFIG)


def _open(path: str, method: str = "GET", body: dict | None = None, login: bool = True):
    """An HTTPS request to the registry, its certificate checked against the stack's CA."""
    headers = {"Content-Type": "application/json"}
    if login:
        conn = schema_registry_connection()
        token = base64.b64encode(f"{conn['login']}:{conn['password']}".encode()).decode()
        headers["Authorization"] = f"Basic {token}"
    data = None if body is None else json.dumps(body).encode()
    request = urllib.request.Request(url() + path, data=data, method=method, headers=headers)
    return urllib.request.urlopen(request, context=ssl.create_default_context(cafile=str(TLS.ca)), timeout=10)


def request(path: str, method: str = "GET", body: dict | None = None) -> dict:
    """A JSON request as schema_registry_default's user; an HTTP error raises urllib's HTTPError."""
    with _open(path, method, body) as response:
        return json.loads(response.read())


def pid() -> int | None:
    found = process.read_pid(PID_FILE)
    return found if found and process.alive(found, MARKER) else None


def ready() -> bool:
    try:
        with _open("/health/ready", login=False) as response:
            return response.status == 200
    except OSError:  # refused, not yet TLS, or 503 (urllib's HTTPError is an OSError): not yet
        return False


def start() -> bool:
    """Writes its config, starts the registry, waits until it is ready, and sets the global
    compatibility. False, and nothing done, if it runs already."""
    if pid() is not None:
        return False
    tls.ensure(TLS)
    _write_config()
    # Not left running if compatibility cannot be set: the next start() would take it as started, NONE.
    process.start_ready(_command(), LOG, PID_FILE, HOME, lambda: pid() is not None and ready(), 60, "schema registry",
                        stop, then=lambda: request(f"{CCOMPAT}/config", "PUT", {"compatibility": COMPATIBILITY}))
    return True


def stop() -> None:
    running = pid()
    if running is not None:
        process.stop(running, MARKER)


def version() -> str:
    return request("/apis/registry/v3/system/info")["version"]
