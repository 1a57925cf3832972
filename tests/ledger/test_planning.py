"""Planning is pure: ranges from the data interval, what the ledger holds, the last stable
offset, retention and a cap."""

from bisect import bisect_left
from datetime import datetime, timezone

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from exactly_once.ledger.lost_offsets import DataLossError, OffsetsWentBack
from exactly_once.ledger.planning import (OffsetRange, PartitionOffsets, PartitionPlan, PartitionState, Reach, cap_plans,
                                          layers, plan_checkpoint, start_offset)


def r(start, end, partition=0):
    return OffsetRange("t", partition, start, end)


def plan(state, offsets, reach=Reach.INTERVAL, allow_data_loss=False, cap=None):
    [planned] = plan_checkpoint({("t", 0): offsets}, {("t", 0): state}, "earliest", reach, allow_data_loss, cap)
    return planned


def known(frontier, taken=(), released=(), start=0):
    return PartitionState("t", 0, start, frontier, tuple(taken), tuple(released))


def test_a_backfill_run_takes_exactly_its_interval_whatever_lies_before_it():
    planned = plan(known(10), PartitionOffsets(0, 100, at_interval_start=42, at_interval_end=60))
    assert planned.ranges == (r(42, 60),) and planned.gaps == ()
    assert planned.frontier == 10  # 10..41 are still unclaimed: the frontier stays


def test_a_topic_created_again_stops_planning_however_far_it_was_refilled_and_an_unrecorded_id_is_adopted():
    state = PartitionState("t", 0, 0, 70, topic_id="old")
    with pytest.raises(OffsetsWentBack, match=r"t\[0\]: .* the topic's id was old and is now new"):
        plan(state, PartitionOffsets(0, 203, topic_id="new"), Reach.BACKLOG)
    with pytest.raises(OffsetsWentBack, match=r"log now ends at 5 \(the topic deleted"):
        plan(state, PartitionOffsets(0, 5, topic_id="old"), Reach.BACKLOG)
    assert plan(state, PartitionOffsets(0, 90, topic_id="old"), Reach.BACKLOG).ranges == (r(70, 90),)
    assert plan(state, PartitionOffsets(0, 90), Reach.BACKLOG).topic_id == "old"  # the brokers do not say
    adopted = plan(PartitionState("t", 0, 0, 70), PartitionOffsets(0, 90, topic_id="new"), Reach.BACKLOG)
    assert adopted.topic_id == "new" and adopted.ranges == (r(70, 90),)


def test_a_run_that_is_not_a_backfill_also_takes_every_unclaimed_offset_before_its_interval():
    state = known(10, taken=[r(20, 30), r(35, 40)])  # two backfill runs' intervals
    planned = plan(state, PartitionOffsets(0, 100, 42, 60), Reach.BACKLOG)
    assert planned.ranges == (r(10, 20), r(30, 35), r(40, 60))
    assert planned.frontier == 60


def test_the_last_stable_offset_caps_the_range_and_an_unstable_interval_start_plans_nothing():
    assert plan(known(10), PartitionOffsets(0, 30, at_interval_start=12, at_interval_end=42)).ranges == (r(12, 30),)
    # No stable record at or after the interval end yet: everything stable from its start.
    assert plan(known(10), PartitionOffsets(0, 30, at_interval_start=12)).ranges == (r(12, 30),)
    assert plan(known(10), PartitionOffsets(0, 30)).ranges == ()  # nothing stable stamped in the interval yet


def test_an_interval_whose_records_are_held_plans_nothing():
    assert plan(known(50), PartitionOffsets(0, 100, 5, 20)).ranges == ()
    assert plan(known(10, taken=[r(20, 60)]), PartitionOffsets(0, 100, 25, 40)).ranges == ()


def test_the_frontier_advances_over_planned_offsets_only_up_to_a_hole():
    state = known(10, taken=[r(20, 30), r(40, 50)])
    assert plan(state, PartitionOffsets(0, 100, 10, 20)).frontier == 30  # 10..20 closes the hole up to 30
    assert plan(state, PartitionOffsets(0, 100, 30, 35)).frontier == 10


def test_start_positions_of_a_new_pipeline_and_of_a_partition_added_later():
    offsets = PartitionOffsets(log_start=5, last_stable=90, at_start_time=40)
    assert start_offset("earliest", offsets, new_pipeline=True) == 5
    assert start_offset("latest", offsets, new_pipeline=True) == 90
    assert start_offset(datetime(2026, 1, 1, tzinfo=timezone.utc), offsets, new_pipeline=True) == 40
    assert start_offset("latest", offsets, new_pipeline=False) == 5


def test_records_deleted_by_retention_stop_the_plan_with_their_partition_and_count():
    with pytest.raises(DataLossError) as error:
        plan(known(10), PartitionOffsets(log_start=25, last_stable=40), Reach.BACKLOG)
    assert str(error.value).startswith("t[0]: offsets 10..24 (15 records) were deleted by Kafka retention")


