"""Exactly once through crashes, zombies and restarts: a slice of the fault matrix once
(seed 1) against real Kafka, Spark and PostgreSQL, each ending on the oracle (0 lost,
0 duplicated, 0 wrong) and the ledger's invariants. Every scenario: ./dev faults; more
seeds: ./dev faults --seeds 1 2 3.

The slice keeps a scenario of each kind that only real processes show — a Spark driver
killed, PostgreSQL and Kafka restarted under a job, a zombie driver; a worker
killed mid-write and the Spark Connect server restarted (p and r) run inside the demo DAG's
runs in tests/dags/test_spark_clusters.py.
The others have counterparts: k (retention) in the protocol's promise-2 tests against the real
broker (tests/ledger/test_protocol.py: deleted records stop the pipeline naming partition and
offsets, or with allow_data_loss are recorded as a gap), b, c, d, e, h, j, l among the protocol's own tests
(tests/ledger/test_protocol.py: a failed or crashed attempt, a killed commit connection,
commit twice, racing planners, a lease taken over, recovery committing what is
pre-committed), o (a zombie reprocessing) and s (a zombie Connect task) in i, q (a on
the standalone cluster) in a, m and n (a reprocessing crashed after its pre-commit, its
commit racing a run's) in the model's reprocessing configuration (tests/model/test_model.py:
a crash at any step of a reprocessing, every interleaving with a run) and the state machine
of tests/ledger/test_protocol_machine.py (a reprocessing while a commit is paused inside its
transaction, on real PostgreSQL)."""

from __future__ import annotations

import pytest

from tests.faults.matrix import render, run_row

ROWS = []  # the matrix, printed at the end of the session (tests/faults/conftest.py)
SLICE = ["a", "f1", "g", "i"]


@pytest.mark.parametrize("scenario", SLICE)
def test_every_record_counts_once_after_the_fault(scenario, kafka_servers, ledger_db):
    row = run_row(scenario, 1, kafka_servers, ledger_db)
    ROWS.append(row)
    assert row.passed, render([row]) + "\n" + "\n".join(row.problems)
