"""Runs woken by records: a DAG whose schedule is an asset watched by `RecordsWaiting`, a
trigger that asks Kafka and the ledger, every `poll_every`, whether the pipeline's next run
has work (exactly_once.ledger.waiting: records to plan, abandoned checkpoints to recover, a
first run), and emits an asset event once it has, at most once every `min_gap`. It is only
a wake-up: the woken run's begin plans as any run does, from the ledger. It joins no
consumer group and commits nothing; it reads the topics' offsets as the planner does, and
the ledger as the read role.

A burst of records wakes one run: the run's plan takes what is waiting, so the next poll
finds nothing; the events a poll emits while a run is queued or running become one more
run at most (Airflow queues a DAG once per asset, and `max_active_runs=1` holds it), which
finds nothing new and ends in its begin.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from datetime import timedelta
from typing import Any

import psycopg2
from airflow.sdk import Asset, AssetOrTimeSchedule, AssetWatcher, BaseHook
from airflow.triggers.base import BaseEventTrigger, TriggerEvent

from exactly_once.config import PipelineConfig, load_stored_config
from exactly_once.connections import KAFKA, PIPELINE_DB_READ, db_parameters, kafka_client_of
from exactly_once.errors import error_text, is_retryable
from exactly_once.ledger.kafka_offsets import KafkaOffsets
from exactly_once.ledger.protocol import Ledger
from exactly_once.ledger.waiting import work_waiting

log = logging.getLogger(__name__)


class RecordsWaiting(BaseEventTrigger):
    """Emits `{"pipeline", "reason"}` once the pipeline's next run has work. `config`: the
    pipeline's configuration as JSON (the DAG's own, so a pipeline that never ran is woken too)."""

    def __init__(self, config: str, min_gap: float, poll_every: float, kafka_conn_id: str = KAFKA,
                 db_conn_id: str = PIPELINE_DB_READ):
        super().__init__()
        self.config, self.min_gap, self.poll_every = config, min_gap, poll_every
        self.kafka_conn_id, self.db_conn_id = kafka_conn_id, db_conn_id

    def serialize(self) -> tuple[str, dict[str, Any]]:
        return f"{__name__}.{type(self).__name__}", {
            "config": self.config, "min_gap": self.min_gap, "poll_every": self.poll_every,
            "kafka_conn_id": self.kafka_conn_id, "db_conn_id": self.db_conn_id}

    async def run(self):
        config = load_stored_config(json.loads(self.config))
        woke = None
        while True:
            if woke is not None:
                await asyncio.sleep(max(0.0, woke + self.min_gap - time.monotonic()))
            reason = await self._work_waiting(config)
            if reason:
                woke = time.monotonic()
                log.info("pipeline %s: woken: %s", config.name, reason)
                yield TriggerEvent({"pipeline": config.name, "reason": reason})
            await asyncio.sleep(self.poll_every)

    async def _work_waiting(self, config: PipelineConfig) -> str | None:
        """Why the next run has work, or None. A failure a retry may fix (Kafka or the database
        unreachable) is logged, and the next poll asks again; one it cannot (offsets lost, a
        topic gone, a connection of the wrong type) wakes a run, which fails on it loudly."""
        try:
            kafka = await BaseHook.aget_connection(self.kafka_conn_id)
            db = await BaseHook.aget_connection(self.db_conn_id)
            return await asyncio.to_thread(self._ask, config, kafka, db)
        except Exception as error:  # a poll outlives any failure of what it asks
            if is_retryable(error):
                log.warning("pipeline %s: cannot tell whether work waits: %s", config.name, error_text(str(error)))
                return None
            return f"its next run cannot plan: {error_text(str(error))}"

    def _ask(self, config: PipelineConfig, kafka, db) -> str | None:
        parameters = db_parameters(db)
        ledger = Ledger(config, lambda: psycopg2.connect(**parameters))
        with KafkaOffsets(kafka_client_of(self.kafka_conn_id, kafka)) as offsets:
            return work_waiting(ledger, offsets)


def wake_on_records(config: PipelineConfig, min_gap: timedelta = timedelta(seconds=30),
                    poll_every: timedelta = timedelta(seconds=5), every=None, kafka_conn_id: str = KAFKA,
                    db_conn_id: str = PIPELINE_DB_READ):
    """A DAG's schedule that runs the pipeline when work waits (`RecordsWaiting`), and, with
    `every` (a timetable), on its intervals too (their runs keep their data intervals, and can
    be backfilled). Use it with `max_active_runs=1`."""
    asset = Asset(name=f"exactly_once.{config.name}.records_waiting",
                  uri=f"x-exactly-once://{config.name}/records-waiting",
                  watchers=[AssetWatcher(name=f"exactly_once_{config.name}_records_waiting", trigger=RecordsWaiting(
                      config.model_dump_json(), min_gap.total_seconds(), poll_every.total_seconds(), kafka_conn_id,
                      db_conn_id))])
    return asset if every is None else AssetOrTimeSchedule(timetable=every, assets=asset)
