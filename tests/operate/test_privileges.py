"""Issue 43: the preflight compares each pipeline database connection's rights with its duty
(exactly_once.operate.privileges) on the local stack's real roles — the commit role
`pipeline`, the job role `pipeline_job`, the read role `pipeline_read` — naming what is
missing or too much; a run's first task refuses to plan with either."""

from __future__ import annotations

import uuid
from contextlib import closing, contextmanager

import psycopg2
import pytest

from exactly_once.config import load_config
from exactly_once.connections import defined_connector
from exactly_once.kafka_client import KafkaClient
from exactly_once.ledger.kafka_offsets import KafkaOffsets
from exactly_once.ledger.protocol import Ledger
from exactly_once.operate import privileges
from exactly_once.orchestration import tasks
from exactly_once.problems import PreflightFailed
from exactly_once_stack.postgres import connect_admin


@pytest.fixture
def pipeline(ledger_db, topic):
    """A registered pipeline with one append sink in a schema of its own, owned by the commit role."""
    name = f"p{uuid.uuid4().hex[:10]}"
    with closing(psycopg2.connect(ledger_db)) as conn, conn, conn.cursor() as cur:
        cur.execute(f"CREATE SCHEMA {name}; CREATE TABLE {name}.events (id text NOT NULL, kafka_topic text NOT NULL, "
                    "kafka_partition int NOT NULL, kafka_offset bigint NOT NULL, "
                    "UNIQUE (kafka_topic, kafka_partition, kafka_offset))")
    config = load_config({"name": name, "source": {"topics": [topic], "value_schema": {"id": "string"}},
                          "sinks": [{"name": "events", "table": f"{name}.events", "mode": "append"}]})
    Ledger(config, lambda: psycopg2.connect(ledger_db)).register()
    return config


@contextmanager
def as_admin(do: str, undo: str):
    """A change of the roles' rights, undone after (the roles belong to the whole server)."""
    with closing(connect_admin("pipeline")) as conn:
        conn.autocommit = True
        with conn.cursor() as cur:
            cur.execute(do)
        try:
            yield
        finally:
            with conn.cursor() as cur:
                cur.execute(undo)


def said(config) -> list[str]:
    return [f"{p.subject}: {p.message}" for p in privileges.problems(config, defined_connector)]


def test_the_stacks_three_connections_hold_exactly_their_duties_rights(pipeline):
    assert said(pipeline) == []


def test_a_write_right_on_a_final_table_is_too_much_for_the_job_role_even_on_one_column(pipeline):
    table = f"{pipeline.name}.events"
    with as_admin(f"GRANT INSERT ON {table} TO exactly_once_job", f"REVOKE INSERT ON {table} FROM exactly_once_job"):
        assert said(pipeline) == [f"connection 'pipeline_db_job': the job role must not hold INSERT on {table}"]
    with as_admin(f"GRANT UPDATE (id) ON {table} TO exactly_once_read",
                  f"REVOKE UPDATE (id) ON {table} FROM exactly_once_read"):
        assert said(pipeline) == [f"connection 'pipeline_db_read': the read role must not hold UPDATE on {table}"]


def test_a_right_the_job_needs_is_named_when_missing(pipeline):
    with as_admin("REVOKE SELECT ON exactly_once.checkpoints FROM exactly_once_job",
                  "GRANT SELECT ON exactly_once.checkpoints TO exactly_once_job"):
        assert said(pipeline) == ["connection 'pipeline_db_job': the job role lacks SELECT on exactly_once.checkpoints"]


def test_a_role_that_may_create_roles_is_more_than_its_grants(pipeline):
    with as_admin("ALTER ROLE pipeline_read CREATEROLE", "ALTER ROLE pipeline_read NOCREATEROLE"):
        assert said(pipeline) == ["connection 'pipeline_db_read': the read role may create roles (CREATEROLE: it "
                                  "could grant itself any role): it must hold its grants and no more"]


def test_a_final_tables_schema_of_another_owner_needs_the_job_roles_usage_named_with_its_grant(pipeline):
    schema = f"{pipeline.name}_other"
    with as_admin(f"CREATE SCHEMA {schema}; GRANT USAGE ON SCHEMA {schema} TO pipeline; "
                  f"CREATE TABLE {schema}.events (LIKE {pipeline.name}.events); "
                  f"GRANT SELECT, INSERT, UPDATE, DELETE ON {schema}.events TO pipeline",
                  f"DROP SCHEMA {schema} CASCADE"):
        moved = load_config({**pipeline.model_dump(mode="json"),
                             "sinks": [{"name": "events", "table": f"{schema}.events", "mode": "append"}]})
        assert said(moved) == [f"connection 'pipeline_db_job': the job role lacks USAGE on schema {schema} "
                               f"(GRANT USAGE ON SCHEMA {schema} TO exactly_once_job)"]


def test_the_first_task_refuses_to_plan_with_a_right_too_much(pipeline, ledger_db, kafka_servers):
    table = f"{pipeline.name}.events"
    ledger = Ledger(pipeline, lambda: psycopg2.connect(ledger_db))
    with as_admin(f"GRANT DELETE ON {table} TO exactly_once_job", f"REVOKE DELETE ON {table} FROM exactly_once_job"):
        with KafkaOffsets(KafkaClient.at(kafka_servers)) as kafka, pytest.raises(PreflightFailed) as refused:
            tasks.begin_checkpoint(ledger, kafka, "run1", None, None, connect_as=defined_connector)
    assert f"the job role must not hold DELETE on {table}" in str(refused.value)
    with closing(psycopg2.connect(ledger_db)) as conn, conn.cursor() as cur:
        cur.execute("SELECT count(*) FROM exactly_once.checkpoints WHERE pipeline = %s", (pipeline.name,))
        assert cur.fetchone() == (0,)  # nothing planned
