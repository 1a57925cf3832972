"""Rendering the status of a pipeline: pure, no services."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone

from exactly_once.ledger.planning import OffsetRange
from exactly_once.operate.status import CheckpointSummary, Gap, LastCommit, PartitionLag, PipelineStatus
from exactly_once.operate.status_report import render, table

T = datetime(2026, 11, 22, 12, 0, tzinfo=timezone.utc)


def summary(cp_id: int, state: str, records: int | None, ranges=()) -> CheckpointSummary:
    return CheckpointSummary(cp_id, f"run-{cp_id}", T, T + timedelta(minutes=10), state, records, tuple(ranges),
                             timedelta(seconds=31.26) if state != "planned" else None,
                             timedelta(seconds=0.4) if state == "committed" else None, 1)


def test_lag_counts_offsets_past_the_committed_end_and_never_goes_negative():
    assert PartitionLag("orders", 0, committed_end=40, last_stable=100).lag == 60
    assert PartitionLag("orders", 1, committed_end=100, last_stable=100).lag == 0
    assert PartitionLag("orders", 2, committed_end=120, last_stable=100).lag == 0  # records deleted, say


def test_table_aligns_columns_under_a_rule():
    assert table(["a", "bb"], [[1, None], ["long", 22]]).splitlines() == ["a     bb", "----  --", "1", "long  22"]


def test_render_shows_last_commit_lag_open_checkpoints_gaps_and_history():
    committed = summary(7, "committed", 1500, [OffsetRange("orders", 0, 0, 520), OffsetRange("orders", 2, 0, 990)])
    open_one = summary(8, "precommitted", 300, [OffsetRange("orders", 1, 0, 300)])
    status = PipelineStatus("orders", (), LastCommit(7, "run-7", T, T, 1500),
                            (PartitionLag("orders", 0, 520, 520), PartitionLag("orders", 1, 0, 300)),
                            (open_one,), (Gap(OffsetRange("orders", 1, 0, 5), 6, T),), (open_one, committed))
    text = render(status)
    assert "last committed checkpoint: 7 (1500 records" in text
    lag = text.split("lag per partition (offsets):")[1].split("open checkpoints:")[0].strip().splitlines()
    assert [row.split() for row in lag[2:]] == [["orders", "0", "520", "520", "0"], ["orders", "1", "0", "300", "300"]]
    assert "orders[0] 0..520, orders[2] 0..990" in text
    assert "31.3 s" in text and "0.4 s" in text
    assert "orders  1          0..5" in text
    assert text.count("precommitted") == 2  # open, and in the history


def test_render_says_none_where_there_is_nothing():
    text = render(PipelineStatus("orders", (), None, (), (), (), ()))
    assert "last committed checkpoint: none" in text
    assert "open checkpoints: none" in text
    assert "gaps (offsets lost to retention): none" in text
