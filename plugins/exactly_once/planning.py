"""Planning a checkpoint's offset ranges: pure functions, no I/O.

Per partition the range is [from, to): from is the pipeline's frontier (or its
start position), to is the first offset whose timestamp is at or after the
run's data_interval_end, capped by the last stable offset at planning time and
by the per-run record cap. A range released by an aborted checkpoint is planned
again exactly as it was, before any new data.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace
from datetime import datetime
from typing import Literal, Protocol

from exactly_once.errors import Permanent


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
        """`topic[partition]@start..end`, as operators write a range (exactly_once.stalls)."""
        return f"{self.topic}[{self.partition}]@{self.start}..{self.end}"


@dataclass(frozen=True)
class PartitionOffsets:
    """What Kafka says about one partition when the checkpoint is planned."""

    log_start: int
    last_stable: int
    at_interval_end: int | None = None   # first offset with timestamp >= interval end; None: no such record yet
    at_start_time: int | None = None     # the same for a pipeline that starts at a timestamp


class OffsetSource(Protocol):
    """What planning asks Kafka (exactly_once.kafka_offsets.KafkaOffsets)."""

    def partitions(self, topic: str) -> list[int]: ...

    def offsets(self, topic: str, partition: int, interval_end: datetime | None,
                start_time: datetime | None = None) -> PartitionOffsets: ...


@dataclass(frozen=True)
class PartitionState:
    """What the ledger says about one partition of the pipeline."""

    topic: str
    partition: int
    frontier: int | None          # None: the pipeline has never planned this partition
    released: OffsetRange | None  # oldest range of an aborted checkpoint awaiting a new plan


@dataclass(frozen=True)
class PartitionPlan:
    range: OffsetRange
    start_offset: int             # where the pipeline started in this partition
    gap: OffsetRange | None       # offsets lost to retention (only when data loss is allowed)
    replanned: bool               # the range was released by an aborted checkpoint


class DataLossError(Permanent):
    """Records were deleted by retention before the pipeline read them."""

    def __init__(self, topic: str, partition: int, frontier: int, log_start: int):
        self.topic, self.partition, self.frontier, self.log_start = topic, partition, frontier, log_start
        super().__init__(
            f"{topic}[{partition}]: offsets {frontier}..{log_start - 1} ({log_start - frontier} records) were "
            f"deleted by Kafka retention before this pipeline read them; set allow_data_loss to record "
            f"the gap and go on")


StartPosition = Literal["earliest", "latest"] | datetime


def start_offset(position: StartPosition, offsets: PartitionOffsets, new_pipeline: bool) -> int:
    """Where reading begins in a partition the pipeline has never planned."""
    if not new_pipeline or position == "earliest":
        return offsets.log_start  # a partition added later: all of it
    if position == "latest":
        return offsets.last_stable
    return offsets.last_stable if offsets.at_start_time is None else offsets.at_start_time


def plan_partition(state: PartitionState, offsets: PartitionOffsets, start: int, allow_data_loss: bool
                   ) -> PartitionPlan:
    if state.released is not None:
        return _survive_retention(state.released, offsets, start, allow_data_loss, replanned=True)
    begin = start if state.frontier is None else state.frontier
    bound = offsets.last_stable if offsets.at_interval_end is None else min(offsets.at_interval_end,
                                                                            offsets.last_stable)
    # A frontier past the bound (an earlier interval run late) plans nothing: those
    # records already belong to a checkpoint.
    wanted = OffsetRange(state.topic, state.partition, begin, max(begin, bound))
    return _survive_retention(wanted, offsets, start, allow_data_loss, replanned=False)


def _survive_retention(wanted: OffsetRange, offsets: PartitionOffsets, start: int, allow_data_loss: bool,
                       replanned: bool) -> PartitionPlan:
    if wanted.start >= offsets.log_start:
        return PartitionPlan(wanted, start, None, replanned)
    if not allow_data_loss:
        raise DataLossError(wanted.topic, wanted.partition, wanted.start, offsets.log_start)
    cut = min(offsets.log_start, wanted.end)
    return PartitionPlan(replace(wanted, start=cut), start, replace(wanted, end=cut), replanned)


def plan_checkpoint(seen: Mapping[tuple[str, int], PartitionOffsets],
                    known: Mapping[tuple[str, int], tuple[int, int]],
                    released: Mapping[tuple[str, int], OffsetRange],
                    start: StartPosition, allow_data_loss: bool, cap: int | None) -> list[PartitionPlan]:
    """Every partition's plan, in (topic, partition) order: `seen` is what Kafka says now,
    `known` the ledger's (start offset, frontier) per partition, `released` the oldest
    released range per partition."""
    plans = []
    for (topic, partition), offsets in sorted(seen.items()):
        start_at, frontier = known.get((topic, partition), (None, None))
        if start_at is None:
            start_at = start_offset(start, offsets, new_pipeline=not known)
        state = PartitionState(topic, partition, frontier, released.get((topic, partition)))
        plans.append(plan_partition(state, offsets, start_at, allow_data_loss))
    return cap_plans(plans, cap)


def cap_plans(plans: list[PartitionPlan], cap: int | None) -> list[PartitionPlan]:
    """Shrinks new ranges so the checkpoint plans at most `cap` records.

    Replanned ranges are taken whole (they are frozen); the rest of the budget
    is shared in proportion to each partition's backlog, remainders going to the
    largest fractions, so the result is deterministic.
    """
    if cap is None:
        return plans
    fresh = [i for i, p in enumerate(plans) if not p.replanned]
    budget = max(0, cap - sum(p.range.size for p in plans if p.replanned))
    wanted = sum(plans[i].range.size for i in fresh)
    if wanted <= budget:
        return plans
    shares = {i: budget * plans[i].range.size // wanted for i in fresh}
    by_fraction = sorted(fresh, key=lambda i: (-(budget * plans[i].range.size % wanted), i))
    for i in by_fraction[: budget - sum(shares.values())]:
        shares[i] += 1
    capped = list(plans)
    for i, share in shares.items():
        r = plans[i].range
        capped[i] = replace(plans[i], range=replace(r, end=r.start + share))
    return capped
