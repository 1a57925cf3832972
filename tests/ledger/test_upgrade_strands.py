"""Issue 60, item 1: an upgrade never strands a checkpoint pre-committed before it (promise 13).

Two ways it did: the pre-committed rows sat in staging tables of the naming rule before
issue 36 (`stg_<pipeline>_<sink>`), which only a begin's registration moved, so the commit
task of that checkpoint (no begin runs before it) read today's name and stalled on 42P01; and
the configuration version it ran with was validated again by rules added since, so a pipeline
with two topics and an upsert ordered by offset raised `ConfigError` at every commit. Real
Kafka and PostgreSQL; the harness's driver plays the Spark job, the commit goes through the
commit task's own run path (`tasks.commit_checkpoint`).
"""

from __future__ import annotations

import json

from psycopg2 import sql

from exactly_once.ledger.checkpoints import Outcome, State
from exactly_once.ledger.migrate import migrate_through
from exactly_once.ledger.tables import contributions_table, staging_name, staging_table
from exactly_once.orchestration import tasks
from tests.ledger.harness import Pipeline, query, workload
from tests.ledger.test_staging_names import as_before_the_upgrade, exists, ledger_tables, old_rule

ADOPTION = "0017_staging_under_earlier_names_adopted"


def test_the_migrations_naming_rule_is_the_librarys(ledger_db):
    long = "p" * 40
    for pipeline, sink in (("orders", "totals"), (long, "s" * 40), (long, "s" * 39)):
        for prefix in ("stg", "ctb"):
            [(named,)] = query(ledger_db, "SELECT exactly_once.ledger_table_name(%s, %s, %s)",
                               prefix + str(len(pipeline)), pipeline, sink)
            assert named == staging_name(pipeline, sink, prefix)


def test_a_checkpoint_pre_committed_under_the_earlier_names_is_committed_by_its_own_commit_task(
        ledger_db, kafka_servers, topic):
    pipeline = Pipeline(ledger_db, kafka_servers, topic)
    pipeline.produce(workload(0))
    pipeline.run_once()  # committed: its upsert and aggregate contributions are kept
    pipeline.produce(workload(1000))
    checkpoint_id = pipeline.begin().checkpoint.id
    pipeline.driver.run(checkpoint_id)
    as_before_the_upgrade(ledger_db, (pipeline,))
    upsert = next(s.name for s in pipeline.config.sinks if s.mode == "upsert")
    for kind in ("stg", "ctb"):  # the release before migration 0010 gave them no tombstone mark
        query(ledger_db, sql.SQL("ALTER TABLE {} DROP COLUMN kafka_tombstone").format(old_rule(kind, pipeline, upsert)))
    query(ledger_db, "DELETE FROM exactly_once.schema_migrations WHERE version = %s", ADOPTION)

    assert tasks.commit_checkpoint(pipeline.ledger, checkpoint_id, 1) is Outcome.COMMITTED
    assert pipeline.ledger.checkpoint(checkpoint_id).state is State.COMMITTED
    pipeline.assert_exact()
    for kind, sink in ledger_tables(pipeline):
        assert not exists(ledger_db, old_rule(kind, pipeline, sink)), "an emptied earlier table is dropped"
    pipeline.produce(workload(2000))
    pipeline.run_once()  # registration brings the moved tables' indexes and triggers
    pipeline.assert_exact()


def test_a_version_recorded_before_a_rule_existed_is_promoted_by_the_rules_it_ran_with(ledger_db, kafka_servers,
                                                                                     topic):
    """Several topics with an upsert sink ordered by offset are refused since issue 36; a
    version recorded before that rule is still the contract its checkpoint ran under."""
    pipeline = Pipeline(ledger_db, kafka_servers, topic)
    pipeline.produce(workload(0))
    checkpoint_id = pipeline.begin().checkpoint.id
    pipeline.driver.run(checkpoint_id)
    [(version, config)] = query(ledger_db, "SELECT a.config_version, v.config FROM exactly_once.attempts a "
                                           "JOIN exactly_once.config_versions v ON v.version = a.config_version "
                                           "AND v.pipeline = %s WHERE a.checkpoint_id = %s",
                                pipeline.config.name, checkpoint_id)
    config["source"]["topics"] = [topic, f"{topic}_other"]  # as an older release recorded it
    query(ledger_db, "UPDATE exactly_once.config_versions SET config = %s WHERE pipeline = %s AND version = %s",
          json.dumps(config), pipeline.config.name, version)

    assert tasks.commit_checkpoint(pipeline.ledger, checkpoint_id, 1) is Outcome.COMMITTED
    pipeline.assert_exact()


def test_the_adoption_changes_nothing_where_there_is_nothing_to_adopt(ledger_db, kafka_servers, topic):
    pipeline = Pipeline(ledger_db, kafka_servers, topic)
    pipeline.produce(workload(0))
    pipeline.run_once()
    tables = [*(staging_table(pipeline.config, s.name) for s in pipeline.config.sinks),
              *(contributions_table(pipeline.config, s) for s in pipeline.config.sinks if s.keys)]

    def counts() -> list:
        return [query(ledger_db, sql.SQL("SELECT count(*) FROM {}").format(t)) for t in tables]

    before = counts()
    query(ledger_db, "DELETE FROM exactly_once.schema_migrations WHERE version = %s", ADOPTION)
    assert migrate_through(pipeline.ledger.connect) == [ADOPTION]
    assert counts() == before
    pipeline.assert_exact()
