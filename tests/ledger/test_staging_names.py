"""Issue 36, item 6: the ledger's tables of a sink are named so that no two pipelines share
one. Under the old rule, `stg_<pipeline>_<sink>`, pipeline `orders_eu` with sink `totals` and
pipeline `orders` with sink `eu_totals` shared `exactly_once.stg_orders_eu_totals` (and
`ctb_orders_eu_totals`), and a reprocessing of one recomputed its keys from both pipelines'
contributions. A pipeline registered under the old rule keeps its rows when it registers
under the new one. Real Kafka and PostgreSQL; the harness's driver plays the Spark job."""

from __future__ import annotations

import uuid

import pytest
from psycopg2 import sql

from exactly_once.config import load_config
from exactly_once.kafka_client import KafkaClient
from exactly_once.ledger.checkpoints import Outcome, State
from exactly_once.ledger.kafka_offsets import KafkaOffsets
from exactly_once.ledger.protocol import Ledger
from exactly_once.ledger.tables import (LEDGER_SCHEMA, contributions_indexes, contributions_table, qualified,
                                        staging_index, staging_table)
from exactly_once.orchestration import tasks
from tests.ledger.harness import Driver, Pipeline, query, workload


def config(name: str, sink: str):
    return load_config({"name": name, "source": {"topics": ["t"], "value_schema": {"k": "string", "n": "bigint"}},
                        "sinks": [{"name": sink, "table": "s.t", "mode": "aggregate", "keys": ["k"],
                                   "measures": {"n": "sum"}}]})


def ledger_names(name: str, sink: str) -> set[str]:
    """Every table and index name of the pipeline's one sink."""
    cfg = config(name, sink)
    [s] = cfg.sinks
    identifiers = [staging_table(cfg, sink), staging_index(cfg, s), contributions_table(cfg, s),
                   *contributions_indexes(cfg, s)]
    return {identifier.strings[-1] for identifier in identifiers}


def test_pipeline_and_sink_names_that_join_alike_get_tables_of_their_own():
    assert not ledger_names("orders_eu", "totals") & ledger_names("orders", "eu_totals")
    splits = [("a", "b_c_d"), ("a_b", "c_d"), ("a_b_c", "d")]  # every split of one joined name
    assert len({frozenset(ledger_names(*split)) for split in splits}) == 3
    assert not set.intersection(*(ledger_names(*split) for split in splits))


def colliding(ledger_db, kafka_servers, topic, name: str, sink_names: dict[str, str]) -> Pipeline:
    """A harness pipeline (its own final tables) under the pipeline name `name`, its sinks renamed."""
    pipeline = Pipeline(ledger_db, kafka_servers, topic)
    dumped = pipeline.config.model_dump()
    pipeline.config = load_config({**dumped, "name": name, "sinks": [
        {**sink, "name": sink_names.get(sink["name"], sink["name"])} for sink in dumped["sinks"]]})
    pipeline.ledger = Ledger(pipeline.config, pipeline.ledger.connect)
    pipeline.driver = Driver(pipeline.ledger, kafka_servers, ledger_db)
    return pipeline


@pytest.fixture
def pair(ledger_db, kafka_servers, topic) -> tuple[Pipeline, Pipeline]:
    """`<base>_eu` with aggregate sink `totals`, and `<base>` with aggregate sink `eu_totals`,
    both on the same committed records: `stg_<base>_eu_totals` under the old rule."""
    base = f"p{uuid.uuid4().hex[:10]}"
    first = colliding(ledger_db, kafka_servers, topic, f"{base}_eu", {})
    second = colliding(ledger_db, kafka_servers, topic, base, {"totals": "eu_totals"})
    first.produce(workload(0))
    second.produced = first.produced  # one list, which later records go into too
    return first, second


