"""The pipeline's Airflow connections, the one place its endpoints and credentials are
configured: `pipeline_db` (PostgreSQL: the ledger and the sink tables), `kafka_default`
(type `kafka`: its extra is the librdkafka client config, TLS and SASL included),
`spark_default` (the Spark master), `exactly_once_metrics` (the metrics endpoint's token),
and the schema registry a pipeline names in
`source.schema_registry` (type `http`; `exactly_once.schema_registry`). The tasks read them; the Spark job gets what it needs
from its task (`exactly_once.spark.settings`), never from an environment variable of its own.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import TypeVar
from urllib.parse import quote, urlencode

import psycopg2
from airflow.sdk import BaseHook
from airflow.sdk.exceptions import AirflowNotFoundException

from exactly_once.config import NO_KEY, Source
from exactly_once.errors import ConfigError
from exactly_once.formats import format_of
from exactly_once.kafka_client import KafkaClient
from exactly_once.problems import Problem
from exactly_once.schema_registry import URL, SchemaRegistry

PIPELINE_DB = "pipeline_db"            # the commit role: the tasks (the ledger, promotion into the final tables)
PIPELINE_DB_JOB = "pipeline_db_job"    # the job role: the Spark job (staging inserts; README, "Roles by duty")
PIPELINE_DB_READ = "pipeline_db_read"  # the read role: status and the pipelines view
KAFKA = "kafka_default"
SPARK = "spark_default"
METRICS_SCRAPER = "exactly_once_metrics"  # its password: the bearer token of the metrics endpoint's scrapers
T = TypeVar("T")


def read_from_metadata_database() -> None:
    """For the command-line tools: like Airflow's own CLI, read connections from the metadata
    database too (Admin → Connections), not only from the environment and secrets backends a
    task sees. Call before the first connection is read."""
    os.environ.setdefault("_AIRFLOW_PROCESS_CONTEXT", "server")


def for_command_line(read: Callable[[], T]) -> T:
    """What `read` gets from a connection, for a command-line tool: a connection that is not
    defined or cannot be used ends the command with what is wrong, not a traceback."""
    read_from_metadata_database()
    try:
        return read()
    except (ConfigError, AirflowNotFoundException) as unusable:
        raise SystemExit(str(unusable)) from None


def _pipeline_db_parameters(conn_id: str) -> dict:
    return db_parameters(BaseHook.get_connection(conn_id))


def db_parameters(c) -> dict:
    """libpq's connection parameters: the connection's fields, and its extra (libpq
    parameters such as sslmode, which the Spark job carries over to pgjdbc)."""
    fields = {"host": c.host, "port": c.port or 5432, "user": c.login, "password": c.password, "dbname": c.schema}
    return {**{k: v for k, v in fields.items() if v}, **{k: str(v) for k, v in c.extra_dejson.items()}}


def pipeline_db_url(conn_id: str = PIPELINE_DB) -> str:
    """The connection as a libpq URI, the form the Spark job takes (`exactly_once.db.jdbc_options`)."""
    given = _pipeline_db_parameters(conn_id)
    host = given.pop("host", "")
    host = f"[{host}]" if ":" in host else quote(host, safe="")  # an IPv6 address; a socket directory
    login = quote(given.pop("user", ""), safe="")
    if "password" in given:
        login += ":" + quote(given.pop("password"), safe="")
    port, dbname = given.pop("port"), quote(given.pop("dbname", ""), safe="")
    query = urlencode(given)
    return f"postgresql://{login}{'@' if login else ''}{host}:{port}/{dbname}{'?' + query if query else ''}"


def pipeline_db_location(conn_id: str = PIPELINE_DB) -> tuple[str, int, str]:
    """The database's host, port and name (no credentials): for lineage."""
    c = BaseHook.get_connection(conn_id)
    return c.host or "", c.port or 5432, c.schema or ""


def connector(conn_id: str = PIPELINE_DB):
    """psycopg2 connections to the connection's database (Airflow's Postgres hook may give
    psycopg 3 ones, which psycopg2.sql cannot compose for)."""
    parameters = _pipeline_db_parameters(conn_id)
    return lambda: psycopg2.connect(**parameters)


def defined_connector(conn_id: str):
    """`connector(conn_id)`, or None when the connection is not defined."""
    return connector(conn_id) if _defined(conn_id) else None


def kafka_client(conn_id: str = KAFKA) -> KafkaClient:
    return kafka_client_of(conn_id, BaseHook.get_connection(conn_id))


def kafka_client_of(conn_id: str, c) -> KafkaClient:
    """The connection's client config; ConfigError naming the connection unless both the
    planner and Spark's Kafka source can use it."""
    if c.conn_type != "kafka":
        raise ConfigError(f"connection {conn_id!r} is of type {c.conn_type!r}, not 'kafka' (its extra holds the "
                          "Kafka client config, e.g. {\"bootstrap.servers\": \"host:9092\"})")
    return KafkaClient(conn_id, c.extra_dejson).validate()


