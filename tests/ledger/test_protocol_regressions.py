"""Counterexamples the stateful property test (tests/ledger/test_protocol_machine.py) found,
each shrunk to plain steps against the ledger and kept as a test named after what it shows."""

from __future__ import annotations

from contextlib import closing

import psycopg2

from exactly_once.ledger.checkpoints import Outcome, State
from exactly_once.ledger.invariants import violations
from tests.ledger.harness import Pipeline, workload


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
    with closing(psycopg2.connect(ledger_db)) as conn:
        assert violations(conn, pipeline.config) == []

    pipeline.driver.run(first.id)
    assert pipeline.ledger.commit(first.id) is Outcome.COMMITTED
    while not pipeline.ledger.checkpoint(pipeline.run_once()).is_empty:  # the rest, within the cap
        pass
    pipeline.assert_exact()
    with closing(psycopg2.connect(ledger_db)) as conn:
        assert violations(conn, pipeline.config) == []
