"""The local PostgreSQL over TLS: a plaintext TCP connection is refused; psycopg2 (libpq) and
pgjdbc (Spark's JDBC source) connect with `sslmode=verify-full` and the stack's CA, as every
connection the stack defines does; another CA is not trusted, and the preflight says so naming
the connection. And the least-privilege login roles: who may connect where."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from contextlib import closing
from urllib.parse import urlencode

import psycopg2
import pytest

from exactly_once.connections import connection_problems, connector, pipeline_db_url
from exactly_once.db import jdbc_options
from exactly_once_stack import postgres, tls
from exactly_once_stack.settings import LOOPBACK, ROOT, TLS, db_url, passwords, ports

CONNECTIONS = {"pipeline_db": "pipeline", "pipeline_db_job": "pipeline_job", "pipeline_db_read": "pipeline_read"}
IN_TLS = "SELECT ssl, current_user FROM pg_stat_ssl WHERE pid = pg_backend_pid()"


def url(login: str, database: str = "pipeline", **query: str) -> str:
    """`login`'s libpq URI of `database` on the stack's server, with `query` (no TLS settings
    unless given)."""
    base = f"postgresql://{login}:{passwords()[login]}@{LOOPBACK}:{ports()['postgres']}/{database}"
    return f"{base}?{urlencode(query, safe='/')}" if query else base


def test_the_superuser_cannot_log_in_over_tcp_even_with_tls(stack_env):
    with pytest.raises(psycopg2.OperationalError, match=f'no pg_hba.conf entry for host "{LOOPBACK}", '
                                                        'user "postgres", database "pipeline", SSL encryption'):
        psycopg2.connect(url("postgres", "pipeline", sslmode="verify-full", sslrootcert=str(TLS.ca)))


@pytest.mark.parametrize("login", ["pipeline", "pipeline_job", "pipeline_read", "airflow"])
def test_a_plaintext_tcp_connection_is_refused(stack_env, login):
    database = "airflow" if login == "airflow" else "pipeline"
    with pytest.raises(psycopg2.OperationalError, match=rf'no pg_hba.conf entry for host "{LOOPBACK}", '
                                                        rf'user "{login}", database "{database}", no encryption'):
        psycopg2.connect(url(login, database, sslmode="disable"))


def test_the_server_takes_tls_only_over_tcp_and_only_for_the_pipelines_and_airflows_roles(stack_env):
    with closing(postgres.connect_admin()) as conn, conn.cursor() as cur:
        cur.execute("SELECT type, database, user_name, address, auth_method FROM pg_hba_file_rules "
                    "ORDER BY line_number")
        assert cur.fetchall() == [("local", ["all"], ["postgres"], None, "trust"),
                                  ("hostssl", ["pipeline"], ["pipeline", "pipeline_job", "pipeline_read"], LOOPBACK,
                                   "scram-sha-256"),
                                  # the upgrade test's ledger (tests/upgrade/test_upgrade.py)
                                  ("hostssl", ["pipeline_upgrade"], ["pipeline", "pipeline_job", "pipeline_read"],
                                   LOOPBACK, "scram-sha-256"),
                                  ("hostssl", ["airflow"], ["airflow"], LOOPBACK, "scram-sha-256"),
                                  ("hostssl", ["source"], ["source", "cdc_capture"], LOOPBACK, "scram-sha-256")]
        # On the server's command line: above postgresql.conf and an older checkout's postgresql.auto.conf.
        cur.execute("SELECT name, setting, source FROM pg_settings WHERE name IN ('ssl', 'ssl_cert_file') "
                    "ORDER BY name")
        assert cur.fetchall() == [("ssl", "on", "command line"),
                                  ("ssl_cert_file", str(postgres.SERVER_CERT), "command line")]
    assert postgres.SERVER_CERT.read_bytes() == TLS.certificate("postgres").read_bytes()


def test_every_stack_connection_verifies_the_server_with_the_stacks_ca(stack_env):
    for conn_id, login in CONNECTIONS.items():
        extra = json.loads(stack_env[f"AIRFLOW_CONN_{conn_id.upper()}"])["extra"]
        assert extra == {"sslmode": "verify-full", "sslrootcert": str(TLS.ca)}, conn_id
        with closing(connector(conn_id)()) as conn, conn.cursor() as cur:
            assert conn.info.ssl_in_use and conn.info.ssl_attribute("protocol").startswith("TLSv1.")
            cur.execute(IN_TLS)
            assert cur.fetchone() == (True, login), conn_id
        assert pipeline_db_url(conn_id).endswith(f"?sslmode=verify-full&sslrootcert={TLS.ca}".replace("/", "%2F"))
    for name, address in (("PIPELINE_DB_URL", stack_env["PIPELINE_DB_URL"]),
                          ("the metadata database", stack_env["AIRFLOW__DATABASE__SQL_ALCHEMY_CONN"]
                           .replace("postgresql+psycopg2://", "postgresql://"))):
        assert address.endswith(f"?sslmode=verify-full&sslrootcert={TLS.ca}"), name
        with closing(psycopg2.connect(address)) as conn, conn.cursor() as cur:
            cur.execute(IN_TLS)
            assert cur.fetchone()[0] is True, name


# Airflow's two engines on its metadata database: psycopg2 (sql_alchemy_conn) and asyncpg
# (sql_alchemy_conn_async, the execution API's), each asked whether its connection is in TLS.
AIRFLOW_ENGINES = """
import asyncio
from sqlalchemy import text
from airflow import settings

