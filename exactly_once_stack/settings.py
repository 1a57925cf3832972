"""Where the local stack lives, its ports and secrets, and the environment it exports.

`environment()` is the single source of every variable the project's tools read on the
local stack: Airflow's settings and connections (AIRFLOW_*, among them the pipeline's
connections pipeline_db, pipeline_db_job, pipeline_db_read, kafka_default, spark_default,
schema_registry_default), SPARK_*, PGSSLROOTCERT, and LOCAL_CLIENTS;
`.local/env.sh` is written from it for shells. Airflow settings that do not depend on
the deployment come from deploy/airflow.env, which docker-compose.yaml reads too.
"""

from __future__ import annotations

import base64
import json
import os
import secrets
import shlex
import shutil
import socket
from pathlib import Path
from urllib.parse import quote, urlencode

from exactly_once_stack.private import write_private
from exactly_once_stack.tls import TlsFiles

ROOT = Path(__file__).resolve().parent.parent
LOCAL = ROOT / ".local"
VENV = ROOT / ".venv"
ENV_SH = LOCAL / "env.sh"
AIRFLOW_HOME = LOCAL / "airflow"
SPARK_CONF_DIR = LOCAL / "spark" / "conf"
JARS = LOCAL / "jars"
COPY_WRITER_JAR = ROOT / "plugins" / "exactly_once" / "jars" / "exactly-once-copy.jar"  # setup.sh builds it (jvm/)
# The stack's private CA and the broker's and the client's certificates (exactly_once_stack.tls),
# made by `kafka.start()`.
TLS = TlsFiles(LOCAL / "tls")
LOOPBACK = "127.0.0.1"
SPARK_MASTER = "local[2]"
# Where the pipelines' Spark jobs run (STACK_SPARK): local (spark-submit, local[2]), standalone
# (a master and two workers) or connect (a Spark Connect server); exactly_once_stack.spark_cluster.
SPARK_MODES = ("local", "standalone", "connect")

# Each port can be fixed with STACK_<NAME>_PORT; otherwise a free one is picked
# on first start and kept in .local/ports.json.
# Kafka's listeners: kafka, plaintext (the tests' producers and oracles); kafka_sasl_ssl,
# SASL_SSL with SCRAM-SHA-512, the one the pipelines use through kafka_default; kafka_ssl, SSL
# with mutual TLS (client certificates required); kafka_expired and kafka_other_host, SSL
# presenting an expired certificate and one for another host, for the tests of a refused
# handshake. schema_registry: the schema registry's HTTPS port (exactly_once_stack.schema_registry);
# kafka_connect: the REST API of Kafka Connect's worker (exactly_once_stack.connect).
# A name added here is picked on first use and added to an existing checkout's ports.json.
PORT_NAMES = ("postgres", "kafka", "kafka_controller", "airflow_api", "spark_master", "spark_master_ui",
              "spark_connect", "kafka_ssl", "kafka_sasl_ssl", "kafka_expired", "kafka_other_host",
              "schema_registry", "prometheus", "kafka_connect")


# The local stack's plaintext Kafka listener and its pipeline database as a libpq URI, for
# its own clients: the tests' producers and oracles, the smoke DAG, psql. The library reads
# neither (it reads the Airflow connections): a deployment does not set them.
LOCAL_CLIENTS = ("KAFKA_BOOTSTRAP_SERVERS", "PIPELINE_DB_URL")
# Where Apicurio Registry serves the Confluent-compatible API.
SCHEMA_REGISTRY_API = "/apis/ccompat/v7"


def _json_file(path: Path, names: tuple[str, ...], make: callable) -> dict:
    """The values kept in `path`; those of `names` it lacks (all on first use, or one added
    since the checkout's first use) made by `make(name, kept)` and kept."""
    kept = json.loads(path.read_text()) if path.exists() else {}
    missing = [name for name in names if name not in kept]
    for name in missing:
        kept[name] = make(name, kept)
    if missing:
        path.parent.mkdir(parents=True, exist_ok=True)
        write_private(path, json.dumps(kept, indent=2) + "\n")  # 0600 from its first byte
    return kept


FIRST_SERVICE_PORT = 20000  # where the stack's ports are picked from, up to the ephemeral range


def _free_port(_name: str, kept: dict[str, int]) -> int:
    """A port free now, none of those kept (their service may be stopped), and outside the
    kernel's ephemeral range: a service started late in a test session (Kafka Connect, say)
    found its port, picked there, taken by some client's outgoing connection."""
    first, last = _ephemeral_ports()
    services = range(FIRST_SERVICE_PORT, first) if first - FIRST_SERVICE_PORT >= 1000 else range(last + 1, 65536)
    while True:
        port = secrets.choice(services)
        if port in kept.values():
            continue
        with socket.socket() as s:
            try:
                s.bind((LOOPBACK, port))
            except OSError:  # in use
                continue
        return port


def _ephemeral_ports() -> tuple[int, int]:
    """The first and last port the kernel gives outgoing connections (Linux's default if unknown)."""
    try:
        first, last = Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()
        return int(first), int(last)
    except (OSError, ValueError):
        return 32768, 60999


