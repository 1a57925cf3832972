"""`./dev bench-ledger` keeps working: its smallest configuration (200 and 1,000 checkpoints,
3 run through the protocol at each, and 20 checkpoints of the staging bloat run) prints its
tables, without and with retention. No figure is asserted: the command reports them."""

from __future__ import annotations

import pytest

from tests.benchmarks import ledger_growth


@pytest.mark.heavy  # ./dev bench-ledger runs it whole; CI: retention's tests (tests/ledger/test_retention.py)
def test_the_smallest_configuration_prints_every_table(ledger_db, tmp_path, monkeypatch):
    monkeypatch.setattr(ledger_growth, "FOLDER", tmp_path)
    report = ledger_growth.main(["--sizes", "200", "1000", "--real", "3", "--bloat-checkpoints", "20",
                                 "--bloat-rows", "30"])
    assert report == (tmp_path / "ledger-growth.md").read_text()
    assert "bulk-written" in report and "nan" not in report
    for title in ("### without retention", "### with retention", "### Staging bloat, checkpoints one at a time",
                  "### Staging bloat, beside a checkpoint left running"):
        assert report.count(title) == 1, title
    assert report.count("|  | 200 | 1,000 | 1,000 / 200 |") == 6  # times, sizes, rows per series
    for label in ledger_growth.LABELS.values():
        assert f"| {label} |" in report, label
    assert report.count("| **the ledger** |") == 2 and "| contributions: latest |" in report
    assert report.count("| checkpoints | s | staging: events |") == 2 and "\n| 20 | " in report  # bloat's last sample
