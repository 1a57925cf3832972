"""Planning a checkpoint's offset ranges: pure functions, no I/O.

A run owns its data interval [start, end): per partition, the offsets from the first
whose timestamp is at or after `start` to the first at or after `end` (Kafka's time
index makes both boundaries monotone, so consecutive intervals tile the log whatever
order their runs plan in), capped by the last stable offset at planning time and by
the per-run record cap. Offsets another checkpoint holds are left out.

Records that no interval claims — before the first interval ever run, in intervals
that never run, not yet stable when their interval's run planned, cut off by the cap —
are taken by the next run that is not a backfill (`Reach.BACKLOG`): it takes every
unclaimed offset before its interval's end, from where the pipeline started. A range
released by an aborted checkpoint is taken by the next run, whatever its reach, before
any fresh offset, as far as the per-run cap allows (the rest stays released for the run
after). So per partition a checkpoint may read several ranges; the frontier is the
offset below which everything is planned.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, replace
from datetime import datetime
from enum import Enum
from typing import Literal, Protocol

from exactly_once.ledger.lost_offsets import DataLossError, OffsetsWentBack, replaced


@dataclass(frozen=True, order=True)
class OffsetRange:
    """Offsets [start, end) of one partition."""

    topic: str
    partition: int
    start: int
    end: int

    def __post_init__(self) -> None:
        if not 0 <= self.start <= self.end:
            raise ValueError(f"invalid offset range {self}")

    @property
    def size(self) -> int:
        return self.end - self.start

    @property
    def label(self) -> str:
        """`topic[partition]@start..end`, as operators write a range (exactly_once.operate.stalls)."""
        return f"{self.topic}[{self.partition}]@{self.start}..{self.end}"


class Reach(Enum):
    """How far back a run's plan reaches."""

    INTERVAL = "interval"  # a backfill run: the unclaimed offsets of its data interval
    BACKLOG = "backlog"    # any other run: those, and every unclaimed offset before its interval


@dataclass(frozen=True)
class PartitionOffsets:
    """What Kafka says about one partition when the checkpoint is planned. The `at_*` fields
    are the first stable offset stamped at or after that moment; None: no such record yet."""

    log_start: int
    last_stable: int
    at_interval_start: int | None = None
    at_interval_end: int | None = None
    at_start_time: int | None = None   # for a pipeline that starts at a timestamp
    topic_id: str | None = None        # the topic's id (KIP-516); None: the brokers do not say

    def position(self, found: int | None) -> int:
        """Where a moment lies in the partition: its first stable offset, or the last stable
        offset when no stable record is that late yet (what comes later is not readable)."""
        return self.last_stable if found is None else min(found, self.last_stable)


class OffsetSource(Protocol):
    """What planning asks Kafka (exactly_once.ledger.kafka_offsets.KafkaOffsets)."""

    def offsets(self, topic: str, partition: int, interval_start: datetime | None, interval_end: datetime | None,
                start_time: datetime | None = None) -> PartitionOffsets: ...

    def topic_offsets(self, topic: str, interval_start: datetime | None, interval_end: datetime | None,
                      start_time: datetime | None = None) -> dict[int, PartitionOffsets]:
        """`offsets` of every partition of the topic, by partition."""


@dataclass(frozen=True)
class PartitionState:
    """What the ledger says about one partition of the pipeline."""

    topic: str
    partition: int
    start: int | None = None       # where the pipeline started in it; None: never planned
    frontier: int | None = None    # every offset in [start, frontier) is planned
    taken: tuple[OffsetRange, ...] = ()     # live ranges and gaps reaching past the frontier
    released: tuple[OffsetRange, ...] = ()  # ranges of aborted checkpoints, not planned again yet
    topic_id: str | None = None    # the id of the topic whose offsets these are; None: not recorded yet


