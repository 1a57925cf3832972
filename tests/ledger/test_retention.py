"""Retention (exactly_once.ledger.retention) against the oracle, on real Kafka and PostgreSQL
(the harness's driver plays the Spark job): checkpoints beyond the reprocess horizon are
folded into the pipeline's base and the final tables do not change; a reprocessing inside
the horizon after a fold is as exact as before it, one beyond it is refused naming the
horizon; beyond the history the folded checkpoints are gone and the ledger still commits
every record once; a fold never runs beside a commit, nor folds a checkpoint whose
reprocessing is open."""

from __future__ import annotations

from dataclasses import replace
from datetime import timedelta

import pytest

from exactly_once.config import load_config
from exactly_once.kafka_client import KafkaClient
from exactly_once.ledger import replays, retention
from exactly_once.ledger.checkpoints import Outcome
from exactly_once.ledger.kafka_offsets import KafkaOffsets
from exactly_once.ledger.protocol import Ledger
from exactly_once.ledger.refusals import NotReprocessable
from exactly_once.ledger.tables import DEAD_LETTERS
from exactly_once.orchestration import tasks
from tests import oracle
from tests.ledger.harness import Pipeline, committed_records, row_of, workload
from tests.ledger.machine import Clock
from tests.ledger.paused_steps import Steps, fault_hook
from tests.ledger.test_reprocess import assert_latest_logic, query, reprocess, row_of_v2
from tests.oracle import Record

RETENTION = {"reprocess_horizon": "PT1H", "history": "PT3H", "dead_letters": "PT3H", "batch": 1}
STEP = timedelta(minutes=30)  # between commits: two checkpoints per horizon


def fixed(pipeline: Pipeline, clock: Clock) -> Ledger:
    """The pipeline with the fixed transform (tests/ledger/test_reprocess.py's v2)."""
    config = load_config({**pipeline.config.model_dump(mode="json"), "transform": "tests.spark.transforms:measures_v2"})
    return Ledger(config, pipeline.ledger.connect, clock=clock)


def prune_all(ledger: Ledger) -> list[retention.Pruned]:
    """Steps until one finds nothing to do."""
    steps = [retention.prune(ledger)]
    while not steps[-1].idle:
        assert len(steps) < 50, steps
        steps.append(retention.prune(ledger))
    return steps


def folded(pipeline: Pipeline) -> dict[int, bool]:
    return dict(query(pipeline, "SELECT id, folded_at IS NOT NULL FROM exactly_once.checkpoints "
                                "WHERE pipeline = %s AND dag_run_id <> 'exactly_once:retention-base'",
                      pipeline.config.name))


def contributions_of(pipeline: Pipeline) -> set[int]:
    """The checkpoints the keyed sinks' contributions are kept under."""
    name = pipeline.config.name
    return {checkpoint_id for table in (f"ctb{len(name)}_{name}_latest", f"ctb{len(name)}_{name}_totals")
            for checkpoint_id, in query(pipeline, f"SELECT DISTINCT checkpoint_id FROM exactly_once.{table}")}


def committed_ranges(pipeline: Pipeline) -> list[tuple]:
    return query(pipeline, "SELECT checkpoint_id, partition, from_offset, to_offset FROM exactly_once.committed_ranges "
                           "WHERE pipeline = %s ORDER BY partition, from_offset", pipeline.config.name)


@pytest.fixture
def aged(ledger_db, kafka_servers, topic):
    """Four checkpoints committed half an hour apart, the first followed at once by an empty
    run's (which keeps no contribution: nothing to take back), the clock ten minutes after the
    last."""
    clock = Clock()
    pipeline = Pipeline(ledger_db, kafka_servers, topic, clock=clock, retention=RETENTION)
    ids, empty = [], None
    for first in (0, 1000, 2000, 3000):
        pipeline.produce(workload(first))
        ids.append(pipeline.run_once())
        empty = empty or pipeline.run_once()
        clock.advance(STEP)
    clock.advance(-STEP + timedelta(minutes=10))
    return pipeline, clock, ids, empty


def test_a_fold_changes_no_table_a_reprocessing_inside_the_horizon_is_exact_and_beyond_it_is_refused(aged):
    pipeline, clock, (first, second, third, fourth), empty = aged
    before = pipeline.actual()
    # The commits pruned a step each (a checkpoint at most): the first was beyond the horizon at the fourth's commit.
    assert folded(pipeline) == {first: True, empty: False, second: False, third: False, fourth: False}
    steps = prune_all(pipeline.ledger)
    assert sum(step.folded for step in steps) == 2 and folded(pipeline)[empty] and folded(pipeline)[second]
    [(base, kept)] = query(pipeline, "SELECT id, contributions_kept FROM exactly_once.checkpoints WHERE pipeline = %s "
                                     "AND dag_run_id = 'exactly_once:retention-base'", pipeline.config.name)
    assert kept  # the empty run kept none, and had nothing to keep
    assert contributions_of(pipeline) == {base, third, fourth}
    ranges = committed_ranges(pipeline)
    assert [r for r in ranges if r[0] == base] == [(base, p, 0, to) for c, p, _, to in ranges
                                                   if c == base], "one range per partition"
    assert len({r[1] for r in ranges if r[0] == base}) == len([r for r in ranges if r[0] == base])
    assert pipeline.actual() == before
    pipeline.assert_exact()

    reprocess(pipeline, fixed(pipeline, clock), third, "run4")
    assert_latest_logic(pipeline, {third})
    for beyond in (first, second, base):
        with pytest.raises(NotReprocessable, match=r"reprocess horizon \(retention.reprocess_horizon: PT1H"):
            replays.reprocess(fixed(pipeline, clock), beyond, "a request")
    assert_latest_logic(pipeline, {third})