def reprocess(pipeline: Pipeline, run_id: str) -> None:
    """The run's committed checkpoint reprocessed with the same configuration: nothing may change."""
    with KafkaOffsets(KafkaClient.at(pipeline.servers)) as kafka:
        begun = tasks.begin_checkpoint(pipeline.ledger, kafka, run_id, None, None, reprocess=True)
    assert begun.checkpoint.replays is not None and begun.new
    tasks.run_increment(pipeline.ledger, begun.checkpoint.id, pipeline.driver.execute)
    assert tasks.commit_checkpoint(pipeline.ledger, begun.checkpoint.id, 1) is Outcome.COMMITTED


def test_a_reprocessing_recomputes_from_its_own_pipelines_contributions_only(pair):
    first, second = pair
    for pipeline in pair:
        pipeline.run_once()
        pipeline.assert_exact()
    reprocess(first, "run1")
    first.assert_exact()
    second.assert_exact()


def old_rule(kind: str, pipeline: Pipeline, sink: str) -> sql.Identifier:
    """The table of a sink under the rule before issue 36 (the names here are short: no hash)."""
    return sql.Identifier(LEDGER_SCHEMA, f"{kind}_{pipeline.config.name}_{sink}")


def ledger_tables(pipeline: Pipeline) -> dict[tuple[str, str], sql.Identifier]:
    """(kind, sink) -> the table the current rule names, for every staging and contributions table."""
    cfg = pipeline.config
    tables = {("stg", s.name): staging_table(cfg, s.name) for s in cfg.sinks}
    return {**tables, **{("ctb", s.name): contributions_table(cfg, s) for s in cfg.sinks if s.keys}}


def as_before_the_upgrade(db_url: str, pipelines: tuple[Pipeline, ...]) -> None:
    """Moves every row of the pipelines' staging and contributions tables into tables named
    by the old rule, as the previous release had them (pipelines whose names join alike
    sharing one), and drops the tables of the current rule."""
    for pipeline in pipelines:
        for (kind, sink), table in ledger_tables(pipeline).items():
            old = old_rule(kind, pipeline, sink)
            assert table != old, f"{table.strings[-1]} is still named by the old rule"
            query(db_url, sql.SQL("CREATE TABLE IF NOT EXISTS {old} (LIKE {table} INCLUDING INDEXES); "
                                  "INSERT INTO {old} SELECT * FROM {table}; DROP TABLE {table}").format(
                old=old, table=table))


def exists(db_url: str, table: sql.Identifier) -> bool:
    [(found,)] = query(db_url, "SELECT to_regclass(%s) IS NOT NULL", qualified(table))
    return found


def test_pipelines_registered_under_the_old_rule_keep_their_pre_committed_rows_and_contributions(pair, ledger_db):
    first, second = pair
    for pipeline in pair:
        pipeline.run_once()  # committed: its contributions are kept
    first.produce(workload(1000))
    pre_committed = {pipeline: pipeline.begin().checkpoint.id for pipeline in pair}
    for pipeline in pair:
        pipeline.driver.run(pre_committed[pipeline])
    as_before_the_upgrade(ledger_db, pair)
    shared = old_rule("stg", first, "totals")
    assert shared == old_rule("stg", second, "eu_totals") and exists(ledger_db, shared)

    first.run_once()  # registers under the new rule, then its recovery commits the pre-committed checkpoint
    assert first.ledger.checkpoint(pre_committed[first]).state is State.COMMITTED
    first.assert_exact()
    assert exists(ledger_db, shared), "the other pipeline's rows are still in it"
    second.run_once()
    assert second.ledger.checkpoint(pre_committed[second]).state is State.COMMITTED
    second.assert_exact()
    for pipeline in pair:
        for kind, sink in ledger_tables(pipeline):
            assert not exists(ledger_db, old_rule(kind, pipeline, sink)), "an emptied old table is dropped"
    reprocess(first, "run1")  # recomputed from the contributions the upgrade kept, its own only
    first.assert_exact()
    second.assert_exact()