def test_allowed_data_loss_records_the_gap_and_reads_from_the_log_start():
    planned = plan(known(10), PartitionOffsets(log_start=25, last_stable=40), Reach.BACKLOG, allow_data_loss=True)
    assert planned.gaps == (r(10, 25),) and planned.ranges == (r(25, 40),) and planned.frontier == 40


def test_released_ranges_are_taken_whole_by_the_next_run_whatever_its_interval():
    state = known(50, released=[r(3, 9), r(20, 30)])
    planned = plan(state, PartitionOffsets(0, 100, 60, 70))
    assert planned.replanned == (r(3, 9), r(20, 30)) and planned.ranges == (r(3, 9), r(20, 30), r(60, 70))
    # Retention cut one: the gap and the rest are planned, the range is marked as released.
    cut = plan(state, PartitionOffsets(5, 100, 60, 70), allow_data_loss=True)
    assert cut.released == (r(3, 9), r(20, 30)) and cut.gaps == (r(3, 5),) and cut.replanned == (r(5, 9), r(20, 30))


def test_the_cap_takes_released_ranges_first_and_shares_the_rest_by_backlog_keeping_the_oldest_offsets():
    def partition(p, *fresh, released=()):
        return PartitionPlan("t", p, 0, released=released, replanned=released, fresh=fresh)
    plans = [partition(0, r(0, 40), r(50, 70)), partition(1, r(0, 30, 1)), partition(2, r(0, 10, 2)),
             partition(3, released=(r(0, 5, 3),))]
    capped = cap_plans(plans, 25)
    assert [p.size for p in capped] == [12, 6, 2, 5]  # 20 left after the released 5: 60:30:10
    assert capped[0].ranges == (r(0, 12),)
    assert cap_plans(plans, 1000) == plans


def test_the_cap_splits_a_released_range_and_leaves_the_rest_released_for_a_later_plan():
    released = (r(100, 1100, 0), r(0, 50, 1))
    plans = [PartitionPlan("t", 0, 0, released=released[:1], replanned=released[:1], fresh=(r(1100, 1200),)),
             PartitionPlan("t", 1, 0, released=released[1:], replanned=released[1:])]
    first, second = cap_plans(plans, 300)
    assert first.ranges == (r(100, 400),) and first.released == released[:1]
    assert first.left_released == (r(400, 1100),)
    assert second.size == 0 and second.released == () and second.left_released == ()  # untouched: still released
    # retention cut the front of a released range: its gap is taken even when nothing of it is read
    cut = PartitionPlan("t", 0, 0, released=(r(0, 100),), replanned=(r(30, 100),), gaps=(r(0, 30),))
    [capped] = cap_plans([cut], 0)
    assert capped.released == (r(0, 100),) and capped.replanned == (r(30, 30),)
    assert capped.left_released == (r(30, 100),) and capped.size == 0


def test_a_checkpoint_plans_every_partition_in_order_new_ones_from_the_start():
    seen = {("t", 1): PartitionOffsets(5, 50), ("t", 0): PartitionOffsets(0, 90), ("u", 0): PartitionOffsets(7, 20)}
    ledger = {("t", 0): PartitionState("t", 0, 0, 40), ("t", 1): PartitionState("t", 1, 5, 30)}
    plans = plan_checkpoint(seen, ledger, "latest", Reach.BACKLOG, allow_data_loss=False, cap=None)
    assert [p.ranges for p in plans] == [(r(40, 90),), (r(30, 50, 1),), (OffsetRange("u", 0, 7, 20),)]


def test_a_new_pipeline_starts_where_its_configuration_says_and_the_cap_applies():
    seen = {("t", 0): PartitionOffsets(3, 100), ("t", 1): PartitionOffsets(0, 60)}
    latest = plan_checkpoint(seen, {}, "latest", Reach.BACKLOG, allow_data_loss=False, cap=None)
    assert [p.size for p in latest] == [0, 0] and [p.frontier for p in latest] == [100, 60]
    earliest = plan_checkpoint(seen, {}, "earliest", Reach.BACKLOG, allow_data_loss=False, cap=10)
    assert [p.start_offset for p in earliest] == [3, 0] and sum(p.size for p in earliest) == 10


def test_layers_hold_one_range_per_partition_each():
    assert layers([r(40, 50), r(0, 10), r(5, 6, 1), r(20, 20), r(60, 70)]) == [
        (r(0, 10), r(5, 6, 1)), (r(40, 50),), (r(60, 70),)]


# -- properties: a simulated partition, its ledger, runs in any order ---------------------

