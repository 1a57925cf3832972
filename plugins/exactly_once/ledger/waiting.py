"""What Kafka holds for a pipeline's next plan: the offsets each partition shows (what a
begin plans from), and why the next run that is not a backfill has work, without planning
it (how a DAG woken by records knows to wake: exactly_once.orchestration.wake). Reads only,
with the read role's rights.
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
    return {(topic, p): offsets for topic in source.topics
            for p, offsets in kafka.topic_offsets(topic, interval_start, interval_end, start_time).items()}


def work_waiting(ledger: LedgerAccess, kafka: OffsetSource) -> str | None:
    """Why the next run has work, or None: records its plan would take now (its backlog, and
    the ranges aborted checkpoints released), checkpoints abandoned with their lease run out
    (its recovery aborts them), or a pipeline that never ran and does not start at the
    earliest offsets (its first run sets where it starts). None while a checkpoint is stalled:
    every begin refuses until an operator acts (promise 9; the stall alerts on its own).
    Planning's refusals (lost offsets, a topic gone) are raised, as a run would raise them."""
    config = ledger.config
    with ledger.rows() as rows:
        rows.run("stalled", pipeline=config.name)
        if rows.cur.fetchall():
            return None
        rows.run("recoverable", pipeline=config.name, now=ledger.now(), own_run="")
        abandoned = [checkpoint_id for checkpoint_id, state in rows.cur.fetchall() if state != "precommitted"]
        known = rows.partitions()
    if abandoned:
        return f"checkpoint(s) {', '.join(map(str, abandoned))} abandoned: their lease ran out"
    plans = plan_checkpoint(seen_offsets(config, kafka, None, None), known, config.source.start, Reach.BACKLOG,
                            config.allow_data_loss, config.max_records_per_run)
    waiting = sum(plan.size for plan in plans)
    if waiting:
        return f"{waiting} records wait"
    if not known and config.source.start != "earliest":
        return "it never ran: its first run sets where it starts"
    return None
