"""Record formats: how a record's key or value bytes become the schema's columns. One module
per format, found by name (a source's `value_format` and `key_format` are the module's name
here), each with a `FORMAT` object. A new format (CSV, say) is a new module; the job does not change.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

from exactly_once.registry import Registry

if TYPE_CHECKING:
    from pyspark.sql import Column, DataFrame

    from exactly_once.problems import Problem
    from exactly_once.schema_registry import SchemaRegistry


@dataclass(frozen=True)
class Encoded:
    """One encoded column of the records (`key` or `value`) and what reads it."""

    column: str                          # the records' column: key or value
    schema: Mapping[str, str]            # the fields it becomes: column name -> Spark SQL type
    reader: object = None                # a registry format's reader schema (config.ReaderSchema)
    registry: SchemaRegistry | None = None
    # An id the registry does not know fails the attempt (retryable) rather than dead-letter
    # its records: the first attempt of a checkpoint, as a registry follower may not have a
    # new schema yet; its retry asks again, and dead-letters them if still unknown.
    retry_unknown_ids: bool = False
    wire_format: str = "confluent"       # how protobuf frames the payload (source.wire_format)


class RecordFormat(Protocol):
    needs_registry: bool  # whether it reads through source.schema_registry, into a `<part>_reader_schema`

    def decode(self, records: DataFrame, encoded: Encoded) -> tuple[Column, Callable[[Column], Column]]:
        """(fields, why_not) of each record: a struct of the schema's fields, and a function
        of the column that struct is projected into, giving null when the record's column
        holds the fields, otherwise why not (naming the field, or the column). The caller
        projects the fields first and asks `why_not` of that column, so that the decoder runs
        once per record (a field of a `from_json` in the same projection is a JSON parse of its
        own). Never called for a null column: the caller says why a null is what it is."""

    def problems(self, encoded: Encoded) -> list[Problem]:
        """What keeps the format from reading the column, known before any record is read
        (for the preflight): none for formats without a registry."""


_REGISTRY = Registry(__name__, "FORMAT", "record format")


def format_of(name: str) -> RecordFormat:
    return _REGISTRY.get(name)
