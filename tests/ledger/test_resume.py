"""Issue 60, item 2: resuming a stalled checkpoint is an operator's act, never a try of its own
run that merely ran late (promise 9). Run R pre-commits checkpoint C with 35 dead letters of
40 records; before R's commit task runs, run S's begin recovers C, finds the dead-letter
budget exceeded and stalls it; R's first commit try, which began before the stall, then
committed C and recorded a `resume` nobody made. Real Kafka and PostgreSQL; the harness's
driver plays the Spark job, the commit goes through the commit task's run path.
"""

from __future__ import annotations

import json
from contextlib import closing

import psycopg2
import pytest

from exactly_once.ledger.checkpoints import Outcome, State, TaskTry
from exactly_once.ledger.refusals import Stalled
from exactly_once.operate.status import read_status
from exactly_once.orchestration import tasks
from tests.ledger.harness import Pipeline, query


def mostly_undecodable() -> list:
    good = [(i % 3, b"k", json.dumps({"id": f"o{i}", "k": "k", "n": i}).encode()) for i in range(5)]
    return [(True, good + [(i % 3, b"k", b"\x00not json %d" % i) for i in range(35)])]


def actions(pipeline: Pipeline) -> list[tuple]:
    return query(pipeline.db_url, "SELECT action FROM exactly_once.operator_actions WHERE pipeline = %s",
                 pipeline.config.name)


def test_a_commit_try_that_began_before_the_budget_stall_does_not_resume_it(ledger_db, kafka_servers, topic):
    pipeline = Pipeline(ledger_db, kafka_servers, topic)
    pipeline.produce(mostly_undecodable())
    checkpoint_id = pipeline.begin("R").checkpoint.id
    pipeline.driver.run(checkpoint_id)  # R's increment pre-commits C
    r_commit_began = pipeline.ledger.now()  # R's commit task starts, and is held (a slow worker)

    with pytest.raises(Stalled, match=r"dead-letter budget exceeded: 35 of the \d+ records"):
        pipeline.begin("S")  # S's recovery tries to commit C: stalled on the budget
    assert pipeline.ledger.checkpoint(checkpoint_id).state is State.STALLED

    with pytest.raises(Stalled, match=rf"checkpoint {checkpoint_id} "):  # R's held try goes on: refused
        tasks.commit_checkpoint(pipeline.ledger, checkpoint_id, 1, r_commit_began)
    with pytest.raises(Stalled, match=rf"checkpoint {checkpoint_id} "):  # nor does a first try queued till now
        tasks.commit_checkpoint(pipeline.ledger, checkpoint_id, 1, pipeline.ledger.now())
    assert pipeline.ledger.checkpoint(checkpoint_id).state is State.STALLED
    assert actions(pipeline) == []  # no resume nobody made
    with closing(psycopg2.connect(ledger_db)) as conn:
        [stall] = read_status(conn, None, pipeline.config.name).stalls
        assert stall.checkpoint_id == checkpoint_id
    assert query(ledger_db, f"SELECT count(*) FROM {pipeline.config.sink('events').table}") == [(0,)]

    cleared = pipeline.ledger.now()  # the operator looked at the dead letters and cleared the commit task
    assert tasks.commit_checkpoint(pipeline.ledger, checkpoint_id, 2, cleared) is Outcome.COMMITTED
    assert actions(pipeline) == [("resume",)]
    pipeline.assert_exact()


def test_an_increment_try_that_began_before_a_stall_does_not_start_an_attempt(ledger_db, kafka_servers, topic):
    pipeline = Pipeline(ledger_db, kafka_servers, topic, stall_after=1)
    pipeline.produce(mostly_undecodable())
    checkpoint_id = pipeline.begin("R").checkpoint.id
    began = pipeline.ledger.now()  # R's increment try begins, and is held

    def fails(arguments: list[str]):
        raise RuntimeError("disk full")

    with pytest.raises(Stalled):  # another try of the checkpoint fails once: stall_after 1 stalls it
        tasks.run_increment(pipeline.ledger, checkpoint_id, fails, TaskTry(1, pipeline.ledger.now()))
    with pytest.raises(Stalled):  # the held try goes on
        tasks.run_increment(pipeline.ledger, checkpoint_id, pipeline.driver.execute, TaskTry(1, began))
    assert pipeline.ledger.checkpoint(checkpoint_id).state is State.STALLED and actions(pipeline) == []
    cleared = TaskTry(2, pipeline.ledger.now())
    assert tasks.run_increment(pipeline.ledger, checkpoint_id, pipeline.driver.execute, cleared)
    assert actions(pipeline) == [("resume",)]