def assert_v2_within(pipeline: Pipeline, ranges: list, dead_letters_from: list | None = None) -> None:
    """The tables equal the oracle: v2 for the records in `ranges`, v1 elsewhere; with
    `dead_letters_from`, the dead letters of records in those ranges only (the others'
    retention is over)."""
    def latest(record: Record):
        return (row_of_v2 if oracle.in_ranges(record, ranges) else row_of)(record)

    expected = oracle.expected(pipeline.config, committed_records(pipeline.produced, pipeline.topic), latest)
    if dead_letters_from is not None:
        kept = [row for row in expected.tables[DEAD_LETTERS]
                if any(row["topic"] == r.topic and row["partition"] == r.partition
                       and r.start <= row["offset"] < r.end for r in dead_letters_from)]
        expected = replace(expected, tables={**expected.tables, DEAD_LETTERS: kept})
    oracle.assert_exact(expected, pipeline.actual())


def test_beyond_the_history_the_folded_checkpoints_are_gone_and_every_record_still_counts_once(aged):
    pipeline, clock, (first, second, third, fourth), empty = aged
    v2 = fixed(pipeline, clock)
    reprocess(pipeline, v2, fourth, "run5")
    fourth_ranges = list(pipeline.ledger.checkpoint(fourth).ranges)
    clock.advance(timedelta(hours=5))
    steps = prune_all(pipeline.ledger)
    # The reprocessing's commit folded the empty one (the first was already): three are left.
    assert sum(step.folded for step in steps) == 3 and sum(step.deleted for step in steps) == 6
    assert sum(step.dead_letters for step in steps) == 8  # two bad records per checkpoint
    assert folded(pipeline) == {}  # the five and the reprocessing, with their attempts and ranges
    assert query(pipeline, "SELECT count(*) FROM exactly_once.attempts a JOIN exactly_once.checkpoints k "
                           "ON k.id = a.checkpoint_id WHERE k.pipeline = %s", pipeline.config.name) == [(0,)]
    assert_v2_within(pipeline, fourth_ranges, dead_letters_from=[])

    # New records and a fifth checkpoint over the base, reprocessed: exact from the base and it.
    pipeline.produce(workload(4000))
    pipeline.driver.ledger, pipeline.driver.row_of = pipeline.ledger, row_of
    fifth = pipeline.run_once()
    fifth_ranges = list(pipeline.ledger.checkpoint(fifth).ranges)
    assert_v2_within(pipeline, fourth_ranges, dead_letters_from=fifth_ranges)
    reprocess(pipeline, v2, fifth, f"run{pipeline._runs}")
    assert_v2_within(pipeline, fourth_ranges + fifth_ranges, dead_letters_from=fifth_ranges)


def test_a_fold_waits_for_no_commit_and_folds_no_checkpoint_whose_reprocessing_is_open(aged, ledger_db):
    pipeline, clock, (first, second, third, fourth), empty = aged
    steps = Steps(ledger_db)
    try:
        racing = Pipeline(ledger_db, pipeline.servers, pipeline.topic, connect=steps.connect, clock=clock,
                          fault=fault_hook, existing=pipeline.config)
        racing.produced = pipeline.produced
        racing.produce(workload(4000))
        with KafkaOffsets(KafkaClient.at(racing.servers)) as kafka:
            begun = tasks.begin_checkpoint(racing.ledger, kafka, "run6", None, None)
        tasks.run_increment(racing.ledger, begun.checkpoint.id, racing.driver.execute)
        # A commit holds the pipeline's commit lock (paused before its transaction commits): the
        # fold skips its step at once rather than wait, and folds nothing.
        commit = lambda: tasks.commit_checkpoint(racing.ledger, begun.checkpoint.id, 1)  # noqa: E731
        assert steps.run("commit", commit, pause_at="commit.before_commit") is None
        step = retention.prune(pipeline.ledger)  # the second is beyond the horizon
        assert step.busy and step.folded == 0 and folded(pipeline)[second] is False
        assert steps.resume(steps.paused[0]) is Outcome.COMMITTED

        # A reprocessing of the third checkpoint begun inside the horizon keeps it from the fold
        # until it commits; then it folds, and the tables hold its reprocessed rows.
        v2 = fixed(pipeline, clock)
        pipeline.driver.ledger, pipeline.driver.row_of = v2, row_of_v2
        with KafkaOffsets(KafkaClient.at(pipeline.servers)) as kafka:
            reprocessing = tasks.begin_checkpoint(v2, kafka, "run4", None, None, reprocess=True)
        clock.advance(timedelta(minutes=30))  # the third is beyond the horizon now
        prune_all(pipeline.ledger)
        assert folded(pipeline)[third] is False and folded(pipeline)[second] is True
        tasks.run_increment(v2, reprocessing.checkpoint.id, pipeline.driver.execute)
        assert tasks.commit_checkpoint(v2, reprocessing.checkpoint.id, 1) is Outcome.COMMITTED
        prune_all(pipeline.ledger)
        assert folded(pipeline)[third] is True
        assert_latest_logic(pipeline, {third})
    finally:
        steps.close()
