"""A single-node Apache Kafka broker in KRaft mode (broker + controller in one JVM).

Its classpath is .local/jars/kafka, assembled from Maven Central by
stack/setup.sh; its data and logs live in .local/kafka.
"""

from __future__ import annotations

import base64
import re
import socket
import subprocess
import uuid

from confluent_kafka.admin import AdminClient

from exactly_once_stack import process
from exactly_once_stack.settings import JARS, LOCAL, LOOPBACK, ROOT, java_home, passwords, ports

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


def _write_config() -> None:
    port = ports()
    HOME.mkdir(parents=True, exist_ok=True)
    CONFIG.touch()
    CONFIG.chmod(0o600)  # before it holds the SASL user's password
    CONFIG.write_text(f"""\
process.roles=broker,controller
node.id=1
controller.quorum.voters=1@{LOOPBACK}:{port['kafka_controller']}
listeners=PLAINTEXT://{LOOPBACK}:{port['kafka']},SASL_PLAINTEXT://{LOOPBACK}:{port['kafka_sasl']},\
CONTROLLER://{LOOPBACK}:{port['kafka_controller']}
advertised.listeners=PLAINTEXT://{LOOPBACK}:{port['kafka']},SASL_PLAINTEXT://{LOOPBACK}:{port['kafka_sasl']}
controller.listener.names=CONTROLLER
inter.broker.listener.name=PLAINTEXT
listener.security.protocol.map=PLAINTEXT:PLAINTEXT,SASL_PLAINTEXT:SASL_PLAINTEXT,CONTROLLER:PLAINTEXT
# The pipelines' listener (kafka_default): SASL/PLAIN, one user.
listener.name.sasl_plaintext.sasl.enabled.mechanisms=PLAIN
listener.name.sasl_plaintext.plain.sasl.jaas.config=org.apache.kafka.common.security.plain.PlainLoginModule \
required user_pipeline="{passwords()['kafka_pipeline']}";
log.dirs={DATA}
num.partitions=1
auto.create.topics.enable=false
# One node: every internal topic has one replica, and transactions work with it.
offsets.topic.replication.factor=1
transaction.state.log.replication.factor=1
transaction.state.log.min.isr=1
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


def start() -> bool:
    """Formats the storage on first use, starts the broker, waits until it answers."""
    if pid() is not None:
        return False
    _write_config()
    if not (DATA / "meta.properties").exists():
        cluster_id = base64.urlsafe_b64encode(uuid.uuid4().bytes).decode().rstrip("=")
        subprocess.run(_java("kafka.tools.StorageTool", "format", "-t", cluster_id, "-c", str(CONFIG)),
                       check=True, stdout=subprocess.DEVNULL)
    process.spawn(_java(MARKER, str(CONFIG)), LOG, PID_FILE, env=None, cwd=ROOT)
    process.wait_until(lambda: pid() is not None and ready(), 90, "Kafka broker", LOG)
    return True


def stop() -> None:
    running = pid()
    if running is not None:
        process.stop(running, MARKER, timeout=60)


def version() -> str:
    out = subprocess.run(_java(MARKER, "--version"), check=True, capture_output=True, text=True).stdout
    return re.search(r"\d+\.\d+\.\d+\S*", out).group(0)
