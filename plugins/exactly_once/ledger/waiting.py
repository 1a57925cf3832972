"""What Kafka holds for a pipeline's next plan: the offsets each partition shows (what a
begin plans from), and the records a run's plan would take now, without planning it (how a
DAG woken by records knows to wake: exactly_once.orchestration.wake). Reads only.
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import datetime
from typing import TYPE_CHECKING

from exactly_once.config import PipelineConfig
from exactly_once.ledger.planning import OffsetSource, PartitionOffsets, Reach, plan_checkpoint

if TYPE_CHECKING:
    from exactly_once.ledger.access import LedgerAccess


def seen_offsets(config: PipelineConfig, kafka: OffsetSource, interval_start: datetime | None,
                 interval_end: datetime | None) -> Mapping[tuple[str, int], PartitionOffsets]:
    """Per partition of the pipeline's topics, the offsets a plan of the interval starts from."""
    source = config.source
    start_time = source.start if isinstance(source.start, datetime) else None
    return {(topic, p): kafka.offsets(topic, p, interval_start, interval_end, start_time)
            for topic in source.topics for p in kafka.partitions(topic)}


def records_waiting(ledger: LedgerAccess, kafka: OffsetSource) -> int:
    """How many records the next run that is not a backfill would plan now (at most the
    pipeline's `max_records_per_run`): its backlog, and the ranges aborted checkpoints released."""
    config = ledger.config
    with ledger.rows() as rows:
        known = rows.partitions()
    plans = plan_checkpoint(seen_offsets(config, kafka, None, None), known, config.source.start, Reach.BACKLOG,
                            config.allow_data_loss, config.max_records_per_run)
    return sum(plan.size for plan in plans)
