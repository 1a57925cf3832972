"""A pipeline's sinks as Airflow assets, so a downstream DAG runs after the rows it reads
are committed. Each sink is an asset whose URI names its table as OpenLineage does
(exactly_once.orchestration.lineage: `postgres://{host}:{port}/{database}/{schema}/{table}`;
a kafka sink's topic, `kafka://{first bootstrap host:port}/{topic}`) and whose name is
`exactly_once.{pipeline}.{sink}`. Its events are emitted through an alias of its own,
`exactly_once:{pipeline}:{sink}`: a downstream DAG schedules on that alias (`sink_alias`),
which needs no host and, unlike a reference by name, hands the run its triggering events.

The tasks that commit (begin, commit) declare their table sinks' aliases as outlets, the
publish task its kafka sinks'. Begin and commit add an event per sink for each committed
checkpoint they claim to announce (exactly_once.ledger.announcements, by the task's try
generation: `announcer`), the publish task for what it published; an alias with no event
added emits nothing. Pure but for `announce`, which fills the task's `outlet_events`.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from airflow.sdk import Asset, AssetAlias

from exactly_once.config import PipelineConfig
from exactly_once.ledger.announcements import Committed
from exactly_once.orchestration import lineage
from exactly_once.publishing.publisher import Published


@dataclass(frozen=True)
class Event:
    sink: str
    asset: Asset
    extra: dict[str, Any]


def sink_alias(config: PipelineConfig, sink: str) -> AssetAlias:
    """What a DAG to run after the sink's commits schedules on."""
    return AssetAlias(f"exactly_once:{config.name}:{config.sink(sink).name}")


def table_outlets(config: PipelineConfig) -> list[AssetAlias]:
    """The outlets of the tasks that commit (begin, commit)."""
    return [sink_alias(config, sink.name) for sink in config.sinks if sink.mode != "kafka"]


def topic_outlets(config: PipelineConfig) -> list[AssetAlias]:
    """The outlets of the publish task."""
    return [sink_alias(config, sink.name) for sink in config.sinks if sink.mode == "kafka"]


def announcer(context: Any) -> str:
    """The task's try generation, as the ledger records its claims: its DAG run, how often that
    run was cleared, the task. A retry keeps it (so it announces again what a try that failed
    after claiming never emitted); clearing the task or the run starts another."""
    return f"{context['run_id']}#{context['dag_run'].clear_number}#{context['ti'].task_id}"


def asset_name(config: PipelineConfig, sink: str) -> str:
    return f"exactly_once.{config.name}.{sink}"


def table_asset(config: PipelineConfig, sink: str, host: str, port: int, database: str) -> Asset:
    """The URI is the OpenLineage name's parts as a path (the postgres provider's form)."""
    return Asset(name=asset_name(config, sink),
                 uri="/".join([lineage.postgres_namespace(host, port), database, *config.sink(sink).schema_and_table]))


def topic_asset(config: PipelineConfig, sink: str, bootstrap_servers: str) -> Asset:
    named = lineage.topic(config.sink(sink).topic, bootstrap_servers)
    return Asset(name=asset_name(config, sink), uri=f"{named.namespace}/{named.name}")


def committed_events(config: PipelineConfig, committed: Iterable[Committed], host: str, port: int,
                     database: str) -> list[Event]:
    """An event per table sink each checkpoint put rows in (or, a reprocessing, took rows
    back from), with what a downstream DAG needs to find them."""
    events = []
    for checkpoint in committed:
        rows = {sink.name: checkpoint.rows.get(sink.name, 0) for sink in config.sinks if sink.mode != "kafka"}
        taken_back = checkpoint.taken_back or {}
        for name, put_in in rows.items():
            if not put_in and not taken_back.get(name):
                continue
            extra = {
                "pipeline": config.name, "sink": name, "table": config.sink(name).table,
                "checkpoint_id": checkpoint.checkpoint_id, "dag_run_id": checkpoint.dag_run_id,
                "data_interval": None if checkpoint.interval_start is None or checkpoint.interval_end is None
                else {"start": checkpoint.interval_start.isoformat(), "end": checkpoint.interval_end.isoformat()},
                "ranges": [{"topic": r.topic, "partition": r.partition, "from_offset": r.start, "to_offset": r.end}
                           for r in checkpoint.ranges],
                "rows": put_in, "rows_per_sink": rows, "config_version": checkpoint.config_version,
                "reprocessing": None if checkpoint.replays is None else
                {"replays": checkpoint.replays, "rows_taken_back": taken_back.get(name, 0)}}
            events.append(Event(name, table_asset(config, name, host, port, database), extra))
    return events


def published_events(config: PipelineConfig, published: Iterable[Published], bootstrap_servers: str) -> list[Event]:
    """An event per kafka sink that published records."""
    return [Event(p.sink, topic_asset(config, p.sink, bootstrap_servers),
                  {"pipeline": config.name, "sink": p.sink, "topic": config.sink(p.sink).topic, "records": p.records,
                   "transactions": p.transactions, "through": None if p.through is None else
                   {"checkpoint_id": p.through.checkpoint_id, "position": p.through.position}})
            for p in published if p.records]


def announce(context: Any, config: PipelineConfig, events: Iterable[Event]) -> None:
    """The events, each added to its sink's alias among the task's outlets: Airflow emits
    them once the task succeeds."""
    for event in events:
        context["outlet_events"][sink_alias(config, event.sink)].add(event.asset, extra=event.extra)