def scraper_token(conn_id: str = METRICS_SCRAPER) -> str | None:
    """The token a scraper of the metrics endpoint sends (the connection's password); None
    while the connection is not defined or has no password: the endpoint is off."""
    return (BaseHook.get_connection(conn_id).password or None) if _defined(conn_id) else None


def schema_registry(conn_id: str) -> SchemaRegistry:
    """The schema registry of the connection (type `http`): ConfigError naming it unless usable."""
    c = BaseHook.get_connection(conn_id)
    if c.conn_type != "http":
        raise ConfigError(f"connection {conn_id!r} is of type {c.conn_type!r}, not 'http' (a schema registry: its "
                          "extra holds the registry's 'url' and TLS settings, its login and password basic auth)")
    extra = {k: str(v) for k, v in c.extra_dejson.items()}
    url = extra.pop(URL, None) or f"{c.schema or 'https'}://{c.host}{f':{c.port}' if c.port else ''}"
    return SchemaRegistry(conn_id, url, (c.login, c.password or "") if c.login else None, extra).validate()


def schema_registry_problems(source: Source) -> list[Problem]:
    """The problems of the source's registry connection (undefined, unusable, refused by the
    registry), then of the reader schemas it holds for the source's formats."""
    conn_id = source.schema_registry
    if conn_id is None:
        return []
    if not _defined(conn_id):
        return [Problem(f"connection {conn_id!r}", "is not defined (the pipeline's source.schema_registry; Admin → "
                                                   f"Connections in the UI, or AIRFLOW_CONN_{conn_id.upper()})")]
    try:
        registry = schema_registry(conn_id)
    except ConfigError as unusable:
        return [Problem(f"connection {conn_id!r}", str(unusable).removeprefix(f"connection {conn_id!r}: "))]
    return registry.problems() or [problem for part, name in (("value", source.value_format), ("key", source.key_format))
                                   if name != NO_KEY for problem in format_of(name).problems(source.encoded(part, registry))]


def connection_problems(conn_ids: tuple[str, ...] = (PIPELINE_DB, PIPELINE_DB_JOB, KAFKA, SPARK)) -> list[Problem]:
    """The pipeline's Airflow connections that are not defined or cannot be used, and the
    pipeline database's refusal of its connection (PostgreSQL's words, which never quote the
    password). A database that did not answer, or refused for a reason that may pass (too
    many clients, starting up), is a problem that may pass by itself: the task is retried.
    Whether the brokers accept the Kafka login is the preflight's topic check."""
    undefined = [conn_id for conn_id in conn_ids if not _defined(conn_id)]
    problems = [Problem(f"connection {conn_id!r}", "is not defined (Admin → Connections in the UI, "
                                                   f"or AIRFLOW_CONN_{conn_id.upper()})") for conn_id in undefined]
    if KAFKA in conn_ids and KAFKA not in undefined:
        try:
            kafka_client()
        except ConfigError as unusable:
            problems.append(Problem("Kafka", str(unusable)))
    for database in (PIPELINE_DB, PIPELINE_DB_JOB):
        if database in conn_ids and database not in undefined:
            problems += database_problems(database)
    return problems


def database_problems(conn_id: str = PIPELINE_DB) -> list[Problem]:
    """The pipeline database's refusal of a connection to it, naming the connection: [] if
    it connects. A server certificate the connection's sslrootcert does not trust is said so."""
    try:
        connector(conn_id)().close()
    except psycopg2.OperationalError as refused:
        said = " ".join(str(refused).split())
        if UNTRUSTED_CERTIFICATE in said:
            root = _pipeline_db_parameters(conn_id).get("sslrootcert", "libpq's default, ~/.postgresql/root.crt")
            return [Problem(f"connection {conn_id!r}", "the pipeline database's server certificate is not trusted: "
                                                       f"no CA in its sslrootcert ({root}) signed it: {said}")]
        return [Problem(f"connection {conn_id!r}", f"the pipeline database refuses it: {said}",
                        passing=not any(lasting in said for lasting in LASTING_REFUSALS))]
    except psycopg2.ProgrammingError as unusable:  # e.g. an extra that is no libpq parameter
        said = " ".join(str(unusable).split())
        return [Problem(f"connection {conn_id!r}", f"libpq refuses it: {said}")]
    return []


# What PostgreSQL says (libpq gives no SQLSTATE at connect) when a login cannot work as it is
# configured: a wrong password or user, a database that does not exist, no pg_hba.conf entry;
# and what libpq says when TLS cannot work as configured: a server certificate that does not
# name the host (sslmode=verify-full), an sslrootcert, sslcert or sslkey it cannot read, a
# server without TLS when sslmode requires it.
UNTRUSTED_CERTIFICATE = "certificate verify failed"
LASTING_REFUSALS = ("authentication failed", "does not exist", "pg_hba.conf", "permission denied",
                    UNTRUSTED_CERTIFICATE, "does not match host name", "certificate file", "private key file",
                    "does not support SSL")


def _defined(conn_id: str) -> bool:
    try:
        BaseHook.get_connection(conn_id)
    except AirflowNotFoundException:
        return False
    return True
