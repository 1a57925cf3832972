"""A single-node Apache Kafka broker in KRaft mode (broker + controller in one JVM).

Its classpath is .local/jars/kafka, assembled from Maven Central by
stack/setup.sh; its data and logs live in .local/kafka. Its TLS listeners present
certificates signed by the stack's private CA, made in .local/tls by exactly_once_stack.tls.
"""

from __future__ import annotations

import base64
import re
import socket
import subprocess
import uuid

from confluent_kafka.admin import AdminClient, ScramCredentialInfo, ScramMechanism, UserScramCredentialUpsertion

from exactly_once_stack import process, tls
from exactly_once_stack.settings import JARS, LOCAL, LOOPBACK, ROOT, TLS, java_home, kafka_connection, ports

HOME = LOCAL / "kafka"
DATA = HOME / "data"
CONFIG = HOME / "server.properties"
LOG4J = HOME / "log4j2.properties"
LOG = HOME / "server.log"
PID_FILE = HOME / "broker.pid"
MARKER = "kafka.Kafka"
HEAP = "-Xmx768m"


def _classpath() -> str:
    if not (JARS / "kafka").is_dir():
        raise RuntimeError(f"no Kafka jars in {JARS / 'kafka'}: run exactly_once_stack/setup.sh")
    return str(JARS / "kafka" / "*")


def _java(main: str, *args: str) -> list[str]:
    return [f"{java_home()}/bin/java", HEAP, f"-Dlog4j2.configurationFile=file:{LOG4J}",
            "-cp", _classpath(), main, *args]


def tool(main: str, *args: str, timeout: float = 120) -> str:
    """One of the broker's own command-line tools (a class of its jars) run to its end; its output."""
    return subprocess.run(_java(main, *args), check=True, capture_output=True, text=True, timeout=timeout).stdout


# Listener name -> its security protocol and port name. PLAINTEXT serves the tests' producers
# and oracles and the broker itself; SASL_SSL (SCRAM-SHA-512) is kafka_default's; SSL requires a
# client certificate (mutual TLS). EXPIRED and OTHER_HOST present an
# expired certificate and one for another host only, so that the tests can check that the
# product refuses a real TLS handshake with either.
LISTENERS = {"PLAINTEXT": ("PLAINTEXT", "kafka"), "SSL": ("SSL", "kafka_ssl"), "SASL_SSL": ("SASL_SSL", "kafka_sasl_ssl"),
             "EXPIRED": ("SSL", "kafka_expired"), "OTHER_HOST": ("SSL", "kafka_other_host")}


def _write_config() -> None:
    port = ports()
    listeners = ",".join(f"{name}://{LOOPBACK}:{port[port_name]}" for name, (_, port_name) in LISTENERS.items())
    protocols = ",".join(f"{name}:{protocol}" for name, (protocol, _) in LISTENERS.items())
    HOME.mkdir(parents=True, exist_ok=True)
    CONFIG.write_text(f"""\
process.roles=broker,controller
node.id=1
controller.quorum.voters=1@{LOOPBACK}:{port['kafka_controller']}
listeners={listeners},CONTROLLER://{LOOPBACK}:{port['kafka_controller']}
advertised.listeners={listeners}
controller.listener.names=CONTROLLER
inter.broker.listener.name=PLAINTEXT
listener.security.protocol.map={protocols},CONTROLLER:PLAINTEXT
# SASL_SSL: SCRAM-SHA-512 only; its users live in the cluster's metadata (start() adds the one).
listener.name.sasl_ssl.sasl.enabled.mechanisms=SCRAM-SHA-512
listener.name.sasl_ssl.scram-sha-512.sasl.jaas.config=org.apache.kafka.common.security.scram.ScramLoginModule required;
# Every TLS listener presents the broker's certificate (IP 127.0.0.1, DNS localhost) from a PEM
# file holding its key and chain, and trusts the stack's CA, unless it overrides them below.
ssl.keystore.type=PEM
ssl.keystore.location={TLS.keystore('broker')}
ssl.truststore.type=PEM
ssl.truststore.location={TLS.ca}
# SSL: mutual TLS, a client certificate signed by the stack's CA or no connection.
listener.name.ssl.ssl.client.auth=required
listener.name.expired.ssl.keystore.location={TLS.keystore('broker-expired')}
listener.name.other_host.ssl.keystore.location={TLS.keystore('broker-other-host')}
log.dirs={DATA}
num.partitions=1
auto.create.topics.enable=false
# One node: every internal topic has one replica, and transactions work with it.
offsets.topic.replication.factor=1
transaction.state.log.replication.factor=1
transaction.state.log.min.isr=1
# A transaction past its timeout is aborted within a second (the default looks every 10 s):
# the tests of a publisher too slow for its transaction see the broker's verdict at once.
transaction.abort.timed.out.transaction.cleanup.interval.ms=1000
share.coordinator.state.topic.replication.factor=1
share.coordinator.state.topic.min.isr=1
group.initial.rebalance.delay.ms=0
""")
    LOG4J.write_text("""\
rootLogger.level=INFO
rootLogger.appenderRef.out.ref=out
appender.out.type=Console
appender.out.name=out
appender.out.layout.type=PatternLayout
appender.out.layout.pattern=[%d] %p %m (%c)%n
logger.kafka.name=kafka
logger.kafka.level=INFO
logger.apache.name=org.apache.kafka
logger.apache.level=INFO
logger.state.name=state.change.logger
logger.state.level=WARN
""")