def ports() -> dict[str, int]:
    chosen = _json_file(LOCAL / "ports.json", PORT_NAMES, _free_port)
    for name in PORT_NAMES:
        override = os.environ.get(f"STACK_{name.upper()}_PORT")
        if override:
            if not override.isdigit():
                raise ValueError(f"STACK_{name.upper()}_PORT must be a port number, got {override!r}")
            chosen[name] = int(override)
    return chosen


SECRETS = {
    "postgres": lambda: secrets.token_urlsafe(18),
    "pipeline": lambda: secrets.token_urlsafe(18),
    # The least-privilege login roles (exactly_once_stack.postgres): the Spark job's, the readers'.
    "pipeline_job": lambda: secrets.token_urlsafe(18),
    "pipeline_read": lambda: secrets.token_urlsafe(18),
    "airflow": lambda: secrets.token_urlsafe(18),
    "airflow_admin": lambda: secrets.token_urlsafe(12),
    "kafka_pipeline": lambda: secrets.token_urlsafe(18),
    "schema_registry": lambda: secrets.token_urlsafe(18),
    # The change feeds' source database (exactly_once_stack.connect): its owner, Debezium's login.
    "source": lambda: secrets.token_urlsafe(18),
    "cdc_capture": lambda: secrets.token_urlsafe(18),
    # The REST API of Kafka Connect's worker (user `stack`).
    "kafka_connect": lambda: secrets.token_urlsafe(18),
    "jwt_secret": lambda: secrets.token_urlsafe(32),
    # The bearer token of the metrics endpoint's scrapers (connection exactly_once_metrics).
    "metrics_scraper": lambda: secrets.token_urlsafe(24),
    "fernet_key": lambda: base64.urlsafe_b64encode(secrets.token_bytes(32)).decode(),
}


def passwords() -> dict[str, str]:
    """Generated once per checkout; local-only credentials, never committed."""
    return _json_file(LOCAL / "secrets.json", tuple(SECRETS), lambda name, _kept: SECRETS[name]())


def postgres_tls() -> dict[str, str]:
    """libpq's parameters with which every client of the stack's PostgreSQL checks its certificate:
    signed by the stack's CA (a file path on this machine) and naming the host it dialled."""
    return {"sslmode": "verify-full", "sslrootcert": str(TLS.ca)}


def db_url(database: str, scheme: str = "postgresql", login: str | None = None) -> str:
    """A URI for `database` over TLS (`postgres_tls()`), as `login` (by default its owner role,
    which has the database's name); psycopg2 through SQLAlchemy takes the same query."""
    login = login or database
    return (f"{scheme}://{login}:{quote(passwords()[login], safe='')}@{LOOPBACK}:{ports()['postgres']}/{database}"
            f"?{urlencode(postgres_tls(), safe='/')}")


def pipeline_db_connection(login: str = "pipeline") -> dict:
    """An Airflow connection (type `postgres`) to the pipeline database as `login`, its extra
    the TLS check (`postgres_tls()`): pipeline_db (the owner role `pipeline`, the commit role),
    pipeline_db_job (`pipeline_job`), pipeline_db_read (`pipeline_read`)."""
    return {"conn_type": "postgres", "host": LOOPBACK, "port": ports()["postgres"],
            "login": login, "password": passwords()[login], "schema": "pipeline", "extra": postgres_tls()}


def kafka_connection() -> dict:
    """kafka_default: the SASL_SSL listener (SCRAM-SHA-512, the broker's certificate checked against
    the stack's CA), as the Kafka provider's connection type holds it. It only names the CA's file,
    which `kafka.start()` makes."""
    return {"conn_type": "kafka", "extra": {
        "bootstrap.servers": f"{LOOPBACK}:{ports()['kafka_sasl_ssl']}", "security.protocol": "SASL_SSL",
        "sasl.mechanism": "SCRAM-SHA-512", "sasl.username": "pipeline", "sasl.password": passwords()["kafka_pipeline"],
        "ssl.ca.location": str(TLS.ca)}}


def schema_registry_connection() -> dict:
    """schema_registry_default: the schema registry's Confluent-compatible API over HTTPS (its
    certificate checked against the stack's CA) with HTTP basic auth, as an Airflow HTTP
    connection holds it; the extra is confluent-kafka's SchemaRegistryClient config."""
    url = f"https://{LOOPBACK}:{ports()['schema_registry']}{SCHEMA_REGISTRY_API}"
    return {"conn_type": "http", "login": "pipeline", "password": passwords()["schema_registry"],
            "extra": {"url": url, "ssl.ca.location": str(TLS.ca)}}


def spark_mode() -> str:
    mode = os.environ.get("STACK_SPARK") or "local"
    if mode not in SPARK_MODES:
        raise ValueError(f"STACK_SPARK must be one of {', '.join(SPARK_MODES)}, got {mode!r}")
    return mode