@dataclass(frozen=True)
class PartitionPlan:
    topic: str
    partition: int
    start_offset: int                         # where the pipeline started in this partition
    released: tuple[OffsetRange, ...] = ()    # released ranges this plan takes, as they were released
    replanned: tuple[OffsetRange, ...] = ()   # what is read of them (retention may have cut some)
    fresh: tuple[OffsetRange, ...] = ()       # unclaimed offsets, in offset order
    gaps: tuple[OffsetRange, ...] = ()        # offsets lost to retention (only when data loss is allowed)
    frontier: int = 0
    left_released: tuple[OffsetRange, ...] = ()  # what the cap leaves of `released`, for a later plan
    topic_id: str | None = None               # the topic's id, recorded with the ranges and the partition

    @property
    def ranges(self) -> tuple[OffsetRange, ...]:
        """What the checkpoint reads in this partition, in offset order."""
        return tuple(sorted(r for r in self.replanned + self.fresh if r.size))

    @property
    def size(self) -> int:
        return sum(r.size for r in self.ranges)


StartPosition = Literal["earliest", "latest"] | datetime


def start_offset(position: StartPosition, offsets: PartitionOffsets, new_pipeline: bool) -> int:
    """Where reading begins in a partition the pipeline has never planned."""
    if not new_pipeline or position == "earliest":
        return offsets.log_start  # a partition added later: all of it
    if position == "latest":
        return offsets.last_stable
    return offsets.position(offsets.at_start_time)


def unclaimed(topic: str, partition: int, start: int, end: int, claimed: Iterable[OffsetRange]
              ) -> tuple[OffsetRange, ...]:
    """The offsets of [start, end) outside every `claimed` range, as ranges in offset order."""
    pieces, at = [], start
    for r in sorted(claimed):
        if r.end <= at or r.size == 0:
            continue
        if r.start >= end:
            break
        if r.start > at:
            pieces.append(OffsetRange(topic, partition, at, r.start))
        at = max(at, r.end)
    if at < end:
        pieces.append(OffsetRange(topic, partition, at, end))
    return tuple(pieces)


def plan_partition(state: PartitionState, offsets: PartitionOffsets, reach: Reach, allow_data_loss: bool
                   ) -> PartitionPlan:
    """The partition's released ranges, and the unclaimed offsets of the run's reach
    (before the cap), with what retention deleted among them cut off as gaps. `state.start`
    is set: plan_checkpoint gives a partition never planned its start offset."""
    start = state.start
    planned = start if state.frontier is None else state.frontier
    created_again = replaced(state.topic_id, offsets.topic_id)
    if offsets.last_stable < planned or created_again:
        raise OffsetsWentBack(state.topic, state.partition, planned, offsets.last_stable,
                              *((state.topic_id, offsets.topic_id) if created_again else ()))
    first = start if reach is Reach.BACKLOG else max(start, offsets.position(offsets.at_interval_start))
    end = offsets.position(offsets.at_interval_end)
    fresh = unclaimed(state.topic, state.partition, max(first, planned), end, state.taken + state.released)
    gaps, replanned, kept = [], [], []
    for wanted, into in [(r, replanned) for r in state.released] + [(r, kept) for r in fresh]:
        gap, rest = _survive_retention(wanted, offsets.log_start, allow_data_loss)
        gaps += [gap] if gap else []
        into.append(rest)
    return PartitionPlan(state.topic, state.partition, start, state.released, tuple(replanned), tuple(kept),
                         tuple(gaps), planned, topic_id=offsets.topic_id or state.topic_id)


def _survive_retention(wanted: OffsetRange, log_start: int, allow_data_loss: bool
                       ) -> tuple[OffsetRange | None, OffsetRange]:
    if wanted.start >= log_start:
        return None, wanted
    if not allow_data_loss:
        raise DataLossError(wanted.topic, wanted.partition, wanted.start, log_start)
    cut = min(log_start, wanted.end)
    return replace(wanted, end=cut), replace(wanted, start=cut)


def advance_frontier(plan: PartitionPlan, taken: Iterable[OffsetRange]) -> PartitionPlan:
    """The plan with its partition's new frontier: from the old one, as far as planned
    offsets (taken before, or by this plan) reach without a hole."""
    frontier = plan.frontier
    for r in sorted([*taken, *plan.ranges, *plan.gaps]):
        if r.start > frontier:
            break
        frontier = max(frontier, r.end)
    return replace(plan, frontier=frontier)


