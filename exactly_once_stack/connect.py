"""The change-feed stack (`./dev up --cdc`): Kafka Connect's worker in standalone mode with
Debezium's PostgreSQL connector, capturing the stack's `source` database into topics.

The worker's classpath is .local/jars/connect and Debezium a plugin directory of its own
(.local/jars/connect-plugins), both from Maven Central by exactly_once_stack/setup.sh; its
configuration, offsets, log and PID file live in .local/connect. It writes to the broker's
plaintext listener and serves its REST API on loopback behind HTTP basic auth (the stack's
`kafka_connect` password, user `stack`).

The stack's connector, `exactly_once_cdc`, takes a snapshot of the tables of schema `inventory`
of the database `source`, then streams their changes (pgoutput, publication and slot
`exactly_once_cdc`) to the topics `cdc.inventory.<table>` (3 partitions, JSON without the
schema part). Tests add connectors of their own over the REST API (`put_connector`), each with
its tables, publication and slot, and remove them (`remove_connector`). Debezium logs in as
`cdc_capture` (REPLICATION), its password read by the worker from a file (FileConfigProvider),
never held in a connector's configuration.
"""

from __future__ import annotations

import base64
import json
import os
import urllib.error
import urllib.request
from contextlib import closing

from psycopg2 import sql

from exactly_once_stack import postgres, process
from exactly_once_stack.private import write_private
from exactly_once_stack.settings import JARS, LOCAL, LOOPBACK, TLS, java_home, passwords, ports

HOME = LOCAL / "connect"
WORKER = HOME / "worker.properties"
LOG4J = HOME / "log4j2.properties"
LOG = HOME / "worker.log"
PID_FILE = HOME / "worker.pid"
OFFSETS = HOME / "offsets.dat"
CAPTURE_SECRET = HOME / "capture.properties"
REST_USERS = HOME / "rest-users.properties"
JAAS = HOME / "rest-jaas.conf"
STACK_CONNECTOR = HOME / "exactly_once_cdc.properties"
MARKER = "org.apache.kafka.connect.cli.ConnectStandalone"
REST_USER = "stack"
DATABASE = "source"
SCHEMA = "inventory"
STACK_NAME = "exactly_once_cdc"
TOPIC_PREFIX = "cdc"


def url() -> str:
    return f"http://{LOOPBACK}:{ports()['kafka_connect']}"


def connector_config(name: str, *, tables: str, publication: str, slot: str, topic_prefix: str) -> dict[str, str]:
    """A Debezium PostgreSQL connector of `source`'s `tables` (Debezium's table.include.list,
    regular expressions), over verify-full TLS: a snapshot, then the stream, one topic each."""
    return {
        "name": name, "connector.class": "io.debezium.connector.postgresql.PostgresConnector", "tasks.max": "1",
        "database.hostname": LOOPBACK, "database.port": str(ports()["postgres"]), "database.dbname": DATABASE,
        "database.user": postgres.CAPTURE_ROLE, "database.password": f"${{file:{CAPTURE_SECRET}:password}}",
        "database.sslmode": "verify-full", "database.sslrootcert": str(TLS.ca),
        "plugin.name": "pgoutput", "publication.name": publication, "publication.autocreate.mode": "disabled",
        "slot.name": slot, "table.include.list": tables, "snapshot.mode": "initial", "topic.prefix": topic_prefix,
        "topic.creation.default.partitions": "3", "topic.creation.default.replication.factor": "1",
        # Debezium skips truncates by default (skipped.operations=t): a replica would then keep
        # rows its source no longer has, silently. Sent, a truncate is a dead letter, or applied
        # under on_truncate: truncate.
        "skipped.operations": "none",
    }


