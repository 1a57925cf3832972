"""Least privilege (issue 43): a hostile transform (tests/spark/hostile.py) — the transform
function on the driver and a Python UDF on the executors — looks for credentials the way an
attacker would and uses whatever it finds to write a final table, mark a checkpoint
committed, or update or delete staging. The job runs as the Airflow task runs it
(`job_settings` from the task's connections, `job_runner`), on local[2], a standalone
cluster and Spark Connect: all it finds is the job role, PostgreSQL refuses each write,
and the checkpoint still commits exactly once through the commit role."""

from __future__ import annotations

import json
from contextlib import closing

import psycopg2
import pytest

from exactly_once.ledger.checkpoints import State
from exactly_once.ledger.tables import final_table, qualified, staging_tables
from exactly_once.spark.runners import job_runner, job_settings
from exactly_once_stack import spark_cluster
from exactly_once_stack.settings import spark_connection
from tests.job_role import job_db_url
from tests.spark import hostile
from tests.spark.poison import Orders, valid_orders

SPARK = "spark_least_privilege"  # the Airflow connection the test gives the job's Spark


@pytest.fixture
def orders(ledger_db, kafka_servers, topic) -> Orders:
    pipeline = Orders(ledger_db, kafka_servers, topic, transform="tests.spark.hostile:hostile")
    hostile.aim([qualified(final_table(sink)) for sink in pipeline.config.sinks],
                [qualified(table) for table in staging_tables(pipeline.config).values()], pipeline.config.name)
    return pipeline


@pytest.fixture
def cluster(request, stack_env):
    """The Spark the job runs on, started if it is not running (and stopped after)."""
    mode = request.param
    started = spark_cluster.start(mode) if mode != "local" else []
    yield spark_connection(mode)
    spark_cluster.stop_named(started)


@pytest.mark.parametrize("cluster", ["local", pytest.param("standalone", marks=pytest.mark.variant),
                                     pytest.param("connect", marks=pytest.mark.variant)], indirect=True)
def test_a_hostile_transform_finds_only_the_job_role_which_may_write_no_final_table_nor_the_ledger(
        orders, cluster, monkeypatch):
    monkeypatch.setenv(f"AIRFLOW_CONN_{SPARK.upper()}", json.dumps(cluster))
    runner = job_runner(SPARK, f"{orders.config.name} increment", orders.config, job_settings(orders.config))
    orders.produce(valid_orders(0, 12))

    checkpoint_id = orders.run(runner=runner)

    attacks = hostile.results()
    searched = [a for a in attacks if "searched" in a]
    assert {a["where"] for a in searched} == {"driver", "udf"}, searched  # the attacker ran on both sides
    tried = [a for a in attacks if "statement" in a]
    assert {a["role"] for a in tried} == {"pipeline_job"}, {(a["source"], a.get("role")) for a in tried}
    statements = {a["statement"] for a in tried}
    assert len(statements) == len(orders.config.sinks) + 1 + 2 * (len(orders.config.sinks) + 1)
    allowed = [(a["where"], a["source"], a["statement"], a["said"]) for a in tried
               if a["sqlstate"] != hostile.REFUSED or not a["said"].startswith("permission denied for table")]
    assert allowed == []
    assert orders.ledger.checkpoint(checkpoint_id).state is State.COMMITTED
    orders.assert_exact()


def test_the_attack_would_work_with_the_commit_roles_credentials(orders):
    """A test of the test: as the ledger's owner the same statements pass the privilege checks
    (and are rolled back); only staging's own trigger refuses an UPDATE."""
    orders.ledger.register()
    targets = json.loads((hostile.ATTACKS / "targets.json").read_text())
    outcomes = hostile.attack(orders.db_url, targets)
    assert len(outcomes) == len(orders.config.sinks) + 1 + 2 * (len(orders.config.sinks) + 1)
    for o in outcomes:
        if o["sqlstate"] == hostile.REFUSED:  # only staging's triggers: insert-only, pre-committed rows frozen
            assert "stg" in o["statement"] or "staging" in o["statement"], o
            assert not o["said"].startswith("permission denied"), o
        else:  # allowed, or past the privilege check: a NOT NULL column refuses DEFAULT VALUES
            assert o["sqlstate"] in (None, "23502"), o


def test_the_job_roles_staging_functions_act_only_for_the_running_attempt_that_shows_its_token(orders):
    """One job role serves every pipeline: a job may delete, settle or try only its own attempt's rows."""
    orders.produce(valid_orders(0, 3))
    checkpoint_id = orders.begin()
    attempt = orders.ledger.start_attempt(checkpoint_id).attempt
    token = orders.ledger.attempt_token(checkpoint_id, attempt)
    staging = qualified(staging_tables(orders.config)["orders"])
    final = qualified(final_table(orders.config.sink("orders")))
    with closing(psycopg2.connect(job_db_url())) as conn, conn.cursor() as cur:
        for statement, params, refusal in [
                (DISCARD, (staging, checkpoint_id, attempt, "a guess"), "not the token of attempt"),
                (DISCARD, (staging, checkpoint_id, attempt, orders.ledger.attempt_token(checkpoint_id, attempt + 1)),
                 "not the token of attempt"),
                (TRY, (checkpoint_id, -attempt, ["orders"], "a guess"), "not the token of attempt"),
                (DISCARD, (staging, checkpoint_id, attempt + 1, token), "not its running attempt"),
                (DISCARD, (final, checkpoint_id, attempt, token), "is no staging table"),
                (SETTLE, (staging, checkpoint_id, attempt, "a guess", [], 0), "not the token of attempt"),
                (SETTLE, (final, checkpoint_id, attempt, token, [], 0), "is no staging table"),
                ("SELECT exactly_once.attempt_token(%s, %s)", (checkpoint_id, attempt), "permission denied")]:
            with pytest.raises(psycopg2.errors.InsufficientPrivilege, match=refusal):
                cur.execute(statement, params)
            conn.rollback()
        cur.execute(DISCARD, (staging, checkpoint_id, -attempt, token))  # its own probe's rows: none yet
        assert cur.fetchone() == (0,)
        cur.execute(SETTLE, (staging, checkpoint_id, attempt, token, [], 0))  # nothing staged: nothing settled
        assert cur.fetchone() == (0,)
        cur.execute(TRY, (checkpoint_id, attempt, ["orders"], token))  # nothing staged: nothing refused
        assert cur.fetchall() == []


DISCARD = "SELECT exactly_once.discard_staged(%s::regclass, %s, %s, %s)"
SETTLE = "SELECT exactly_once.settle_staged(%s::regclass, %s, %s, %s, %s::bigint[], %s)"
TRY = "SELECT * FROM exactly_once.trial_promote(%s, %s, %s, %s)"