def plan_checkpoint(seen: Mapping[tuple[str, int], PartitionOffsets],
                    ledger: Mapping[tuple[str, int], PartitionState], position: StartPosition, reach: Reach,
                    allow_data_loss: bool, cap: int | None) -> list[PartitionPlan]:
    """Every partition's plan, in (topic, partition) order: `seen` is what Kafka says now,
    `ledger` what the ledger says about the partitions the pipeline planned before."""
    plans, states = [], []
    for (topic, partition), offsets in sorted(seen.items()):
        state = ledger.get((topic, partition)) or PartitionState(
            topic, partition, start=start_offset(position, offsets, new_pipeline=not ledger))
        states.append(state)
        plans.append(plan_partition(state, offsets, reach, allow_data_loss))
    return [advance_frontier(plan, state.taken) for plan, state in zip(cap_plans(plans, cap), states)]


def cap_plans(plans: list[PartitionPlan], cap: int | None) -> list[PartitionPlan]:
    """Shrinks the plans so the checkpoint reads at most `cap` records.

    Released ranges come first, oldest offsets of each partition first, partitions in
    order; what the cap leaves of one stays released (`left_released`). The rest of the
    budget is shared among fresh ranges in proportion to each partition's backlog,
    remainders going to the largest fractions, so the result is deterministic; a
    partition keeps its oldest offsets.
    """
    if cap is None:
        return plans
    budget, capped = cap, []
    for plan in plans:
        plan = _cap_released(plan, budget)
        budget -= sum(r.size for r in plan.replanned)
        capped.append(plan)
    backlog = [sum(r.size for r in p.fresh) for p in capped]
    wanted = sum(backlog)
    if wanted <= budget:
        return capped
    shares = [budget * b // wanted for b in backlog]
    by_fraction = sorted(range(len(capped)), key=lambda i: (-(budget * backlog[i] % wanted), i))
    for i in by_fraction[: budget - sum(shares)]:
        shares[i] += 1
    return [replace(p, fresh=_first(p.fresh, share)) for p, share in zip(capped, shares)]


def _cap_released(plan: PartitionPlan, budget: int) -> PartitionPlan:
    """The plan's released ranges read up to `budget` records. A released range read in
    part is still taken (its rows are split at the cut); one of which nothing is read
    and retention cut nothing off is left alone."""
    taken, replanned, left = [], [], []
    for released, read in zip(plan.released, plan.replanned):
        size = min(budget, read.size)
        budget -= size
        cut = read.start + size
        if size == 0 and read.start == released.start:
            continue
        taken.append(released)
        replanned.append(replace(read, end=cut))
        if cut < released.end:
            left.append(replace(released, start=cut))
    return replace(plan, released=tuple(taken), replanned=tuple(replanned), left_released=tuple(left))


def _first(ranges: tuple[OffsetRange, ...], count: int) -> tuple[OffsetRange, ...]:
    kept = []
    for r in ranges:
        take = min(count, r.size)
        if take:
            kept.append(replace(r, end=r.start + take))
        count -= take
    return tuple(kept)


def layers(ranges: Iterable[OffsetRange]) -> list[tuple[OffsetRange, ...]]:
    """The non-empty ranges grouped so that each group holds at most one range per
    partition (what one read of Spark's Kafka source takes), in offset order."""
    groups: list[list[OffsetRange]] = []
    depth: dict[tuple[str, int], int] = {}
    for r in sorted(r for r in ranges if r.size):
        level = depth.get((r.topic, r.partition), 0)
        depth[(r.topic, r.partition)] = level + 1
        if level == len(groups):
            groups.append([])
        groups[level].append(r)
    return [tuple(g) for g in groups]


def describe_ranges(ranges: tuple[OffsetRange, ...]) -> str:
    return ", ".join(f"{r.topic}[{r.partition}] {r.start}..{r.end}" for r in ranges) or "(none)"