def _write_config() -> None:
    HOME.mkdir(mode=0o700, parents=True, exist_ok=True)
    WORKER.write_text(f"""\
# Written by exactly_once_stack.connect on every start.
bootstrap.servers={LOOPBACK}:{ports()['kafka']}
listeners={url()}
rest.extension.classes=org.apache.kafka.connect.rest.basic.auth.extension.BasicAuthSecurityRestExtension
plugin.path={JARS / 'connect-plugins'}
# Found by their service files, not by scanning every class: the worker starts in half the time.
plugin.discovery=service_load
offset.storage.file.filename={OFFSETS}
# Connect's default is a minute: a worker killed between two flushes sends again what it sent
# since the last one, as a deployment's does (the change-feed tests rely on it).
offset.flush.interval.ms=5000
key.converter=org.apache.kafka.connect.json.JsonConverter
value.converter=org.apache.kafka.connect.json.JsonConverter
key.converter.schemas.enable=false
value.converter.schemas.enable=false
config.providers=file
config.providers.file.class=org.apache.kafka.common.config.provider.FileConfigProvider
config.providers.file.param.allowed.paths={HOME}
""")
    LOG4J.write_text("""\
rootLogger.level=INFO
rootLogger.appenderRef.out.ref=out
appender.out.type=Console
appender.out.name=out
appender.out.layout.type=PatternLayout
appender.out.layout.pattern=[%d] %p %m (%c)%n
logger.reflections.name=org.reflections
logger.reflections.level=ERROR
""")
    write_private(CAPTURE_SECRET, f"password={passwords()['cdc_capture']}\n")
    write_private(REST_USERS, f"{REST_USER}: {passwords()['kafka_connect']}\n")
    JAAS.write_text("KafkaConnect {\n  org.apache.kafka.connect.rest.basic.auth.extension.PropertyFileLoginModule "
                    f'required\n  file="{REST_USERS}";\n}};\n')
    stack = connector_config(STACK_NAME, tables=rf"{SCHEMA}\..*", publication=STACK_NAME, slot=STACK_NAME,
                             topic_prefix=TOPIC_PREFIX)
    # A properties file reads a backslash as an escape: the regular expressions keep theirs doubled.
    STACK_CONNECTOR.write_text("".join(f"{key}={value.replace(chr(92), chr(92) * 2)}\n" for key, value in stack.items()))


def _command() -> list[str]:
    if not (JARS / "connect").is_dir():
        raise RuntimeError(f"no Kafka Connect jars in {JARS / 'connect'}: run exactly_once_stack/setup.sh")
    return [f"{java_home()}/bin/java", "-Xmx512m", "-XX:+UseSerialGC", f"-Dlog4j2.configurationFile=file:{LOG4J}",
            f"-Djava.security.auth.login.config={JAAS}", "-cp", str(JARS / "connect" / "*"), MARKER,
            str(WORKER), str(STACK_CONNECTOR)]


def prepare_source() -> None:
    """Schema `inventory` of `source` (owned by its owner, readable by Debezium's role, tables
    made later too), the stack connector's publication of it, and not its slot if PostgreSQL
    gave it up (max_slot_wal_keep_size): that slot and the worker's offsets go (`forget`), so
    the connector takes a new snapshot rather than stream from a position the log no longer holds."""
    capture = sql.Identifier(postgres.CAPTURE_ROLE)
    with closing(postgres.connect_admin(DATABASE)) as conn, conn.cursor() as cur:
        conn.autocommit = True
        cur.execute(sql.SQL("CREATE SCHEMA IF NOT EXISTS {s} AUTHORIZATION {owner}; "
                            "GRANT USAGE ON SCHEMA {s} TO {capture}; "
                            "GRANT SELECT ON ALL TABLES IN SCHEMA {s} TO {capture}; "
                            "ALTER DEFAULT PRIVILEGES FOR ROLE {owner} IN SCHEMA {s} GRANT SELECT ON TABLES TO {capture}")
                    .format(s=sql.Identifier(SCHEMA), owner=sql.Identifier(DATABASE), capture=capture))
        cur.execute("SELECT 1 FROM pg_publication WHERE pubname = %s", (STACK_NAME,))
        if cur.fetchone() is None:
            cur.execute(sql.SQL("CREATE PUBLICATION {} FOR TABLES IN SCHEMA {}").format(
                sql.Identifier(STACK_NAME), sql.Identifier(SCHEMA)))
        cur.execute("SELECT 1 FROM pg_replication_slots WHERE slot_name = %s AND wal_status = 'lost' AND NOT active",
                    (STACK_NAME,))
        lost = cur.fetchone() is not None
    if lost:
        forget()