IN_TLS = text("SELECT ssl FROM pg_stat_ssl WHERE pid = pg_backend_pid()")
settings.configure_orm()
with settings.Session() as session:
    print("sync", session.execute(IN_TLS).scalar())

async def main():
    try:
        async with settings.AsyncSession() as session:
            print("async", (await session.execute(IN_TLS)).scalar())
    finally:
        await settings.async_engine.dispose()

asyncio.run(main())
"""


def test_airflows_engines_verify_the_metadata_database_with_the_stacks_ca(stack_env, tmp_path):
    def engines(**env: str) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, "-c", AIRFLOW_ENGINES], env={**stack_env, **env}, cwd=ROOT,
                              capture_output=True, text=True, timeout=180)

    both = engines()
    assert both.stdout.splitlines() == ["sync True", "async True"], both.stderr[-3000:]
    other = tls.make_ca(tmp_path, "a CA the server does not use")  # asyncpg's CA: PGSSLROOTCERT
    refused = engines(PGSSLROOTCERT=str(other.ca))
    assert refused.returncode != 0 and refused.stdout.splitlines() == ["sync True"]
    assert "certificate verify failed" in refused.stderr, refused.stderr[-3000:]


def test_a_server_certificate_of_another_ca_is_not_trusted_and_the_preflight_names_the_connection(
        stack_env, tmp_path, monkeypatch):
    other = tls.make_ca(tmp_path, "a CA the server does not use")
    with pytest.raises(psycopg2.OperationalError, match="SSL error: certificate verify failed"):
        psycopg2.connect(url("pipeline", sslmode="verify-full", sslrootcert=str(other.ca)))
    settings = json.loads(os.environ["AIRFLOW_CONN_PIPELINE_DB"])
    monkeypatch.setenv("AIRFLOW_CONN_PIPELINE_DB", json.dumps(
        {**settings, "extra": {**settings["extra"], "sslrootcert": str(other.ca)}}))
    [untrusted] = connection_problems(("pipeline_db",))
    assert str(untrusted).startswith(
        "connection 'pipeline_db': the pipeline database's server certificate is not trusted: no CA in its "
        f"sslrootcert ({other.ca}) signed it: connection to server at \"{LOOPBACK}\", port {ports()['postgres']} "
        "failed: SSL error: certificate verify failed"), str(untrusted)
    assert not untrusted.passing and passwords()["pipeline"] not in str(untrusted)


def test_the_least_privilege_logins_connect_to_the_pipeline_database_only(stack_env):
    with closing(postgres.connect_admin()) as conn, conn.cursor() as cur:
        cur.execute("SELECT rolname, rolcanlogin FROM pg_roles WHERE rolname LIKE 'exactly\\_once\\_%' ORDER BY 1")
        assert cur.fetchall() == [("exactly_once_job", False), ("exactly_once_read", False)]
        cur.execute("SELECT pg_has_role('pipeline_job', 'exactly_once_job', 'MEMBER'), "
                    "pg_has_role('pipeline_read', 'exactly_once_read', 'MEMBER'), "
                    "pg_has_role('pipeline_job', 'exactly_once_read', 'MEMBER')")
        assert cur.fetchone() == (True, True, False)
        # CONNECT is no longer PUBLIC's: each login may connect to its own database only.
        cur.execute("SELECT r.rolname, d.datname FROM pg_roles r CROSS JOIN pg_database d "
                    "WHERE r.rolname IN ('pipeline', 'pipeline_job', 'pipeline_read', 'airflow') "
                    "AND d.datname IN ('pipeline', 'airflow') AND has_database_privilege(r.oid, d.oid, 'CONNECT') "
                    "ORDER BY 1, 2")
        assert cur.fetchall() == [("airflow", "airflow"), ("pipeline", "pipeline"), ("pipeline_job", "pipeline"),
                                  ("pipeline_read", "pipeline")]
    for login in ("pipeline_job", "pipeline_read", "pipeline"):  # and pg_hba.conf lets no one try
        with pytest.raises(psycopg2.OperationalError, match='no pg_hba.conf entry .* database "airflow"'):
            psycopg2.connect(db_url("airflow", login=login))
    with pytest.raises(psycopg2.OperationalError, match='no pg_hba.conf entry .* database "pipeline"'):
        psycopg2.connect(db_url("pipeline", login="airflow"))


def test_pgjdbc_verifies_the_server_with_the_connections_ca(stack_env, spark, tmp_path, jvm_causes):
    options = jdbc_options(pipeline_db_url())
    assert "sslmode=verify-full" in options["url"] and f"sslrootcert={TLS.ca}".replace("/", "%2F") in options["url"]
    rows = spark.read.format("jdbc").options(**options).option("query", IN_TLS).load().collect()
    assert [tuple(row) for row in rows] == [(True, "pipeline")]

    other = tls.make_ca(tmp_path, "a CA the server does not use")
    untrusted = jdbc_options(pipeline_db_url().replace(str(TLS.ca).replace("/", "%2F"),
                                                       str(other.ca).replace("/", "%2F")))
    with pytest.raises(Exception) as refused:
        spark.read.format("jdbc").options(**untrusted).option("query", IN_TLS).load().collect()
    assert "SSLHandshakeException: PKIX path" in str(refused.value)  # the JVM's: no trusted CA signed it
    # Without TLS, pgjdbc gets no pg_hba.conf entry.
    plaintext = {**options, "url": options["url"].replace("sslmode=verify-full", "sslmode=disable")}
    with pytest.raises(Exception) as refused:
        spark.read.format("jdbc").options(**plaintext).option("query", IN_TLS).load().collect()
    assert f'no pg_hba.conf entry for host "{LOOPBACK}", user "pipeline", database "pipeline", no encryption' in str(
        refused.value)


@pytest.fixture
def jvm_causes(spark):
    """A failed Spark operation's error shows its JVM stack trace, the causes included (Spark
    names only the outermost failure, with the JDBC URL redacted)."""
    key = "spark.sql.pyspark.jvmStacktrace.enabled"
    before = spark.conf.get(key)
    spark.conf.set(key, "true")
    yield
    spark.conf.set(key, before)
