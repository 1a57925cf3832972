"""Value formats: how a record's value bytes become the schema's columns. One module
per format, found by name (a source's `value_format` is the module's name here), each
with a `FORMAT` object. A new format (Avro, CSV) is a new module; the job does not change.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Protocol

from exactly_once.registry import Registry

if TYPE_CHECKING:
    from pyspark.sql import DataFrame


class ValueFormat(Protocol):
    def parse(self, records: DataFrame, schema: Mapping[str, str]) -> DataFrame:
        """The records with two columns added: `parsed`, a struct of the schema's fields,
        and `reason`, null when the value fits and otherwise why not (it names the field)."""


_REGISTRY = Registry(__name__, "FORMAT", "value format")


def format_of(name: str) -> ValueFormat:
    return _REGISTRY.get(name)
