"""Promise 10 on the protocol (real Kafka and PostgreSQL; the harness's driver plays the
Spark job): a committed checkpoint reprocessed with a new transform replaces its
contribution to every sink — append rows, upsert winners, aggregate groups, dead letters —
so the tables equal the oracle with each checkpoint's latest configuration, after any
number of reprocessings, in any order, beside new checkpoints."""

from __future__ import annotations

from contextlib import closing

import psycopg2
import pytest

from exactly_once.config import load_config
from exactly_once.kafka_client import KafkaClient
from exactly_once.ledger import replays
from exactly_once.ledger.checkpoints import Outcome, State
from exactly_once.ledger.kafka_offsets import KafkaOffsets
from exactly_once.ledger.protocol import Ledger
from exactly_once.ledger.refusals import NotReprocessable
from exactly_once.ledger.versions import config_version
from exactly_once.orchestration import tasks
from tests import oracle
from tests.ledger.harness import Pipeline, committed_records, row_of, workload
from tests.oracle import DROPPED, Record


def row_of_v2(record: Record) -> dict | None:
    """The fixed transform: drops every record whose n is a multiple of 3 (among them keys'
    newest records, which their upsert rows came from), moves odd n to an upper-case key
    (new aggregate groups), and totals ten times n."""
    row = row_of(record)
    if row is None or row["n"] % 3 == 0:
        return row if row is None else DROPPED
    k = row["k"].upper() if row["n"] % 2 else row["k"]
    return {**row, "k": k, "total": 10 * row["n"]}


def query(pipeline: Pipeline, statement: str, *params) -> list[tuple]:
    with closing(psycopg2.connect(pipeline.db_url)) as conn, conn, conn.cursor() as cur:
        cur.execute(statement, params)
        return cur.fetchall() if cur.description else []


def reprocess(pipeline: Pipeline, ledger: Ledger, checkpoint_id: int, run_id: str) -> int:
    """What a reprocessing run does (tasks.begin_checkpoint with `reprocess`), with the
    driver playing the fixed transform; the reprocessing's checkpoint id."""
    pipeline.driver.ledger, pipeline.driver.row_of = ledger, row_of_v2
    with KafkaOffsets(KafkaClient.at(pipeline.servers)) as kafka:
        begun = tasks.begin_checkpoint(ledger, kafka, run_id, None, None, reprocess=True)
    assert begun.checkpoint.replays == checkpoint_id and begun.new
    tasks.run_increment(ledger, begun.checkpoint.id, pipeline.driver.execute)
    assert tasks.commit_checkpoint(ledger, begun.checkpoint.id, 1) is Outcome.COMMITTED
    return begun.checkpoint.id


def assert_latest_logic(pipeline: Pipeline, fixed: set[int]) -> None:
    """The tables equal the oracle: v2 for the records of the `fixed` checkpoints' ranges, v1 elsewhere."""
    ranges = [r for checkpoint_id in fixed for r in pipeline.ledger.checkpoint(checkpoint_id).ranges]

    def latest(record: Record):
        return (row_of_v2 if oracle.in_ranges(record, ranges) else row_of)(record)

    expected = oracle.expected(pipeline.config, committed_records(pipeline.produced, pipeline.topic), latest)
    oracle.assert_exact(expected, pipeline.actual())


@pytest.fixture
def three_checkpoints(ledger_db, kafka_servers, topic):
    pipeline = Pipeline(ledger_db, kafka_servers, topic)
    ids = []
    for first in (0, 1000, 2000):
        pipeline.produce(workload(first))
        ids.append(pipeline.run_once())
    pipeline.assert_exact()
    fixed = Ledger(load_config({**pipeline.config.model_dump(), "transform": "tests.spark.transforms:measures_v2"}),
                   pipeline.ledger.connect)
    return pipeline, fixed, ids


