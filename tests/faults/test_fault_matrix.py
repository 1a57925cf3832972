"""Exactly once through crashes, zombies and restarts: every scenario of the fault matrix
once (seed 1) against real Kafka, Spark and PostgreSQL, each ending on the oracle (0 lost,
0 duplicated, 0 wrong) and the ledger's invariants. More seeds: ./dev faults --seeds 1 2 3."""

from __future__ import annotations

import pytest

from tests.faults.matrix import render, run_row
from tests.faults.scenarios import SCENARIOS

ROWS = []  # the matrix, printed at the end of the session (tests/faults/conftest.py)


@pytest.mark.parametrize("scenario", list(SCENARIOS))
def test_every_record_counts_once_after_the_fault(scenario, kafka_servers, ledger_db):
    row = run_row(scenario, 1, kafka_servers, ledger_db)
    ROWS.append(row)
    assert row.passed, render([row]) + "\n" + "\n".join(row.problems)
