"""Planning is pure: ranges from frontiers, timestamps, the last stable offset and a cap."""

from bisect import bisect_left
from datetime import datetime, timezone

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from exactly_once.planning import (DataLossError, OffsetRange, PartitionOffsets, PartitionPlan, PartitionState,
                                   cap_plans, plan_checkpoint, plan_partition, start_offset)


def state(frontier=None, released=None):
    return PartitionState("t", 0, frontier, released)


def test_range_runs_from_the_frontier_to_the_first_offset_at_the_interval_end():
    plan = plan_partition(state(frontier=10), PartitionOffsets(0, 100, at_interval_end=42), start=0,
                          allow_data_loss=False)
    assert plan.range == OffsetRange("t", 0, 10, 42)
    assert plan.gap is None and not plan.replanned


def test_the_last_stable_offset_caps_the_range():
    plan = plan_partition(state(frontier=10), PartitionOffsets(0, 30, at_interval_end=42), 0, False)
    assert plan.range.end == 30
    # No record at or after the interval end yet: everything stable is in the interval.
    assert plan_partition(state(frontier=10), PartitionOffsets(0, 30), 0, False).range.end == 30


def test_an_interval_whose_records_were_already_taken_plans_nothing():
    plan = plan_partition(state(frontier=50), PartitionOffsets(0, 100, at_interval_end=20), 0, False)
    assert plan.range == OffsetRange("t", 0, 50, 50)


def test_start_positions_of_a_new_pipeline_and_of_a_partition_added_later():
    offsets = PartitionOffsets(log_start=5, last_stable=90, at_start_time=40)
    assert start_offset("earliest", offsets, new_pipeline=True) == 5
    assert start_offset("latest", offsets, new_pipeline=True) == 90
    assert start_offset(datetime(2026, 1, 1, tzinfo=timezone.utc), offsets, new_pipeline=True) == 40
    assert start_offset("latest", offsets, new_pipeline=False) == 5


def test_records_deleted_by_retention_stop_the_plan_with_their_partition_and_count():
    with pytest.raises(DataLossError) as error:
        plan_partition(state(frontier=10), PartitionOffsets(log_start=25, last_stable=40), 0, False)
    assert str(error.value).startswith("t[0]: offsets 10..24 (15 records) were deleted by Kafka retention")


def test_allowed_data_loss_records_the_gap_and_reads_from_the_log_start():
    plan = plan_partition(state(frontier=10), PartitionOffsets(log_start=25, last_stable=40), 0, True)
    assert plan.gap == OffsetRange("t", 0, 10, 25)
    assert plan.range == OffsetRange("t", 0, 25, 40)


def test_a_released_range_is_planned_again_exactly_before_any_new_data():
    released = OffsetRange("t", 0, 3, 9)
    plan = plan_partition(state(frontier=20, released=released), PartitionOffsets(0, 100, 80), 0, False)
    assert plan.range == released and plan.replanned


def test_the_cap_is_shared_by_backlog_and_spares_replanned_ranges():
    def plan(start, end, replanned=False):
        return PartitionPlan(OffsetRange("t", start, start * 1000, start * 1000 + end), 0, None, replanned)
    plans = [plan(0, 60), plan(1, 30), plan(2, 10), plan(3, 5, replanned=True)]
    capped = cap_plans(plans, 25)
    assert [p.range.size for p in capped] == [12, 6, 2, 5]  # 20 left after the replanned 5: 60:30:10
    assert cap_plans(plans, 1000) == plans


@settings(max_examples=300, deadline=None)
@given(
    timestamps=st.lists(st.integers(0, 50), max_size=60),
    ends=st.lists(st.integers(0, 60), min_size=1, max_size=12),
    stable_growth=st.lists(st.integers(0, 10), min_size=12, max_size=12),
    cap=st.one_of(st.none(), st.integers(1, 15)),
)
def test_any_timestamps_and_interval_ends_tile_the_offsets(timestamps, ends, stable_growth, cap):
    """Runs planned one after another (in any interval order, records still arriving,
    with or without a cap) cover each offset once: no gap, no overlap."""
    frontier, planned, stable = None, [], 0
    for i, interval_end in enumerate(ends):
        stable = min(len(timestamps), stable + stable_growth[i])
        at_end = next((o for o, ts in enumerate(timestamps) if ts >= interval_end), None)
        offsets = PartitionOffsets(0, stable, at_interval_end=at_end)
        plan = cap_plans([plan_partition(state(frontier), offsets, 0, False)], cap)[0]
        assert plan.range.start == (0 if frontier is None else frontier)
        planned.append(plan.range)
        frontier = plan.range.end
    covered = [o for r in planned for o in range(r.start, r.end)]
    assert covered == list(range(frontier))
    assert frontier <= stable


@settings(max_examples=200, deadline=None)
@given(timestamps=st.lists(st.integers(0, 100), min_size=1, max_size=50).map(sorted),
       boundaries=st.lists(st.integers(0, 110), min_size=1, max_size=8, unique=True).map(sorted))
def test_with_ordered_timestamps_each_run_takes_exactly_its_interval(timestamps, boundaries):
    frontier = None
    for end in boundaries:
        at_end = bisect_left(timestamps, end)
        offsets = PartitionOffsets(0, len(timestamps), at_interval_end=None if at_end == len(timestamps) else at_end)
        plan = plan_partition(state(frontier), offsets, 0, False)
        assert all(ts < end for ts in timestamps[plan.range.start:plan.range.end])
        assert plan.range.end == len(timestamps) or timestamps[plan.range.end] >= end
        frontier = plan.range.end


def test_a_checkpoint_plans_every_partition_in_order_new_ones_from_the_start_released_ones_exactly():
    seen = {("t", 1): PartitionOffsets(5, 50), ("t", 0): PartitionOffsets(0, 90), ("u", 0): PartitionOffsets(7, 20)}
    known = {("t", 0): (0, 40), ("t", 1): (5, 30)}
    released = {("t", 1): OffsetRange("t", 1, 10, 30)}
    plans = plan_checkpoint(seen, known, released, "latest", allow_data_loss=False, cap=None)
    assert [p.range for p in plans] == [OffsetRange("t", 0, 40, 90), OffsetRange("t", 1, 10, 30),
                                        OffsetRange("u", 0, 7, 20)]  # a partition added later: from its start
    assert [p.replanned for p in plans] == [False, True, False]


def test_a_new_pipeline_starts_where_its_configuration_says_and_the_cap_applies():
    seen = {("t", 0): PartitionOffsets(3, 100), ("t", 1): PartitionOffsets(0, 60)}
    latest = plan_checkpoint(seen, {}, {}, "latest", allow_data_loss=False, cap=None)
    assert [p.range.size for p in latest] == [0, 0]
    earliest = plan_checkpoint(seen, {}, {}, "earliest", allow_data_loss=False, cap=10)
    assert [p.range.start for p in earliest] == [3, 0] and sum(p.range.size for p in earliest) == 10