def test_reprocessing_the_middle_checkpoint_replaces_its_rows_in_every_sink_and_again_changes_nothing(
        three_checkpoints):
    pipeline, fixed, (first, middle, last) = three_checkpoints
    before = pipeline.actual()
    reprocessing = reprocess(pipeline, fixed, middle, "run2")
    assert_latest_logic(pipeline, {middle})
    assert pipeline.actual() != before

    # The ledger's history: which checkpoint, by which run, with which configuration, rows taken back and put in.
    [(replayed, run, state, replaced, version)] = query(
        pipeline, "SELECT k.replays, k.dag_run_id, k.state::text, k.replaced, a.config_version "
                  "FROM exactly_once.checkpoints k JOIN exactly_once.attempts a ON a.checkpoint_id = k.id "
                  "WHERE k.id = %s", reprocessing)
    assert (replayed, run, state, version) == (middle, "run2", "committed", config_version(fixed.config))
    assert version != config_version(pipeline.config)
    assert set(replaced) == {"events", "latest", "totals", "_dead_letters"}
    assert replaced["events"]["new"] < replaced["events"]["old"]  # v2 drops records
    assert replaced["_dead_letters"] == {"old": 2, "new": 2}
    assert replays.latest_processing(fixed, middle) == (reprocessing, config_version(fixed.config))

    after = pipeline.actual()
    reprocess(pipeline, fixed, middle, "run2")
    assert pipeline.actual() == after


def test_reprocessings_in_any_order_beside_a_new_checkpoint_leave_the_latest_logic_everywhere(three_checkpoints):
    pipeline, fixed, (first, middle, last) = three_checkpoints
    reprocess(pipeline, fixed, last, "run3")
    pipeline.produce(workload(3000))
    pipeline.driver.row_of = row_of  # a scheduled run, still on v1, between the reprocessings
    fourth = pipeline.run_once()
    reprocess(pipeline, fixed, first, "run1")
    reprocess(pipeline, fixed, middle, "run2")
    assert_latest_logic(pipeline, {first, middle, last})
    assert fourth not in {first, middle, last}


def test_a_reprocessing_pre_committed_when_a_new_checkpoint_commits_is_committed_by_recovery(three_checkpoints):
    pipeline, fixed, (first, middle, last) = three_checkpoints
    pipeline.driver.ledger, pipeline.driver.row_of = fixed, row_of_v2
    reprocessing = replays.reprocess(fixed, middle, "run2").checkpoint.id
    pipeline.driver.run(reprocessing)  # pre-committed; its commit task never ran
    assert fixed.checkpoint(reprocessing).state is State.PRECOMMITTED
    pipeline.produce(workload(3000))
    pipeline.driver.ledger, pipeline.driver.row_of = pipeline.ledger, row_of
    pipeline.run_once()  # its recovery commits the reprocessing first
    assert fixed.checkpoint(reprocessing).state is State.COMMITTED
    assert_latest_logic(pipeline, {middle})


def test_a_run_without_the_parameter_and_an_uncommitted_checkpoint_are_not_reprocessed(three_checkpoints):
    pipeline, fixed, (first, middle, last) = three_checkpoints
    before = pipeline.actual()
    with KafkaOffsets(KafkaClient.at(pipeline.servers)) as kafka:
        begun = tasks.begin_checkpoint(fixed, kafka, "run2", None, None)
    assert begun.checkpoint.id == middle and begun.checkpoint.state is State.COMMITTED
    assert pipeline.actual() == before
    pipeline.produce(workload(3000))
    open_one = pipeline.begin().checkpoint.id
    with pytest.raises(NotReprocessable, match=f"checkpoint {open_one} is planned: only a committed checkpoint"):
        replays.reprocess(fixed, open_one, "cli")


def test_keyed_sinks_are_not_reprocessed_while_a_checkpoint_committed_before_contributions_were_kept_has_records(
        three_checkpoints):
    pipeline, fixed, (first, middle, last) = three_checkpoints
    before = pipeline.actual()
    query(pipeline, "UPDATE exactly_once.checkpoints SET contributions_kept = false WHERE id = %s", first)
    with pytest.raises(NotReprocessable, match=rf"checkpoint\(s\) {first} were committed before each checkpoint's "
                                               r"contribution was kept.*\['latest', 'totals'\]"):
        replays.reprocess(fixed, middle, "run2")
    assert pipeline.actual() == before


def test_a_keyed_sink_whose_key_takes_null_is_not_reprocessed(three_checkpoints):
    pipeline, fixed, (first, middle, last) = three_checkpoints
    query(pipeline, f"ALTER TABLE {pipeline.config.sink('latest').table} DROP CONSTRAINT latest_pkey, "
                    "ALTER COLUMN k DROP NOT NULL, ADD UNIQUE (k)")
    with pytest.raises(NotReprocessable, match=r"key column\(s\) \['latest.k'\] take NULL"):
        replays.reprocess(fixed, middle, "run2")
