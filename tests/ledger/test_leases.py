"""Leases against real PostgreSQL and Kafka (issue 36, items 2 and 9): a running attempt
keeps its lease while its task lives, a released range is planned again within the
per-run cap, lease expiries that repeat over the same offsets stall loudly, and a cleared
run resumes its own checkpoint. Every test ends on the oracle."""

from __future__ import annotations

import time
from contextlib import closing
from datetime import datetime, timedelta, timezone

import psycopg2
import pytest

from exactly_once.ledger.checkpoints import Outcome, State, TaskTry
from exactly_once.ledger.invariants import violations
from exactly_once.ledger.refusals import PromotionRefused, Stalled
from exactly_once.orchestration import tasks
from exactly_once.spark.report import AttemptReport
from tests.ledger.harness import Pipeline, query, workload


def assert_exact(pipeline: Pipeline) -> None:
    pipeline.assert_exact()
    with closing(psycopg2.connect(pipeline.db_url)) as conn:
        assert violations(conn, pipeline.config) == []


def aborted(pipeline: Pipeline) -> list[tuple]:
    return query(pipeline.db_url, "SELECT id, reason FROM exactly_once.checkpoints WHERE pipeline = %s "
                                  "AND state = 'aborted' ORDER BY id", pipeline.config.name)


def test_a_job_longer_than_the_lease_keeps_it_while_its_task_lives_and_commits_once(ledger_db, kafka_servers,
                                                                                      topic):
    pipeline = Pipeline(ledger_db, kafka_servers, topic, lease="PT2S")
    pipeline.produce(workload(0))
    checkpoint_id = pipeline.begin("the long run").checkpoint.id
    siblings = []

    def slow_job(arguments: list[str]) -> AttemptReport:
        time.sleep(3)  # past the lease
        pipeline.produce(workload(1000))
        siblings.append(pipeline.begin("a sibling run"))  # its recovery must leave the running attempt alone
        time.sleep(1)
        return pipeline.driver.execute(arguments)

    tasks.run_increment(pipeline.ledger, checkpoint_id, slow_job)
    assert siblings[0].recovery.aborted == () and siblings[0].checkpoint.id != checkpoint_id
    assert tasks.commit_checkpoint(pipeline.ledger, checkpoint_id, 1) is Outcome.COMMITTED
    assert aborted(pipeline) == []
    pipeline.run_once()  # the sibling's checkpoint is still within its lease: a later run plans beside it
    tasks.run_increment(pipeline.ledger, siblings[0].checkpoint.id, pipeline.driver.execute)
    assert tasks.commit_checkpoint(pipeline.ledger, siblings[0].checkpoint.id, 1) is Outcome.COMMITTED
    assert_exact(pipeline)


def test_a_released_range_is_planned_again_within_the_per_run_cap(ledger_db, kafka_servers, topic):
    now = [datetime(2026, 1, 1, tzinfo=timezone.utc)]
    pipeline = Pipeline(ledger_db, kafka_servers, topic, clock=lambda: now[0], lease="PT10M", stall_after=3)
    pipeline.produce(workload(0, rounds=4))
    abandoned = pipeline.begin().checkpoint  # every record: its run dies
    capped = pipeline.config.model_copy(update={"max_records_per_run": 5})
    pipeline.ledger.config = capped  # a deploy caps the runs meanwhile
    now[0] += timedelta(minutes=11)

    taken = []
    while True:
        begun = pipeline.begin()
        if begun.checkpoint.is_empty:
            break
        assert sum(r.size for r in begun.checkpoint.ranges) <= 5
        taken.append(begun.checkpoint.id)
        pipeline.driver.run(begun.checkpoint.id)
        assert pipeline.ledger.commit(begun.checkpoint.id) is Outcome.COMMITTED
    assert [c for c, _ in aborted(pipeline)] == [abandoned.id]
    assert len(taken) >= 3
    committed = query(ledger_db, "SELECT sum(to_offset - from_offset) FROM exactly_once.committed_ranges "
                                 "WHERE pipeline = %s", pipeline.config.name)[0][0]
    assert committed == sum(r.size for r in abandoned.ranges)
    assert_exact(pipeline)


def test_lease_expiries_over_the_same_offsets_stall_instead_of_looping(ledger_db, kafka_servers, topic):
    now = [datetime(2026, 1, 1, tzinfo=timezone.utc)]
    pipeline = Pipeline(ledger_db, kafka_servers, topic, clock=lambda: now[0], lease="PT10M", stall_after=3)
    pipeline.produce(workload(0))
    dying = [pipeline.begin().checkpoint.id]
    for _ in range(2):  # each run's worker dies before its lease is renewed
        pipeline.ledger.start_attempt(dying[-1])
        now[0] += timedelta(minutes=11)
        dying.append(pipeline.begin().checkpoint.id)
    assert [c for c, _ in aborted(pipeline)] == dying[:2]

    pipeline.ledger.start_attempt(dying[-1])
    now[0] += timedelta(minutes=11)
    with pytest.raises(Stalled, match=rf"checkpoint {dying[-1]} .*lease expired 3 times"):
        pipeline.begin()
    assert pipeline.ledger.checkpoint(dying[-1]).state is State.STALLED
    with pytest.raises(Stalled):
        pipeline.begin()  # every later run too

    # A cleared increment task resumes it.
    assert tasks.run_increment(pipeline.ledger, dying[-1], pipeline.driver.execute, TaskTry(2, pipeline.ledger.now()))
    assert pipeline.ledger.commit(dying[-1]) is Outcome.COMMITTED
    assert_exact(pipeline)


def test_a_cleared_run_resumes_its_own_checkpoint_sent_back_by_its_commit(ledger_db, kafka_servers, topic):
    pipeline = Pipeline(ledger_db, kafka_servers, topic)
    pipeline.produce(workload(0))
    checkpoint_id = pipeline.begin("run1").checkpoint.id
    pipeline.driver.run(checkpoint_id)
    events = pipeline.config.sink("events").table
    query(ledger_db, f"ALTER TABLE {events} ADD CONSTRAINT small CHECK (n < 0)")  # a table changes meanwhile
    with pytest.raises(PromotionRefused):
        tasks.commit_checkpoint(pipeline.ledger, checkpoint_id, 1)  # sent back, its lease ended
    query(ledger_db, f"ALTER TABLE {events} DROP CONSTRAINT small")  # the operator undoes it

    time.sleep(0.1)
    begun = pipeline.begin("run1")  # the whole run is cleared
    assert begun.checkpoint.id == checkpoint_id and not begun.new
    assert begun.checkpoint.state is State.PLANNED and checkpoint_id not in begun.recovery.aborted
    assert tasks.run_increment(pipeline.ledger, checkpoint_id, pipeline.driver.execute)
    assert tasks.commit_checkpoint(pipeline.ledger, checkpoint_id, 1) is Outcome.COMMITTED
    assert_exact(pipeline)