def pid() -> int | None:
    found = process.read_pid(PID_FILE)
    return found if found and process.alive(found, MARKER) else None


def ready() -> bool:
    try:
        socket.create_connection((LOOPBACK, ports()["kafka"]), timeout=1).close()
        AdminClient({"bootstrap.servers": bootstrap_servers()}).list_topics(timeout=5)
        return True
    except Exception:  # noqa: BLE001 - any failure means "not yet"
        return False


def bootstrap_servers() -> str:
    return f"{LOOPBACK}:{ports()['kafka']}"


def new_cluster_id() -> str:
    """A random cluster id as Kafka makes one (`Uuid.randomUuid`): URL-safe base64 of 16
    bytes, never starting with "-", which the storage tool takes for an option (a set-up in 64
    failed so)."""
    while (cluster_id := base64.urlsafe_b64encode(uuid.uuid4().bytes).decode().rstrip("=")).startswith("-"):
        pass
    return cluster_id


def start() -> bool:
    """Makes the TLS certificates and formats the storage on first use, starts the broker, adds
    kafka_default's SCRAM user, and waits until that user can log in."""
    if pid() is not None:
        return False
    tls.ensure(TLS)
    _write_config()
    if not (DATA / "meta.properties").exists():
        subprocess.run(_java("kafka.tools.StorageTool", "format", "-t", new_cluster_id(), "-c", str(CONFIG)),
                       check=True, stdout=subprocess.DEVNULL)
    process.spawn(_java(MARKER, str(CONFIG)), LOG, PID_FILE, env=None, cwd=ROOT)
    process.wait_until(lambda: pid() is not None and ready(), 90, "Kafka broker", LOG)
    _add_scram_user()
    process.wait_until(_scram_login_works, 30, "Kafka SCRAM login on the SASL_SSL listener", LOG)
    return True


def _add_scram_user() -> None:
    """kafka_default's user and password, as a SCRAM-SHA-512 credential in the cluster's metadata.
    An upsert, on every start: the same for a new data folder and one from before SASL_SSL (no
    authorizer is configured, so the plaintext listener may alter credentials)."""
    login = kafka_connection()["extra"]
    credential = ScramCredentialInfo(ScramMechanism.SCRAM_SHA_512, 8192)
    upsert = UserScramCredentialUpsertion(login["sasl.username"], credential, login["sasl.password"].encode())
    admin = AdminClient({"bootstrap.servers": bootstrap_servers()})
    for future in admin.alter_user_scram_credentials([upsert], request_timeout=30).values():
        future.result()


def _scram_login_works() -> bool:
    """The credential reached the broker: kafka_default's own settings list the topics."""
    try:
        # Quiet: refusals until the credential arrives are expected; the broker's log names each.
        AdminClient({**kafka_connection()["extra"], "log_level": 0}).list_topics(timeout=5)
        return True
    except Exception:  # noqa: BLE001 - any failure means "not yet"
        return False


def stop() -> None:
    running = pid()
    if running is not None:
        process.stop(running, MARKER, timeout=60)


def version() -> str:
    out = subprocess.run(_java(MARKER, "--version"), check=True, capture_output=True, text=True).stdout
    return re.search(r"\d+\.\d+\.\d+\S*", out).group(0)
