"""Typed pipeline configuration, validated once at the edge.

`load_config(mapping)` is the only way in: an invalid value raises
`ConfigError` naming the field and quoting the value.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from datetime import datetime, timedelta
from typing import Annotated, Any, Literal

from pydantic import (BaseModel, ConfigDict, Field, PositiveInt, StringConstraints, ValidationError, ValidationInfo,
                      ValidatorFunctionWrapHandler, field_validator, model_validator)
from pydantic_core import InitErrorDetails, PydanticCustomError

from exactly_once.dead_letter_budget import DeadLetterBudget
from exactly_once.errors import ConfigError
from exactly_once.formats import format_of
from exactly_once.formats._avro_types import mismatches
from exactly_once.registry import Registry
from exactly_once.sinks import mode_of
from exactly_once.sinks.upsert import MODE as UPSERT
from exactly_once.sinks.upsert import by_offset
from exactly_once.spark_types import check as check_spark_type

# Pipeline and sink names become parts of staging table names.
Name = Annotated[str, StringConstraints(pattern=r"^[a-z][a-z0-9_]{0,39}$")]
Column = Annotated[str, StringConstraints(pattern=r"^[A-Za-z_][A-Za-z0-9_]*$")]
QualifiedTable = Annotated[str, StringConstraints(pattern=r"^([A-Za-z_][A-Za-z0-9_]*\.)?[A-Za-z_][A-Za-z0-9_]*$")]
# Kafka's own rule for topic names.
KafkaTopic = Annotated[str, StringConstraints(pattern=r"^[A-Za-z0-9._-]{1,249}$")]

STORED = {"stored": True}  # the validation context of a configuration version the ledger recorded


def _stored(info: ValidationInfo) -> bool:
    return bool(info.context and info.context.get("stored"))


def rule(check):
    """A validation rule of this release: applied to a configuration as it is loaded from a
    DAG file, never to a version the ledger recorded, which is the contract it ran under
    (promise 13: a rule added later must not strand a checkpoint pre-committed before it)."""
    def checked(self, info: ValidationInfo):
        return self if _stored(info) else check(self)

    checked.__name__, checked.__qualname__, checked.__doc__ = check.__name__, check.__qualname__, check.__doc__
    return model_validator(mode="after")(checked)


def _names(package: str) -> list[str]:
    """The plug-ins of a package (sink modes, value formats): the valid values the schema shows."""
    return Registry(package, "", "").names()


class _Frozen(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class RegistrySchema(_Frozen):
    subject: str = Field(min_length=1, description="A subject of the schema registry.")
    version: PositiveInt = Field(description="Its version: a number, as a version never changes once registered.")


ReaderSchema = str | RegistrySchema
NO_KEY = "none"


class Source(_Frozen):
    topics: tuple[str, ...] = Field(min_length=1, description="Kafka topics read by the pipeline.")
    start: Literal["earliest", "latest"] | datetime = Field(
        "earliest",
        description="Where a new pipeline starts in each partition: the log start, the last stable "
                    "offset at its first plan, or the first offset at or after a timestamp. "
                    "Partitions added later always start at their earliest offset.")
    value_format: str = Field(
        "json", description="Encoding of record values, a module of exactly_once.formats: json (an object in "
                            "UTF-8), string (UTF-8 text, one string field), avro (the schema registry's wire "
                            "format, read into value_reader_schema).",
        json_schema_extra=lambda schema: schema.update(enum=_names("exactly_once.formats")))
    schema_registry: str | None = Field(
        None, description="The Airflow connection (type http) of the schema registry whose Confluent-compatible "
                          "API the pipeline's record formats use: its extra holds the API's 'url' and TLS settings in "
                          "the Kafka connection's names, its login and password are basic auth. The first task and "
                          "`check` ask it for its subjects: a refused login or certificate stops the run.")
    value_schema: dict[Column, str] = Field(
        min_length=1, description="Fields of the value: column name -> Spark SQL type, exactly one type each: "
                                  "boolean, tinyint, smallint, int, bigint, float, double, decimal(p,s), date, "
                                  "timestamp, timestamp_ntz, string, binary, array<T>, map<K,V>, struct<name: T, "
                                  "...> (exactly_once.spark_types).")
    value_reader_schema: ReaderSchema | None = Field(
        None, description="avro: the schema every value is read into, whatever schema wrote it (fields added with "
                          "defaults, removed, widened): an Avro record schema as JSON text, or {subject, version} "
                          "of the schema registry. Its fields must give value_schema's columns their types.")
    key_format: str = Field(
        NO_KEY, description="Encoding of record keys: none (not decoded; kept as bytes in the dead letters), or "
                            "a format like value_format's; the key's fields become columns beside the value's.",
        json_schema_extra=lambda schema: schema.update(enum=[NO_KEY, *_names("exactly_once.formats")]))
    key_schema: dict[Column, str] = Field(
        {}, description="Fields of the key, like value_schema's (string: one string field). A key and a value "
                        "field may not share a name.")
    key_reader_schema: ReaderSchema | None = Field(None, description="avro keys: like value_reader_schema.")
    tombstones: Literal["dead_letter", "skip", "delete"] = Field(
        "dead_letter", description="A record with a key and a null value: a dead letter; skipped (no row, no dead "
                                   "letter); or delete: it deletes its key's row from each upsert sink ordered by "
                                   "offset (keyed by key fields), ordered like the key's other records, and "
                                   "makes no row in other sinks.")

    @field_validator("value_format")
    @classmethod
    def _format_known(cls, value_format: str) -> str:
        format_of(value_format)
        return value_format

    @field_validator("key_format")
    @classmethod
    def _key_format_known(cls, key_format: str) -> str:
        if key_format != NO_KEY:
            format_of(key_format)
        return key_format

    @field_validator("value_schema", "key_schema", mode="wrap")
    @classmethod
    def _types_parse(cls, fields: Any, handler: ValidatorFunctionWrapHandler, info: ValidationInfo
                     ) -> dict[str, str]:
        """Each type must be one Spark SQL data type: unchecked, `"int, x string"` would add a
        column to the parsed schema. An error is located at `<field>.<column>`."""
        schema = handler(fields)
        if _stored(info):
            return schema
        errors = []
        for column, spark_type in schema.items():
            try:
                check_spark_type(spark_type)
            except ValueError as error:
                errors.append(InitErrorDetails(type=PydanticCustomError("spark_type", str(error)), loc=(column,),
                                               input=spark_type))
        if errors:
            raise ValidationError.from_exception_data(cls.__name__, errors)
        return schema

    @rule
    def _encodings_fit(self) -> Source:
        for part in ("value", "key"):
            self._encoding_fits(part)
        shared = sorted(set(self.key_schema) & set(self.value_schema))
        if shared:
            raise ValueError(f"key_schema and value_schema both have {shared}: a column is one or the other")
        if self.tombstones == "delete" and self.key_format == NO_KEY:
            raise ValueError("tombstones 'delete' needs the key decoded (key_format): a delete deletes a key's row")
        return self

    def _encoding_fits(self, part: str) -> None:
        name, schema, reader = (getattr(self, f"{part}_{a}") for a in ("format", "schema", "reader_schema"))
        if name == NO_KEY:
            if schema or reader is not None:
                raise ValueError("key_schema and key_reader_schema are for a decoded key: set key_format")
            return
        if not schema:
            raise ValueError(f"{part}_format {name!r} needs {part}_schema (the columns it gives)")
        if name == "string" and list(schema.values()) != ["string"]:
            raise ValueError(f"{part}_format 'string' gives one string column: {part}_schema must be "
                             f"{{'<name>': 'string'}}, got {dict(schema)}")
        registry = format_of(name).needs_registry
        if registry and (self.schema_registry is None or reader is None):
            raise ValueError(f"{part}_format {name!r} needs schema_registry (the connection) and "
                             f"{part}_reader_schema (what records are read into)")
        if not registry and reader is not None:
            raise ValueError(f"{part}_reader_schema is for registry formats (avro), not {name!r}")
        if isinstance(reader, str):
            wrong = mismatches(reader, schema)
            if wrong:
                raise ValueError(f"{part}_reader_schema does not give {part}_schema's columns: {'; '.join(wrong)}")

    def encoded(self, part: str, registry=None):
        """The records' `key` or `value` column as its format decodes it (exactly_once.formats.Encoded)."""
        from exactly_once.formats import Encoded

        return Encoded(part, getattr(self, f"{part}_schema"), getattr(self, f"{part}_reader_schema"), registry)


