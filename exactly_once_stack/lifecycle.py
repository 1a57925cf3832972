"""Up, down, status and versions of the whole local stack."""

from __future__ import annotations

import json
import sys
from importlib.metadata import version as dist_version

from exactly_once_stack import airflow, connect, kafka, postgres, prometheus, schema_registry, spark, spark_cluster
from exactly_once_stack.settings import ENV_SH, LOOPBACK, TLS, environment, ports, spark_mode, write_env_sh


def up(monitoring: bool = False, cdc: bool = False) -> list[str]:
    """Starts what is not running (Prometheus too with `monitoring`, Kafka Connect with Debezium
    with `cdc`); returns the names of the services it started."""
    started = []
    if not postgres.initialised():
        airflow.forget_migration()
    if postgres.start():
        started.append("postgres")
    try:
        if kafka.start():
            started.append("kafka")
        if schema_registry.start():
            started.append("schema-registry")
        spark.write_conf()
        started += spark_cluster.start(spark_mode())
        write_env_sh()
        airflow.migrate()
        if monitoring and prometheus.start():
            started.append("prometheus")
        if cdc and connect.start():
            started.append("kafka-connect")
    except BaseException:
        down(started)
        raise
    return started


def down(names: list[str] | None = None) -> None:
    """Stops the named services (all by default), Kafka Connect, Prometheus, Spark, the schema
    registry and Kafka before the database."""
    if names is None:
        spark_cluster.stop()
        names = ["kafka-connect", "prometheus", "schema-registry", "kafka", "postgres"]
    else:
        spark_cluster.stop_named(names)
    if "kafka-connect" in names:
        connect.stop()
    if "prometheus" in names:
        prometheus.stop()
    if "schema-registry" in names:
        schema_registry.stop()
    if "kafka" in names:
        kafka.stop()
    if "postgres" in names:
        postgres.stop()


def running() -> bool:
    return bool(postgres.pid() and kafka.pid())


def status() -> dict[str, str]:
    env = environment()
    pg, broker, registry, monitoring = postgres.pid(), kafka.pid(), schema_registry.pid(), prometheus.pid()
    return {
        "postgres": f"running pid {pg}, {env['PIPELINE_DB_URL'].split('@')[1]}" if pg else "stopped",
        "kafka": f"running pid {broker}, {env['KAFKA_BOOTSTRAP_SERVERS']} (plaintext), "
                 f"{json.loads(env['AIRFLOW_CONN_KAFKA_DEFAULT'])['extra']['bootstrap.servers']} "
                 f"(SASL_SSL/SCRAM-SHA-512: kafka_default), {LOOPBACK}:{ports()['kafka_ssl']} (SSL, mutual TLS); "
                 f"CA {TLS.ca}"
                 if broker else "stopped",
        "schema-registry": f"running pid {registry}, {schema_registry.url()}{schema_registry.CCOMPAT} "
                           "(HTTPS, basic auth: schema_registry_default)" if registry else "stopped",
        "prometheus": f"running pid {monitoring}, {prometheus.url()} (scrapes {prometheus.METRICS_PATH})"
                      if monitoring else "stopped (`./dev up --monitoring` starts it)",
        "kafka-connect": connect.describe(),
        "spark": f"{json.loads(env['AIRFLOW_CONN_SPARK_DEFAULT'])} (STACK_SPARK={spark_mode()}); running: "
                 f"{spark_cluster.running() or 'no cluster services'}",
        "env": str(ENV_SH) if ENV_SH.exists() else "not written yet (run `python -m exactly_once_stack up`)",
    }


def versions() -> dict[str, str]:
    """What a bug report needs; asks the running services and the JVMs themselves."""
    return {
        "python": sys.version.split()[0],
        "kafka broker": kafka.version(),
        "spark (JVM)": spark.version(),
        "pyspark": dist_version("pyspark"),
        "airflow": airflow.version(),
        "apache-airflow-providers-apache-spark": dist_version("apache-airflow-providers-apache-spark"),
        "confluent-kafka": dist_version("confluent-kafka"),
        "postgresql": postgres.version() if postgres.pid() else "stopped",
        "apicurio registry": schema_registry.version() if schema_registry.pid() else "stopped",
        "kafka connect": connect.version() if connect.pid() else "stopped",
    }
