"""Sink modes: how a sink's rows are staged, promoted, and replaced when a checkpoint is
reprocessed. One module per mode, found by name (a sink's `mode` is the module's name
here), each with a `MODE` object and its statements in sql/merge/<mode>.sql. A new mode
is a new module and SQL file; nothing else changes.

Merges must be order-independent (checkpoints commit in any order) and a promoted
checkpoint must never count twice: each mode's final table is unique on what its
merge conflicts on, which registration checks against the catalog.

Every statement takes %(checkpoint_id)s and %(attempt)s (the staged rows to promote)
and %(slot)s (the checkpoint whose contribution they are: the checkpoint itself, or the
one a reprocessing replays).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

from psycopg2 import sql

from exactly_once.errors import ConfigError
from exactly_once.registry import Registry

if TYPE_CHECKING:
    from pyspark.sql import Column, DataFrame


class Sink(Protocol):
    """What a sink mode reads of a sink's configuration (`exactly_once.config.Sink`, which
    sits above the modes: it finds its mode here, so the modes never import it)."""

    @property
    def name(self) -> str: ...
    @property
    def table(self) -> str: ...
    @property
    def keys(self) -> tuple[str, ...]: ...
    @property
    def measures(self) -> Mapping[str, str]: ...
    @property
    def order_by(self) -> str | None: ...
    @property
    def topic(self) -> str | None: ...
    @property
    def strategy(self) -> Any: ...


@dataclass(frozen=True)
class SinkTables:
    """A sink's tables as its statements name them, and the final table's columns in table order;
    whether its pipeline's records delete (tombstones under `source.tombstones: delete`, a
    change feed's delete events), which only an upsert sink reads: a merge that keeps deleted
    keys deleted costs more; its pipeline's name, which a kafka sink's outbox rows carry."""

    final: sql.Identifier
    staging: sql.Identifier
    contributions: sql.Identifier
    columns: Sequence[str]
    deletes: bool = False
    pipeline: str | None = None


class SinkMode(Protocol):
    """One way of merging a checkpoint's rows into a final table, and of replacing them."""

    def check(self, sink: Sink) -> None:
        """Raises ValueError if the sink's keys and measures do not fit the mode."""

    def unique_columns(self, sink: Sink) -> frozenset[str]:
        """What the final table must be unique on for the merge to be order-independent."""

    def required_columns(self, sink: Sink) -> frozenset[str]:
        """Columns the final table must have."""

    def record_columns(self, sink: Sink, columns: list[str]) -> list[str]:
        """The final table's columns that take a value from each record's row (what the row
        checks look at): all of them, but for an aggregate its keys and folded measures."""

    def staging_rows(self, rows: DataFrame, sink: Sink, columns: list[str]) -> DataFrame:
        """The sink's staging rows from the transformed records (Spark); `columns` are the final table's."""

    def rows_in_tasks(self, rows: DataFrame, sink: Sink, columns: list[str]) -> tuple[list[Column], list[str]] | None:
        """`staging_rows` as the one-pass write makes them (exactly_once.spark.one_pass): the
        fields of each record's row, and their roles in the fold each Spark task makes of its
        rows per key (`jvm/.../copy/KeyedRows.java`; none: each row staged as it is); None when
        the staged rows must be folded across tasks."""

    def contribution_columns(self, sink: Sink, columns: Sequence[str]) -> list[str] | None:
        """What the mode keeps of each checkpoint's contribution besides the final table
        (its contributions table's columns), or None when the final rows are it."""

    def promote(self, sink: Sink, tables: SinkTables) -> sql.Composed:
        """Merges the staged rows into the final table (and keeps them as the slot's contribution)."""

    def replace(self, sink: Sink, tables: SinkTables) -> tuple[sql.Composed, sql.Composed]:
        """(forget, put) of a reprocessing's commit: `forget` takes the slot's contribution
        back (its row count is the rows taken back); `put` merges the staged rows as the
        slot's new contribution, so that each key or group is what every checkpoint's
        latest contribution makes it."""


_REGISTRY = Registry(__name__, "MODE", "sink mode")


def mode_of(name: str) -> SinkMode:
    return _REGISTRY.get(name)


def keeps_contributions(sink: Sink) -> bool:
    """Whether the sink's mode keeps each checkpoint's contribution (upsert, aggregate): what a
    reprocessing recomputes from and retention folds."""
    return sink.strategy.contribution_columns(sink, []) is not None


def require_columns(rows: DataFrame, sink: Sink, columns: Iterable[str]) -> None:
    """ConfigError (no retry fixes a transform) if the transformed rows lack a column the sink needs."""
    missing = sorted(set(columns) - set(rows.columns))
    if missing:
        raise ConfigError(f"sink {sink.name!r} ({sink.table}) needs columns {missing} that the transformed rows "
                         f"lack (they have {rows.columns})")


def names(columns: Sequence[str]) -> sql.Composed:
    return sql.SQL(", ").join(map(sql.Identifier, columns))


def each(template: str, columns: Sequence[str]) -> sql.Composed:
    """`template` with {c} for each column, comma-separated."""
    return sql.SQL(", ").join(sql.SQL(template).format(c=sql.Identifier(c)) for c in columns)