class Sink(_Frozen):
    name: Name = Field(description="Name of the sink within the pipeline (names its staging table).")
    table: QualifiedTable = Field(description="Final table, 'schema.table' or 'table'; created by the user.")
    mode: str = Field(
        description="How rows merge, a module of exactly_once.sinks: append: a row per record; upsert: by key, "
                    "the newest row wins (see `order_by`); aggregate: measures of each group are added; kafka: "
                    "published to `topic` through the outbox (docs/guide/kafka-output.md).",
        json_schema_extra=lambda schema: schema.update(enum=_names("exactly_once.sinks")))
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


class PipelineConfig(_Frozen):
    name: Name = Field(description="Unique name of the pipeline in the ledger.")
    source: Source = Field(description="Where the records come from: the `source` table below.")
    sinks: tuple[Sink, ...] = Field(min_length=1, description="Final tables committed together by a checkpoint: "
                                                            "the `sinks[]` table below.")
    transform: str | None = Field(
        None, pattern=r"^[A-Za-z_][\w.]*:[A-Za-z_]\w*$",
        description="'module:function' taking and returning a Spark DataFrame, applied before the sinks.")
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
                                        "stalls, its pre-commit kept (the `dead_letter_budget` table below).")
    lease: timedelta = Field(
        timedelta(hours=1), gt=timedelta(0),
        description="How long a begun checkpoint or a running attempt is held before the next run's "
                    "recovery may take it over.")

    @rule
    def _sink_names_unique(self) -> PipelineConfig:
        names = [s.name for s in self.sinks]
        duplicates = sorted({n for n in names if names.count(n) > 1})
        if duplicates:
            raise ValueError(f"sink names must be unique, repeated: {duplicates}")
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