def forget() -> None:
    """The stack connector's slot dropped and the worker's offsets (the stack connector's, and
    those of connectors removed before) deleted, the worker stopped: its next start takes a new
    snapshot and keeps no log back meanwhile."""
    if pid() is not None:
        raise RuntimeError("the Kafka Connect worker runs: stop it first")
    with closing(postgres.connect_admin(DATABASE)) as conn, conn.cursor() as cur:
        conn.autocommit = True
        cur.execute("SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots WHERE slot_name = %s",
                    (STACK_NAME,))
    OFFSETS.unlink(missing_ok=True)


def pid() -> int | None:
    found = process.read_pid(PID_FILE)
    return found if found and process.alive(found, MARKER) else None


def request(path: str, method: str = "GET", body: dict | None = None) -> dict | list | None:
    """A REST request as the stack's user; an HTTP error raises urllib's HTTPError."""
    token = base64.b64encode(f"{REST_USER}:{passwords()['kafka_connect']}".encode()).decode()
    data = None if body is None else json.dumps(body).encode()
    request = urllib.request.Request(url() + path, data=data, method=method,
                                     headers={"Content-Type": "application/json", "Authorization": f"Basic {token}"})
    with urllib.request.urlopen(request, timeout=30) as response:
        text = response.read()
    return json.loads(text) if text else None


def running_tasks(name: str) -> bool:
    """The connector and its one task run (the snapshot, or the stream after it)."""
    try:
        status = request(f"/connectors/{name}/status")
    except OSError:  # not yet served, or not yet known
        return False
    return status["connector"]["state"] == "RUNNING" and [t["state"] for t in status["tasks"]] == ["RUNNING"]


def start() -> bool:
    """Prepares the source database, starts the worker with the stack's connector and waits
    until it runs. False, and nothing done, if the worker runs already."""
    if pid() is not None:
        return False
    prepare_source()
    _write_config()
    # Its own environment: the worker and its plugins see none of the stack's secrets a caller exported.
    env = {name: os.environ[name] for name in ("PATH", "HOME", "LANG", "TZ") if name in os.environ}
    process.start_ready(_command(), LOG, PID_FILE, HOME, lambda: pid() is not None and running_tasks(STACK_NAME),
                        120, "Kafka Connect worker", stop, env=env)
    return True


def stop() -> None:
    """Stops the worker; it flushes its offsets first (a SIGKILL would not)."""
    running = pid()
    if running is not None:
        process.stop(running, MARKER, timeout=60)


def put_connector(config: dict[str, str]) -> None:
    """Creates the connector (or sets its configuration again) and waits until its task runs."""
    request(f"/connectors/{config['name']}/config", "PUT", config)
    process.wait_until(lambda: running_tasks(config["name"]), 120, f"connector {config['name']}", LOG)


def remove_connector(name: str, slot: str) -> None:
    """Deletes the connector and drops its slot, which Connect leaves behind (a slot left holds
    the log from being recycled)."""
    try:
        request(f"/connectors/{name}", "DELETE")
    except urllib.error.HTTPError as error:
        if error.code != 404:
            raise
    with closing(postgres.connect_admin(DATABASE)) as conn, conn.cursor() as cur:
        conn.autocommit = True
        process.wait_until(lambda: _slot_idle(cur, slot), 60, f"slot {slot} released")
        cur.execute("SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots WHERE slot_name = %s",
                    (slot,))


def _slot_idle(cur, slot: str) -> bool:
    cur.execute("SELECT NOT active FROM pg_replication_slots WHERE slot_name = %s", (slot,))
    found = cur.fetchone()
    return found is None or found[0]


def describe() -> str:
    running = pid()
    if running is None:
        return "stopped (`./dev up --cdc` starts it)"
    return (f"running pid {running}, REST {url()} (basic auth: {REST_USER}); connector {STACK_NAME}: schema "
            f"{SCHEMA} of database {DATABASE} to topics {TOPIC_PREFIX}.{SCHEMA}.<table>")


def version() -> str:
    return request("/")["version"]

