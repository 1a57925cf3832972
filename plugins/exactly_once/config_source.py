"""The source part of a pipeline's configuration (`exactly_once.config`): topics, start, key
and value formats, envelope, tombstones; and what every part of the configuration shares: frozen
models, column names, and `rule`, the checks a configuration version the ledger recorded
is not put through again.
"""

from __future__ import annotations

from datetime import datetime
from typing import Annotated, Any, Literal

from pydantic import (BaseModel, ConfigDict, Field, PositiveInt, StringConstraints, ValidationError, ValidationInfo,
                      ValidatorFunctionWrapHandler, field_validator, model_validator)
from pydantic_core import InitErrorDetails, PydanticCustomError

from exactly_once.debezium import COLUMNS as CHANGE_EVENT_COLUMNS
from exactly_once.debezium import avro_reader, avro_type, event_schema
from exactly_once.formats import format_of
from exactly_once.formats._avro_types import mismatches
from exactly_once.registry import Registry
from exactly_once.spark_types import check as check_spark_type

Column = Annotated[str, StringConstraints(pattern=r"^[A-Za-z_][A-Za-z0-9_]*$")]
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


def plugin_names(package: str) -> list[str]:
    """The plug-ins of a package (sink modes, value formats): the valid values the schema shows."""
    return Registry(package, "", "").names()


