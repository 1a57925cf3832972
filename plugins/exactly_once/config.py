"""Typed pipeline configuration, validated once at the edge.

`load_config(mapping)` is the only way in: an invalid value raises
`ConfigError` naming the field and quoting the value. `load_stored_config` reads a version
the ledger recorded, which later rules do not refuse. The source's part is in
`exactly_once.config_source` (`Source` and `NO_KEY` are imported from here too).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from datetime import timedelta
from typing import Annotated, Any, Literal

from pydantic import Field, PositiveInt, StringConstraints, ValidationError, field_validator
from pydantic_core import InitErrorDetails, PydanticCustomError

from exactly_once.config_source import NO_KEY, STORED, Column, Frozen, Source, plugin_names, rule
from exactly_once.dead_letter_budget import DeadLetterBudget
from exactly_once.debezium import POSITION
from exactly_once.errors import ConfigError
from exactly_once.retention_policy import Retention
from exactly_once.sinks import mode_of
from exactly_once.sinks.upsert import MODE as UPSERT
from exactly_once.sinks.upsert import by_offset

__all__ = ["NO_KEY", "PipelineConfig", "Sink", "Source", "load_config", "load_stored_config"]

# Pipeline and sink names become parts of staging table names.
Name = Annotated[str, StringConstraints(pattern=r"^[a-z][a-z0-9_]{0,39}$")]
QualifiedTable = Annotated[str, StringConstraints(pattern=r"^([A-Za-z_][A-Za-z0-9_]*\.)?[A-Za-z_][A-Za-z0-9_]*$")]
# Kafka's own rule for topic names.
KafkaTopic = Annotated[str, StringConstraints(pattern=r"^[A-Za-z0-9._-]{1,249}$")]

class Sink(Frozen):
    name: Name = Field(description="Name of the sink within the pipeline (names its staging table).")
    table: QualifiedTable = Field(description="Final table, 'schema.table' or 'table'; created by the user.")
    mode: str = Field(
        description="How rows merge, a module of exactly_once.sinks: append: a row per record; upsert: by key, "
                    "the newest row wins (see `order_by`); aggregate: measures of each group are added; kafka: "
                    "published to `topic` through the outbox (docs/guide/kafka-output.md).",
        json_schema_extra=lambda schema: schema.update(enum=plugin_names("exactly_once.sinks")))
    keys: tuple[Column, ...] = Field((), description="upsert: the key columns; aggregate: the group columns; "
                                                     "kafka: the columns of each record's key.")
    measures: dict[Column, Literal["sum", "count", "min", "max"]] = Field(
        {}, description="aggregate: column -> how it merges; kafka: how a checkpoint's rows of a key fold into "
                        "one record (none: a record per row).")
    order_by: Column | None = Field(
        None, description="upsert only: the column that says which of a key's rows is newest, e.g. an event "
                          "time (a number, date or timestamp, never null): the row highest in (order_by, "
                          "kafka_topic, kafka_partition, kafka_offset) wins, whatever order checkpoints commit "
                          "in. Without it the highest (kafka_offset, kafka_partition) wins, which holds only "
                          "while each key's records are in one partition of one topic: required with several "
                          "topics, and before partitions are added.")

    topic: KafkaTopic | None = Field(
        None, description="kafka only: the topic the sink's rows are published to, keyed by `keys`.")
    progress_topic: KafkaTopic | None = Field(
        None, description="kafka only: the compacted topic of one partition where the sink's publisher keeps, in "
                          "the Kafka transaction of each batch of records, the last outbox row it published; no "
                          "other publisher may write it. Default `exactly_once_progress-PIPELINE-SINK`, created "
                          "if missing.")
    on_reprocess: Literal["refuse", "republish"] = Field(
        "refuse", description="kafka only: a reprocessing of a committed checkpoint cannot take back records "
                              "Kafka has: refuse it, or publish the new records again, each with the header "
                              "`exactly_once.replaces` naming the checkpoint they replace.")

    @field_validator("mode")
    @classmethod
    def _mode_known(cls, mode: str) -> str:
        mode_of(mode)
        return mode

    @rule
    def _mode_fits(self) -> Sink:
        if self.order_by is not None and self.mode != "upsert":
            raise ValueError(f"order_by is for upsert sinks, not {self.mode} sinks")
        kafka_only = {"topic": None, "progress_topic": None, "on_reprocess": "refuse"}
        misplaced = [f for f, default in kafka_only.items() if getattr(self, f) != default]
        if self.mode != "kafka" and misplaced:
            raise ValueError(f"{', '.join(misplaced)}: for kafka sinks, not {self.mode} sinks")
        self.strategy.check(self)
        return self

    @property
    def strategy(self):
        """How the sink's rows are staged and merged: its mode's `exactly_once.sinks.SinkMode`."""
        return mode_of(self.mode)

    @property
    def schema_and_table(self) -> tuple[str, str]:
        schema, _, table = self.table.rpartition(".")
        return schema or "public", table


class PipelineConfig(Frozen):
    name: Name = Field(description="Unique name of the pipeline in the ledger.")
    source: Source = Field(description="Where the records come from: the `source` table below.")
    sinks: tuple[Sink, ...] = Field(min_length=1, description="Final tables committed together by a checkpoint: "
                                                            "the `sinks[]` table below.")
    transform: str | None = Field(
        None, pattern=r"^[A-Za-z_][\w.]*:[A-Za-z_]\w*$",
        description="'module:function' taking and returning a Spark DataFrame, applied before the sinks; "
                    "each output row keeps its record's `kafka_` columns and, without a shuffle of the "
                    "transform's own, comes from that record alone (the docs' Your own pipeline, step 5).")
    on_bad_record: Literal["dead_letter", "fail"] = Field(
        "dead_letter", description="A record that cannot be parsed, does not fit the schema, or whose rows a "
                                   "sink table would refuse: to the dead-letter table, or fail the run naming it.")
    allow_data_loss: bool = Field(
        False, description="If records were deleted by retention before they were read: record the gap "
                           "and go on (true) or stop with an error naming the partition (false).")
    max_records_per_run: PositiveInt | None = Field(None, description="Cap on the records one checkpoint plans.")
    max_record_bytes: PositiveInt | None = Field(
        None, description="A record whose key and value together are larger is a dead letter, before its value is "
                          "parsed; it also bounds the bytes of what one Spark task reads and one batch of staging "
                          "writes buffers (by records of this size). None: no bound (tasks of 250,000 offsets, "
                          "batches of 10,000 rows).")
    stall_after: PositiveInt = Field(
        3, description="A checkpoint whose attempts fail this many times in a row for one cause (or once "
                       "in a way no retry can fix) is stalled: every later run fails naming it until an "
                       "operator clears its task, retries it or dead-letters a range.")
    dead_letter_budget: DeadLetterBudget = Field(
        DeadLetterBudget(), description="How many dead letters a checkpoint may commit: beyond it, its commit "
                                        "stalls, its pre-commit kept (the `dead_letter_budget` table below). By "
                                        "default a checkpoint is beyond it with at least 20 dead letters that are "
                                        "more than half of the Kafka records it read.")
    lease: timedelta = Field(
        timedelta(hours=1), gt=timedelta(0),
        description="How long a begun checkpoint or a running attempt is held before the next run's "
                    "recovery may take it over.")
    retention: Retention = Field(
        Retention(), description="How long the ledger keeps what checkpoints leave behind, and how far back a "
                                 "checkpoint can be reprocessed (the `retention` table below).")

    @rule
    def _sink_names_unique(self) -> PipelineConfig:
        names = [s.name for s in self.sinks]
        duplicates = sorted({n for n in names if names.count(n) > 1})
        if duplicates:
            raise ValueError(f"sink names must be unique, repeated: {duplicates}")
        return self

    @rule
    def _progress_topics_apart(self) -> PipelineConfig:
        """A progress topic holds one publisher's progress: two sinks sharing one would each
        read the other's as their own (and fence each other's transactions)."""
        shared = sorted({s.progress_topic for s in self.sinks if s.progress_topic is not None
                         and [o.progress_topic for o in self.sinks].count(s.progress_topic) > 1})
        if shared:
            raise ValueError(f"kafka sinks share progress_topic {shared}: each sink needs a progress topic of "
                             "its own (leave it unset for exactly_once_progress-PIPELINE-SINK)")
        return self

    @rule
    def _upsert_order_defined(self) -> PipelineConfig:
        """Offsets of two topics do not compare, so which of a key's rows is newest would depend
        on commit order: with several topics, every upsert sink needs its `order_by`."""

        topics = sorted(set(self.source.topics))
        errors = [InitErrorDetails(type=PydanticCustomError(
                      "order_by", f"sink {sink.name!r} is an upsert sink ordered by offset, and offsets of the "
                                  f"topics {topics} do not compare: give it an order_by column (an event time, "
                                  "say)"), loc=("sinks", i, "order_by"), input=None)
                  for i, sink in enumerate(self.sinks) if len(topics) > 1 and by_offset(sink)]
        if errors:
            raise ValidationError.from_exception_data(type(self).__name__, errors)
        return self

    @rule
    def _tombstones_delete_somewhere(self) -> PipelineConfig:
        """A delete must be ordered like its key's other records: an upsert sink's order_by
        value is the value's, which a tombstone has not; and it names its row by the key alone."""
        if self.source.tombstones != "delete":
            return self
        upserts = [sink for sink in self.sinks if sink.strategy is UPSERT]
        ordered = [sink.name for sink in upserts if not by_offset(sink)]
        if ordered:
            raise ValueError(f"tombstones 'delete': upsert sinks {ordered} are ordered by order_by, a value's "
                             "field, which a tombstone lacks; a delete needs sinks ordered by offset")
        unkeyed = [sink.name for sink in upserts if not set(sink.keys) <= set(self.source.key_schema)]
        if unkeyed or not upserts:
            raise ValueError("tombstones 'delete' deletes rows of upsert sinks keyed by the key's fields "
                             f"(source.key_schema {sorted(self.source.key_schema)}); "
                             + (f"sinks {unkeyed} are keyed otherwise" if unkeyed else "the pipeline has none"))
        return self

    @rule
    def _change_events_ordered(self) -> PipelineConfig:
        """A change event's row wins by its source position, deletes included, whatever
        partition or checkpoint brought it: an upsert sink is ordered by debezium_position, and
        keyed by columns of the row image, which a delete's `before` holds."""
        if self.source.envelope != "debezium":
            return self
        upserts = [sink for sink in self.sinks if sink.strategy is UPSERT]
        unordered = [sink.name for sink in upserts if sink.order_by != POSITION]
        if unordered:
            raise ValueError(f"envelope 'debezium': upsert sinks {unordered} must be ordered by the source's "
                             f"position, order_by: {POSITION} (a numeric(38,0) column of their tables)")
        unkeyed = [sink.name for sink in upserts if not set(sink.keys) <= set(self.source.value_schema)]
        if unkeyed:
            raise ValueError(f"envelope 'debezium': upsert sinks {unkeyed} must be keyed by value_schema columns, "
                             "which a delete event's before image holds")
        return self

    def sink(self, name: str) -> Sink:
        for sink in self.sinks:
            if sink.name == name:
                return sink
        raise KeyError(f"pipeline {self.name!r} has no sink {name!r}")