class Simulation:
    """One partition whose records carry `timestamps`, the ledger's view of it, and runs
    over intervals of a time grid planned in a given order."""

    def __init__(self, timestamps: list[int], allow_data_loss: bool = False):
        self.timestamps, self.stable = timestamps, 0
        self.state = PartitionState("t", 0)
        self.held: dict[int, tuple[OffsetRange, ...]] = {}  # run → its ranges and gaps

    def at(self, moment: int | None) -> int | None:
        """Kafka's answer: the first stable offset stamped at or after `moment`."""
        if moment is None:
            return None
        return next((o for o, ts in enumerate(self.timestamps[:self.stable]) if ts >= moment), None)

    def run(self, run: int, start: int | None, end: int | None, reach: Reach, cap: int | None = None) -> None:
        offsets = PartitionOffsets(0, self.stable, self.at(start), self.at(end))
        ledger = {} if self.state.start is None else {("t", 0): self.state}
        [planned] = plan_checkpoint({("t", 0): offsets}, ledger, "earliest", reach, False, cap)
        self.held[run] = planned.ranges + planned.gaps
        frontier = planned.frontier
        live = [x for held in self.held.values() for x in held]
        self.state = PartitionState("t", 0, planned.start_offset, frontier, tuple(x for x in live if x.end > frontier))

    def owners(self) -> dict[int, int]:
        """Offset → the run holding it; fails on an offset held twice."""
        owner = {}
        for run, held in self.held.items():
            for x in held:
                for o in range(x.start, x.end):
                    assert o not in owner, f"offset {o} held by runs {owner[o]} and {run}"
                    owner[o] = run
        return owner


grids = st.lists(st.integers(0, 60), min_size=2, max_size=9, unique=True).map(sorted)


@settings(max_examples=400, deadline=None)
@given(timestamps=st.lists(st.integers(0, 60), max_size=50), grid=grids, data=st.data(),
       cap=st.one_of(st.none(), st.integers(1, 12)))
def test_any_runs_in_any_order_hold_each_offset_once_and_a_run_that_is_not_a_backfill_leaves_no_hole(
        timestamps, grid, data, cap):
    """Intervals of a grid run (or never do) in any order, as backfills or not, while
    records become stable, with or without a cap: no offset is held twice, and a last run
    that is not a backfill leaves every offset held."""
    sim = Simulation(timestamps)
    intervals = list(zip(grid, grid[1:]))
    chosen = data.draw(st.lists(st.sampled_from(range(len(intervals))), unique=True), "runs")
    for run, i in enumerate(chosen):
        sim.stable = data.draw(st.integers(sim.stable, len(timestamps)), "stable")
        sim.run(run, *intervals[i], data.draw(st.sampled_from(Reach), "reach"), cap)
        sim.owners()
    sim.stable = len(timestamps)
    sim.run(len(chosen), grid[-1], None, Reach.BACKLOG)
    assert sorted(sim.owners()) == list(range(len(timestamps)))
    assert sim.state.frontier == len(timestamps)


@settings(max_examples=400, deadline=None)
@given(timestamps=st.lists(st.integers(0, 60), max_size=50), grid=grids, data=st.data())
def test_a_record_lands_in_its_intervals_checkpoint_whenever_that_interval_has_a_run(timestamps, grid, data):
    """Backfill runs over any intervals, planned in any order once their records are
    stable: each holds exactly the offsets from its interval's first position to the
    next's — with timestamps in order, exactly the records stamped in its interval."""
    sim = Simulation(timestamps)
    sim.stable = len(timestamps)
    intervals = list(zip(grid, grid[1:]))
    chosen = data.draw(st.lists(st.sampled_from(range(len(intervals))), unique=True), "runs")
    for run, i in enumerate(chosen):
        sim.run(run, *intervals[i], Reach.INTERVAL)
    owner = sim.owners()
    position = [len(timestamps) if sim.at(t) is None else sim.at(t) for t in grid]
    for run, i in enumerate(chosen):
        assert sorted(o for o, holder in owner.items() if holder == run) == list(range(position[i], position[i + 1]))
        if timestamps == sorted(timestamps):
            stamped = [o for o, ts in enumerate(timestamps) if intervals[i][0] <= ts < intervals[i][1]]
            assert list(range(position[i], position[i + 1])) == stamped


@settings(max_examples=200, deadline=None)
@given(timestamps=st.lists(st.integers(0, 100), min_size=1, max_size=50).map(sorted),
       boundaries=st.lists(st.integers(0, 110), min_size=1, max_size=8, unique=True).map(sorted))
def test_scheduled_runs_in_order_each_take_exactly_their_interval(timestamps, boundaries):
    sim = Simulation(timestamps)
    sim.stable = len(timestamps)
    previous = None
    for run, end in enumerate(boundaries):
        sim.run(run, previous, end, Reach.BACKLOG)
        held = [o for x in sim.held[run] for o in range(x.start, x.end)]
        assert held == list(range(bisect_left(timestamps, previous or 0), bisect_left(timestamps, end)))
        previous = end
