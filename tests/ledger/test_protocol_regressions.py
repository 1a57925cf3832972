"""Counterexamples the stateful property test (tests/ledger/test_protocol_machine.py) found,
each shrunk to plain steps against the ledger and kept as a test named after what it shows."""

from __future__ import annotations

from contextlib import closing
from datetime import timedelta

import psycopg2
import pytest

from exactly_once.ledger.checkpoints import Outcome, State
from exactly_once.ledger.invariants import violations
from exactly_once.ledger.refusals import Stalled
from exactly_once.operate import stalls
from tests.ledger.harness import Pipeline, workload
from tests.ledger.machine import Clock


def invariants(pipeline: Pipeline) -> list[str]:
    with closing(psycopg2.connect(pipeline.db_url)) as conn:
        return violations(conn, pipeline.config)


def test_a_later_checkpoint_committed_beside_an_open_earlier_one_breaks_no_invariant(ledger_db, kafka_servers,
                                                                                      topic):
    """Parallel runs: the second run plans the offsets after the first's and commits while
    the first is still open (within its lease, or stalled). The hole below the committed
    range is held by the open checkpoint, so the committed ranges are not contiguous yet,
    and the invariants (which hold between runs) must say nothing."""
    pipeline = Pipeline(ledger_db, kafka_servers, topic, max_records_per_run=4)
    pipeline.produce(workload(0, rounds=1))
    first = pipeline.begin("run0").checkpoint
    second = pipeline.begin("run1").checkpoint
    pipeline.driver.run(second.id)
    assert pipeline.ledger.commit(second.id) is Outcome.COMMITTED
    assert pipeline.ledger.checkpoint(first.id).state is State.PLANNED
    assert invariants(pipeline) == []

    pipeline.driver.run(first.id)
    assert pipeline.ledger.commit(first.id) is Outcome.COMMITTED
    while not pipeline.ledger.checkpoint(pipeline.run_once()).is_empty:  # the rest, within the cap
        pass
    pipeline.assert_exact()
    assert invariants(pipeline) == []


def test_a_zombies_rows_written_while_the_pipeline_is_stalled_go_at_the_first_recovery_after_it(
        ledger_db, kafka_servers, topic):
    """Two leases in a row run out: the second checkpoint stalls. A zombie of the first
    (aborted) checkpoint's attempt then writes its rows. A begin refused by the stall
    recovers nothing, so they stay; the first begin after an operator's retry deletes them,
    and every record counts once. (The state machine counted them deleted by the refused
    begin: its bookkeeping was wrong, not the ledger.)"""
    clock = Clock()
    pipeline = Pipeline(ledger_db, kafka_servers, topic, clock=clock, max_records_per_run=4, lease="PT10M",
                        stall_after=2)
    pipeline.produce(workload(0, rounds=1))
    checkpoints = []
    for run in ("run0", "run1"):
        checkpoints.append(pipeline.ledger.start_attempt(pipeline.begin(run).checkpoint.id))
        clock.advance(timedelta(minutes=11))
        pipeline.ledger.recover()
    first, second = checkpoints
    assert [pipeline.ledger.checkpoint(c.id).state for c in checkpoints] == [State.ABORTED, State.STALLED]

    pipeline.driver.write_staging(first.id, first.attempt, pipeline.driver.read(first.ranges))
    with pytest.raises(Stalled):
        pipeline.begin("run2")
    assert any(v.startswith("staging_left_behind") and f"checkpoint {first.id} attempt 1" in v
               for v in invariants(pipeline))

    stalls.retry(pipeline.ledger, second.id)
    released = pipeline.begin("run3")
    assert released.recovery.stale_staging_rows > 0
    assert invariants(pipeline) == []
    pipeline.driver.run(released.checkpoint.id)
    assert pipeline.ledger.commit(released.checkpoint.id) is Outcome.COMMITTED
    while not pipeline.ledger.checkpoint(pipeline.run_once()).is_empty:
        pass
    pipeline.assert_exact()
    assert invariants(pipeline) == []