def load_config(data: Mapping[str, Any]) -> PipelineConfig:
    """A pipeline's configuration as its DAG file declares it, checked by every rule."""
    return _load(data, None)


def load_stored_config(data: Mapping[str, Any]) -> PipelineConfig:
    """A configuration version as the ledger recorded it: parsed, but not checked again by
    rules (`rule`) this release may have added since it was recorded."""
    return _load(data, STORED)


def _load(data: Mapping[str, Any], context: dict | None) -> PipelineConfig:
    try:
        return PipelineConfig.model_validate(data, context=context)
    except ValidationError as error:
        name = data.get("name") if isinstance(data, Mapping) else None
        errors = error.errors()
        # A failed item also fails its container's length check; name only the item.
        specific = [e for e in errors
                    if not any(o["loc"][:len(e["loc"])] == e["loc"] and len(o["loc"]) > len(e["loc"]) for o in errors)]
        problems = "; ".join(_describe(e) for e in specific)
        raise ConfigError(f"pipeline config {name!r}: {problems}") from None


def _describe(error: Mapping[str, Any]) -> str:
    where = ".".join(str(part) for part in error["loc"]) or "(top level)"
    message = re.sub(r"^Value error, ", "", error["msg"])
    return f"{where}: {message} (got {error['input']!r})"