def spark_connection(mode: str) -> dict:
    """spark_default on the local stack: a master for spark-submit, or a Spark Connect endpoint."""
    if mode == "standalone":
        return {"conn_type": "spark", "host": f"spark://{LOOPBACK}", "port": ports()["spark_master"]}
    if mode == "connect":
        return {"conn_type": "spark_connect", "host": LOOPBACK, "port": ports()["spark_connect"]}
    return {"conn_type": "spark", "host": SPARK_MASTER}


def java_home() -> str:
    if os.environ.get("JAVA_HOME"):
        return os.environ["JAVA_HOME"]
    java = shutil.which("java")
    if java is None:
        raise RuntimeError("no `java` on PATH: run exactly_once_stack/setup.sh, which installs a JDK")
    return str(Path(java).resolve().parent.parent)


def shared_airflow_settings() -> dict[str, str]:
    """deploy/airflow.env: the Airflow settings docker-compose.yaml uses too."""
    lines = (ROOT / "deploy" / "airflow.env").read_text().splitlines()
    return dict(line.split("=", 1) for line in lines if line.strip() and not line.startswith("#"))


def environment() -> dict[str, str]:
    """The variables every tool of the project reads, for the local stack."""
    port = ports()
    pw = passwords()
    api = f"http://{LOOPBACK}:{port['airflow_api']}"
    return {
        "JAVA_HOME": java_home(),
        "KAFKA_BOOTSTRAP_SERVERS": f"{LOOPBACK}:{port['kafka']}",
        "PIPELINE_DB_URL": db_url("pipeline"),
        "SPARK_CONF_DIR": str(SPARK_CONF_DIR),
        "SPARK_LOCAL_IP": LOOPBACK,
        "PYSPARK_PYTHON": str(VENV / "bin" / "python"),
        # The library and the demo for `python -m exactly_once.operate.status`,
        # `python -m exactly_once_demo.produce`, Spark's workers.
        "PYTHONPATH": str(ROOT / "plugins"),
        "AIRFLOW_HOME": str(AIRFLOW_HOME),
        "AIRFLOW__CORE__DAGS_FOLDER": str(ROOT / "dags"),
        "AIRFLOW__CORE__PLUGINS_FOLDER": str(ROOT / "plugins"),
        **shared_airflow_settings(),
        "AIRFLOW__CORE__FERNET_KEY": pw["fernet_key"],
        "AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_PASSWORDS_FILE": str(AIRFLOW_HOME / "passwords.json"),
        "AIRFLOW__CORE__EXECUTION_API_SERVER_URL": f"{api}/execution/",
        "AIRFLOW__DATABASE__SQL_ALCHEMY_CONN": db_url("airflow", "postgresql+psycopg2"),
        # Airflow's async engine (asyncpg, which takes no sslmode/sslrootcert in the URL): ssl=verify-full
        # with the CA from PGSSLROOTCERT, the one place asyncpg reads it from (libpq reads it too).
        "AIRFLOW__DATABASE__SQL_ALCHEMY_CONN_ASYNC": (
            f"postgresql+asyncpg://airflow:{quote(pw['airflow'], safe='')}@{LOOPBACK}:{port['postgres']}/airflow"
            "?ssl=verify-full"),
        "PGSSLROOTCERT": str(TLS.ca),
        "AIRFLOW__API__HOST": LOOPBACK,
        "AIRFLOW__API__PORT": str(port["airflow_api"]),
        "AIRFLOW__API__BASE_URL": api,
        "AIRFLOW__API_AUTH__JWT_SECRET": pw["jwt_secret"],
        "AIRFLOW_CONN_SPARK_DEFAULT": json.dumps(spark_connection(spark_mode())),
        "AIRFLOW_CONN_PIPELINE_DB": json.dumps(pipeline_db_connection("pipeline")),
        "AIRFLOW_CONN_PIPELINE_DB_JOB": json.dumps(pipeline_db_connection("pipeline_job")),
        "AIRFLOW_CONN_PIPELINE_DB_READ": json.dumps(pipeline_db_connection("pipeline_read")),
        "AIRFLOW_CONN_KAFKA_DEFAULT": json.dumps(kafka_connection()),
        "AIRFLOW_CONN_SCHEMA_REGISTRY_DEFAULT": json.dumps(schema_registry_connection()),
        "AIRFLOW_CONN_EXACTLY_ONCE_METRICS": json.dumps({"conn_type": "generic",
                                                         "password": pw["metrics_scraper"]}),
    }


def process_environment() -> dict[str, str]:
    """os.environ with the stack's variables and the project's virtualenv first on PATH."""
    env = {**os.environ, **environment()}
    env["PATH"] = f"{VENV / 'bin'}{os.pathsep}{env.get('PATH', '')}"
    return env


def write_env_sh() -> Path:
    lines = ["# Written by `python -m exactly_once_stack up`; source it from the project root.",
             f"export PATH={shlex.quote(str(VENV / 'bin'))}:\"$PATH\""]
    lines += [f"export {name}={shlex.quote(value)}" for name, value in environment().items()]
    write_private(ENV_SH, "\n".join(lines) + "\n")  # it holds the passwords: 0600 from its first byte
    return ENV_SH
