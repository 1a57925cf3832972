"""A Kafka connection the brokers refuse fails the run's first task, once and without retry,
naming the connection and the cause, before any checkpoint is planned: a CA that did not sign
the brokers' certificate, a broker's certificate that has expired, one for another host, a
wrong SCRAM password. Real TLS handshakes with the stack's broker (its EXPIRED and OTHER_HOST
listeners present such certificates), through `airflow dags test`. A broker that does not
answer is a problem a retry may pass: tests/operate/test_preflight.py."""

from __future__ import annotations

import json
from contextlib import closing
from datetime import datetime, timezone

import psycopg2
import pytest

from exactly_once_demo.oracle import attempts, checkpoints
from exactly_once_demo.produce import produce
from exactly_once_stack import tls
from exactly_once_stack.settings import TLS, environment, ports
from tests.dags.test_orders_exactly_once import dags_test

PASSWORD = "not-the-password"


def refused_connection(case: str, other_ca: tls.TlsFiles) -> dict:
    login = json.loads(environment()["AIRFLOW_CONN_KAFKA_DEFAULT"])["extra"]
    listener = {"bootstrap.servers": "", "security.protocol": "SSL", "ssl.ca.location": str(TLS.ca)}
    return {"conn_type": "kafka", "extra": {
        "wrong CA": {**login, "ssl.ca.location": str(other_ca.ca)},
        "expired": {**listener, "bootstrap.servers": f"127.0.0.1:{ports()['kafka_expired']}"},
        "another host": {**listener, "bootstrap.servers": f"127.0.0.1:{ports()['kafka_other_host']}"},
        "wrong password": {**login, "sasl.password": PASSWORD},
    }[case]}


@pytest.mark.parametrize("case, cause", [
    # Variants: TLS refusals, each another OpenSSL verdict on the path the wrong password's refusal
    # takes in CI (tests/stack/test_kafka.py checks the broker's listeners give these verdicts).
    pytest.param("wrong CA", "self-signed certificate in certificate chain",  # the broker sends its CA in its chain
                 id="wrong CA", marks=pytest.mark.variant),
    pytest.param("expired", "certificate has expired", id="expired", marks=pytest.mark.variant),
    pytest.param("another host", "IP address mismatch, certificate is not valid for '127.0.0.1'", id="another host",
                 marks=pytest.mark.variant),
    pytest.param("wrong password", "SASL authentication error: Authentication failed during authentication due to "
                 "invalid credentials with SASL mechanism SCRAM-SHA-512", id="wrong password",
                 marks=pytest.mark.heavy),  # CI: tests/stack/test_kafka.py, tests/orchestration/test_begin_refusals.py
])
def test_a_refused_connection_fails_the_first_task_once_naming_it_and_the_cause_with_no_checkpoint(
        case, cause, fresh_demo, kafka_servers, tmp_path):
    produce(kafka_servers, 50)
    end = datetime.now(timezone.utc)
    connection = refused_connection(case, tls.make_ca(tmp_path, "a CA the brokers do not use"))
    run = dags_test(end, AIRFLOW_CONN_KAFKA_DEFAULT=json.dumps(connection))
    said = run.stdout + run.stderr
    assert run.returncode != 0
    servers = connection["extra"]["bootstrap.servers"]
    assert f"connection 'kafka_default': the Kafka brokers {servers} refuse it: " in said, said[-4000:]
    assert cause in said, said[-4000:]
    if case != "wrong password":
        assert "the brokers' certificate fails verification with the connection's CA: " + cause in said
    assert PASSWORD not in said
    assert checkpoints(fresh_demo) == [] and attempts(fresh_demo) == 0  # refused before planning
    assert begin_task_tries(end) == ("failed", 1)  # no retry: none would help


def begin_task_tries(logical_date: datetime) -> tuple[str, int]:
    """The state and tries of the begin task of the demo's run at `logical_date`, from
    Airflow's metadata database."""
    url = environment()["AIRFLOW__DATABASE__SQL_ALCHEMY_CONN"].replace("postgresql+psycopg2://", "postgresql://")
    with closing(psycopg2.connect(url)) as conn, conn.cursor() as cur:
        cur.execute("SELECT ti.state, ti.try_number FROM task_instance ti JOIN dag_run r USING (dag_id, run_id) "
                    "WHERE ti.dag_id = 'orders_exactly_once' AND ti.task_id = 'begin_checkpoint' "
                    "AND r.logical_date = %s", (logical_date,))
        return cur.fetchone()
