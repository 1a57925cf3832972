"""Exactly once through crashes, zombies and restarts: a slice of the fault matrix once
(seed 1) against real Kafka, Spark and PostgreSQL, each ending on the oracle (0 lost,
0 duplicated, 0 wrong; a kafka sink's topic read as a read_committed consumer reads it) and
the ledger's invariants. Every scenario: ./dev faults; more seeds: ./dev faults --seeds 1 2 3.

The slice is kept small for CI's time: a publisher killed inside its Kafka transaction (t).
A zombie driver (i) is a heavy test here (./dev test -m heavy), as is a worker killed
mid-write (p), inside the demo DAG's runs in tests/dags/test_spark_clusters.py. The others
run in ./dev faults; some have counterparts:
a (a driver killed mid-write) and b, c, d, e, h, j, l among the protocol's own
tests (tests/ledger/test_protocol.py: a failed or crashed attempt, a killed commit connection,
commit twice, racing planners, a lease taken over, recovery committing what is
pre-committed), k (retention) in its promise-2 tests against the real broker (deleted records
stop the pipeline naming partition and offsets, or with allow_data_loss are recorded as a
gap), o (a zombie reprocessing) and s (a zombie Connect task) in i, m and n (a reprocessing
crashed after its pre-commit, its commit racing a run's) in the model's reprocessing
configuration (tests/model/test_model.py; both heavy) and the state machine of
tests/ledger/test_protocol_machine.py, u (a zombie publisher fenced) in
tests/publishing/test_publishing.py. PostgreSQL restarted under a job's write (f1) or its
commit (f2), Kafka restarted under a job (g) or a publisher (v), a
commit rolled back under a publisher (w), a publisher too slow for its timeout (x), and the
Spark Connect faults (r, and tests/dags/test_spark_clusters.py's connect variant) run only
there."""

from __future__ import annotations

import pytest

from tests.faults.matrix import render, run_row

ROWS = []  # the matrix, printed at the end of the session (tests/faults/conftest.py)
SLICE = ["t"]  # CI's: a publisher's fault; the Spark job's (i) is heavy, ./dev faults runs every scenario


@pytest.mark.parametrize("scenario", [*SLICE, pytest.param("i", marks=pytest.mark.heavy)])
def test_every_record_counts_once_after_the_fault(scenario, kafka_servers, ledger_db):
    row = run_row(scenario, 1, kafka_servers, ledger_db)
    ROWS.append(row)
    assert row.passed, render([row]) + "\n" + "\n".join(row.problems)