class Frozen(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class RegistrySchema(Frozen):
    subject: str = Field(min_length=1, description="A subject of the schema registry.")
    version: PositiveInt = Field(description="Its version: a number, as a version never changes once registered.")


ReaderSchema = str | RegistrySchema
NO_KEY = "none"


class Source(Frozen):
    topics: tuple[str, ...] = Field(min_length=1, description="Kafka topics read by the pipeline.")
    start: Literal["earliest", "latest"] | datetime = Field(
        "earliest",
        description="Where a new pipeline starts in each partition: the log start, the last stable "
                    "offset at its first plan, or the first offset at or after a timestamp. "
                    "Partitions added later always start at their earliest offset.")
    value_format: str = Field(
        "json", description="Encoding of record values, a module of exactly_once.formats: json (an object in "
                            "UTF-8), string (UTF-8 text, one string field), avro (the schema registry's wire "
                            "format, read into value_reader_schema), protobuf (its Protobuf wire format, read as "
                            "value_reader_schema's message).",
        json_schema_extra=lambda schema: schema.update(enum=plugin_names("exactly_once.formats")))
    schema_registry: str | None = Field(
        None, description="The Airflow connection (type http) of the schema registry whose Confluent-compatible "
                          "API the pipeline's record formats use: its extra holds the API's 'url' and TLS settings in "
                          "the Kafka connection's names, its login and password are basic auth. The first task and "
                          "`check` ask it for its subjects: a refused login or certificate stops the run.")
    wire_format: Literal["confluent", "apicurio", "apicurio_8_byte_ids"] = Field(
        "confluent", description="How protobuf values and keys are framed: confluent (magic byte 0, a 4-byte "
                                 "schema id, the message indexes); apicurio (Apicurio Registry 3's serializer: "
                                 "magic byte 0, a 4-byte content id, its Ref naming the message); or "
                                 "apicurio_8_byte_ids (8-byte global ids, Apicurio 2's, which its Confluent API "
                                 "takes in legacy id mode). docs/guide/formats.md.")
    value_schema: dict[Column, str] = Field(
        min_length=1, description="Fields of the value: column name -> Spark SQL type, exactly one type each: "
                                  "boolean, tinyint, smallint, int, bigint, float, double, decimal(p,s), date, "
                                  "timestamp, timestamp_ntz, string, binary, array<T>, map<K,V>, struct<name: T, "
                                  "...> (exactly_once.spark_types).")
    value_reader_schema: ReaderSchema | None = Field(
        None, description="avro: the schema every value is read into, whatever schema wrote it (fields added with "
                          "defaults, removed, widened): an Avro record schema as JSON text, or {subject, version} "
                          "of the schema registry. Its fields must give value_schema's columns their types. "
                          "protobuf: {subject, version} of the schema registry, whose first message every value "
                          "must be (its fields become the columns by name).")
    key_format: str = Field(
        NO_KEY, description="Encoding of record keys: none (not decoded; kept as bytes in the dead letters), or "
                            "a format like value_format's; the key's fields become columns beside the value's.",
        json_schema_extra=lambda schema: schema.update(enum=[NO_KEY, *plugin_names("exactly_once.formats")]))
    key_schema: dict[Column, str] = Field(
        {}, description="Fields of the key, like value_schema's (string: one string field). A key and a value "
                        "field may not share a name.")
    key_reader_schema: ReaderSchema | None = Field(None, description="avro keys: like value_reader_schema.")
    envelope: Literal["none", "debezium"] = Field(
        "none", description="What a value is: none (the record's fields), or debezium: a Debezium change event of "
                            "one row (value_format json, with or without its schema part, or avro through the "
                            "schema registry, without value_reader_schema), whose row image gives value_schema's "
                            "columns, with debezium_op and debezium_position (the source's log position) beside "
                            "them; upsert sinks apply it in source order, deletes included "
                            "(docs/guide/change-feeds.md).")
    tombstones: Literal["dead_letter", "skip", "delete"] = Field(
        "dead_letter", description="A record with a key and a null value: a dead letter; skipped (no row, no dead "
                                   "letter); or delete: it deletes its key's row from each upsert sink ordered by "
                                   "offset (keyed by key fields), ordered like the key's other records, and "
                                   "makes no row in other sinks. Unset under envelope debezium, which skips them.")
    on_truncate: Literal["dead_letter", "truncate"] = Field(
        "dead_letter", description="Under envelope debezium, a truncate event (op t): a dead letter; or truncate: "
                                   "it empties each upsert sink of the rows older than it in source order (a row "
                                   "of a later change stays, whatever partition or checkpoint brings either), and "
                                   "makes no row in append, aggregate and kafka sinks; one topic only "
                                   "(docs/guide/change-feeds.md).")

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
        if self.envelope == "debezium":
            self._change_events_fit()
        elif self.on_truncate != "dead_letter":
            raise ValueError("on_truncate applies to a change feed's truncate events: it needs envelope 'debezium'")
        if self.wire_format != "confluent" and "protobuf" not in (self.value_format, self.key_format):
            raise ValueError(f"wire_format {self.wire_format!r} frames protobuf values and keys: neither "
                             "value_format nor key_format is protobuf")
        if self.tombstones == "delete" and self.key_format == NO_KEY:
            raise ValueError("tombstones 'delete' needs the key decoded (key_format): a delete deletes a key's row")
        return self

    def _change_events_fit(self) -> None:
        if self.value_format not in ("json", "avro"):
            raise ValueError(f"envelope 'debezium' reads Debezium's JSON or Avro converter (value_format json or "
                             f"avro), not {self.value_format!r}")
        if self.value_format == "avro":
            unread = {c: t for c, t in self.value_schema.items() if avro_type(t) is None}
            if unread:
                raise ValueError(f"envelope 'debezium' with value_format 'avro' reads value_schema's columns as "
                                 f"boolean, int, bigint, float, double, string, binary or date, not {unread} "
                                 f"(a timestamp as bigint, a decimal as string or double: docs/guide/change-feeds.md)")
        if self.key_format != NO_KEY:
            raise ValueError("envelope 'debezium' takes a row's key from its images: leave key_format unset (the "
                             "record key is kept in dead letters as bytes)")
        if self.tombstones != "dead_letter":  # its default, which a configuration read back holds too
            raise ValueError("envelope 'debezium': a delete event deletes, and the tombstone after it changes "
                             "nothing (it is skipped); leave tombstones unset")
        if self.on_truncate == "truncate" and len(self.topics) > 1:
            raise ValueError(f"on_truncate 'truncate' empties the upsert sinks of one source table, whose topic is "
                             f"the pipeline's only one: it reads {len(self.topics)} (a pipeline per table)")
        taken = sorted(set(self.value_schema) & set(CHANGE_EVENT_COLUMNS))
        if taken:
            raise ValueError(f"envelope 'debezium' adds the columns {list(CHANGE_EVENT_COLUMNS)}: value_schema may "
                             f"not have {taken}")

    @property
    def deletes(self) -> bool:
        """Whether the records delete rows of upsert sinks: tombstones under `tombstones: delete`,
        a change feed's delete events."""
        return self.tombstones == "delete" or self.envelope == "debezium"

    @property
    def truncates(self) -> bool:
        """Whether a change feed's truncate events empty upsert sinks (`on_truncate: truncate`)."""
        return self.envelope == "debezium" and self.on_truncate == "truncate"

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
        if part == "value" and self.envelope == "debezium" and registry:
            if self.schema_registry is None or reader is not None:
                raise ValueError(f"envelope 'debezium' with value_format {name!r} needs schema_registry (the "
                                 f"connection) and no value_reader_schema: change events are read into one made "
                                 f"from value_schema")
            return
        if registry and (self.schema_registry is None or reader is None):
            raise ValueError(f"{part}_format {name!r} needs schema_registry (the connection) and "
                             f"{part}_reader_schema (what records are read into)")
        if not registry and reader is not None:
            raise ValueError(f"{part}_reader_schema is for registry formats (avro), not {name!r}")
        if isinstance(reader, str) and name != "avro":
            raise ValueError(f"{part}_reader_schema of {name!r} is {{subject, version}} of the schema registry, not "
                             "a schema's text")
        if isinstance(reader, str):
            wrong = mismatches(reader, schema)
            if wrong:
                raise ValueError(f"{part}_reader_schema does not give {part}_schema's columns: {'; '.join(wrong)}")

    def encoded(self, part: str, registry=None):
        """The records' `key` or `value` column as its format decodes it (exactly_once.formats.Encoded)."""
        from exactly_once.formats import Encoded

        if part == "value" and self.envelope == "debezium":  # a registry format's: the envelope's reader
            return Encoded(part, event_schema(self.value_schema), avro_reader(self.value_schema), registry)
        return Encoded(part, getattr(self, f"{part}_schema"), getattr(self, f"{part}_reader_schema"), registry,
                       wire_format=self.wire_format)
