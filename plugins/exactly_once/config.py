"""Typed pipeline configuration, validated once at the edge.

`load_config(mapping)` is the only way in: an invalid value raises
`ConfigError` naming the field and quoting the value.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from datetime import datetime, timedelta
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, PositiveInt, StringConstraints, ValidationError, model_validator

# Pipeline and sink names become parts of staging table names.
Name = Annotated[str, StringConstraints(pattern=r"^[a-z][a-z0-9_]{0,39}$")]
Column = Annotated[str, StringConstraints(pattern=r"^[A-Za-z_][A-Za-z0-9_]*$")]
QualifiedTable = Annotated[str, StringConstraints(pattern=r"^([A-Za-z_][A-Za-z0-9_]*\.)?[A-Za-z_][A-Za-z0-9_]*$")]

# Columns the library fills in from Kafka's metadata: append sinks are unique on
# all three, upsert sinks keep the winning record's partition and offset.
KAFKA_TOPIC, KAFKA_PARTITION, KAFKA_OFFSET = "kafka_topic", "kafka_partition", "kafka_offset"


class ConfigError(ValueError):
    """A pipeline configuration that cannot be used; the message names the field."""


class _Frozen(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class Source(_Frozen):
    topics: tuple[str, ...] = Field(min_length=1, description="Kafka topics read by the pipeline.")
    start: Literal["earliest", "latest"] | datetime = Field(
        "earliest",
        description="Where a new pipeline starts in each partition: the log start, the last stable "
                    "offset at its first plan, or the first offset at or after a timestamp. "
                    "Partitions added later always start at their earliest offset.")
    value_format: Literal["json"] = Field("json", description="Encoding of record values.")
    value_schema: dict[Column, str] = Field(
        min_length=1, description="Fields of the value: column name -> Spark SQL type (e.g. 'bigint').")


class Sink(_Frozen):
    name: Name = Field(description="Name of the sink within the pipeline (names its staging table).")
    table: QualifiedTable = Field(description="Final table, 'schema.table' or 'table'; created by the user.")
    mode: Literal["append", "upsert", "aggregate"] = Field(
        description="append: a row per record; upsert: by key, the highest offset wins; "
                    "aggregate: measures of each group are added.")
    keys: tuple[Column, ...] = Field((), description="upsert: the key columns; aggregate: the group columns.")
    measures: dict[Column, Literal["sum", "count", "min", "max"]] = Field(
        default_factory=dict, description="aggregate only: column -> how it merges.")

    @model_validator(mode="after")
    def _mode_fits(self) -> Sink:
        if self.mode == "append" and (self.keys or self.measures):
            raise ValueError(f"append sinks are keyed by ({KAFKA_TOPIC}, {KAFKA_PARTITION}, {KAFKA_OFFSET}); "
                             f"keys {list(self.keys)} and measures {dict(self.measures)} must be empty")
        if self.mode in ("upsert", "aggregate") and not self.keys:
            raise ValueError(f"{self.mode} sinks need keys")
        if self.mode == "upsert" and self.measures:
            raise ValueError(f"upsert sinks take no measures, got {dict(self.measures)}")
        if self.mode == "aggregate" and not self.measures:
            raise ValueError("aggregate sinks need measures")
        return self

    @property
    def schema_and_table(self) -> tuple[str, str]:
        schema, _, table = self.table.rpartition(".")
        return schema or "public", table


class PipelineConfig(_Frozen):
    name: Name = Field(description="Unique name of the pipeline in the ledger.")
    source: Source
    sinks: tuple[Sink, ...] = Field(min_length=1, description="Final tables committed together by a checkpoint.")
    transform: str | None = Field(
        None, pattern=r"^[A-Za-z_][\w.]*:[A-Za-z_]\w*$",
        description="'module:function' taking and returning a Spark DataFrame, applied before the sinks.")
    on_bad_record: Literal["dead_letter", "fail"] = Field(
        "dead_letter", description="A record that cannot be parsed: to the dead-letter table, or fail the run.")
    allow_data_loss: bool = Field(
        False, description="If records were deleted by retention before they were read: record the gap "
                           "and go on (true) or stop with an error naming the partition (false).")
    max_records_per_run: PositiveInt | None = Field(None, description="Cap on the records one checkpoint plans.")
    lease: timedelta = Field(
        timedelta(hours=1), gt=timedelta(0),
        description="How long a begun checkpoint or a running attempt is held before the next run's "
                    "recovery may take it over.")

    @model_validator(mode="after")
    def _sink_names_unique(self) -> PipelineConfig:
        names = [s.name for s in self.sinks]
        duplicates = sorted({n for n in names if names.count(n) > 1})
        if duplicates:
            raise ValueError(f"sink names must be unique, repeated: {duplicates}")
        return self

    def sink(self, name: str) -> Sink:
        return next(s for s in self.sinks if s.name == name)


def load_config(data: Mapping[str, Any]) -> PipelineConfig:
    try:
        return PipelineConfig.model_validate(data)
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
