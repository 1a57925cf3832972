"""upsert: by key, the newest record's row wins, whatever order checkpoints commit in.

Newest is highest in the sink's `order`, one order wherever a key's newest row is picked:
Spark's per-key fold of an attempt's rows (`staging_rows`), PostgreSQL's fold of a
checkpoint's staged rows or of every checkpoint's contributions (`folded`, also a
reprocessing's recompute) and the merge into the final table (`merge`):

- with `order_by`: (order_by, kafka_topic, kafka_partition, kafka_offset), the record's
  coordinates breaking ties;
- without: (kafka_offset, kafka_partition). Offsets compare only within a partition, so this
  holds while each key lives in one partition of one topic: several topics are refused when
  the configuration loads (exactly_once.config), and a planner refuses partitions added to a
  topic already read (`ambiguous_partitions`).

A sink ordered by offset also takes tombstones (a key's record without a value, staged as a
row with `kafka_tombstone` true, its key and coordinates set and nothing else): a tombstone
is the key's record like any other, and when it is the newest of its key, the key has no
row. So the final table holds, per key, the newest record of every committed checkpoint if
that is no tombstone, and nothing if it is. Every checkpoint's tombstones are kept among its
contributions, which is how a merge knows that an older record must not bring a deleted key
back (sql/merge/upsert.sql). An order_by sink takes deletes only from a change feed
(`source.envelope: debezium`), whose delete events carry their order_by value, the source's
position (exactly_once.debezium); a tombstone has none, so otherwise its staged rows all say false.
Every upsert sink's folds carry the mark, whatever its pipeline's configuration says now: a
fold (retention) or a recompute (reprocessing) never turns a tombstone kept under an earlier
configuration into a row.

A change feed's truncate (`source.on_truncate: truncate`) is staged as a tombstone of no key
(every key column null, its position set): it deletes every row older than it, and a row older
than the newest truncate kept among the contributions never goes in, whatever checkpoint brings
it; a reprocessing whose contribution held one recomputes every key.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

from psycopg2 import sql

from exactly_once.debezium import OP, TRUNCATE
from exactly_once.errors import ConfigError
from exactly_once.kafka_columns import KAFKA_OFFSET, KAFKA_PARTITION, KAFKA_TIMESTAMP, KAFKA_TOMBSTONE, KAFKA_TOPIC
from exactly_once.sinks import Sink, each, names, require_columns
from exactly_once.sinks._keyed import Keyed
from exactly_once.sqlfiles import named


class Pipeline(Protocol):
    """What `ambiguous_partitions` reads of a pipeline's configuration."""

    @property
    def name(self) -> str: ...
    @property
    def sinks(self) -> Sequence[Sink]: ...

COORDINATES = (KAFKA_TOPIC, KAFKA_PARTITION, KAFKA_OFFSET)
# Spark compares strings by their bytes; so does PostgreSQL with the "C" collation, whatever
# collation the topic column has (a locale's would put 'orders_a' before 'orders-b').
BYTEWISE = sql.SQL(' COLLATE "C"')


class Upsert(Keyed):
    def check(self, sink) -> None:
        if not sink.keys:
            raise ValueError("upsert sinks need keys")
        if sink.measures:
            raise ValueError(f"upsert sinks take no measures, got {dict(sink.measures)}")
        if sink.order_by in sink.keys:
            raise ValueError(f"order_by {sink.order_by!r} is a key column: every row of a key has its value")
        if sink.order_by in COORDINATES:
            raise ValueError(f"order_by {sink.order_by!r} is a coordinate of the record: the coordinates break "
                             "ties after order_by, and without order_by the offset orders")

    def required_columns(self, sink) -> frozenset[str]:
        return frozenset((*sink.keys, *order(sink)))

    def record_columns(self, sink, columns) -> list[str]:
        return columns

    def contribution_columns(self, sink, columns) -> list[str]:
        return list(columns)

    def staging_rows(self, rows, sink, columns):
        from pyspark.sql import functions as F

        # An aggregate, not a window: each task keeps its newest row per key before the shuffle.
        newest = F.max_by(F.struct(*self._staged(rows, sink, columns)), F.struct(*_spark_order(rows, sink)))
        return rows.groupBy(*_keys(rows, sink)).agg(newest.alias("_newest")).select("_newest.*")

    def rows_in_tasks(self, rows, sink, columns):
        from pyspark.sql import functions as F

        named = [*columns, KAFKA_TOMBSTONE]
        checked = dict(zip(sink.keys, _keys(rows, sink)))  # a null key fails its row, as staging_rows' grouping does
        fields = [checked.get(name, field) for name, field in zip(named, self._staged(rows, sink, columns))]
        return ([*fields, F.struct(*_spark_order(rows, sink))],
                ["key" if name in sink.keys else "value" for name in named] + ["order"])

    @staticmethod
    def _staged(rows, sink, columns) -> list:
        """A row's staged columns: the final table's and its mark. Tombstones are rows of their
        own (the frame's kafka_tombstone column; none without it): the newest of a key's rows
        and tombstones is staged, marked."""
        from pyspark.sql import functions as F

        require_columns(rows, sink, [*columns, *order(sink)])
        tombstone = F.coalesce(F.col(KAFKA_TOMBSTONE), F.lit(False)) if KAFKA_TOMBSTONE in rows.columns \
            else F.lit(False)
        return [*(F.col(c) for c in columns), tombstone.alias(KAFKA_TOMBSTONE)]

    def marks(self, sink) -> list[str]:
        return [KAFKA_TOMBSTONE]

    def folded(self, sink, source, where, columns) -> sql.Composed:
        return sql.SQL(named("merge/upsert.sql")["newest"]).format(
            source=source, where=where, keys=names(sink.keys), columns=names(columns),
            newest_first=sql.SQL(", ").join(c + sql.SQL(" DESC") for c in _compared(sink)))

    def merge(self, sink, tables, folded) -> sql.Composed:
        """`folded` carries kafka_tombstone (`marks`); only a pipeline whose records delete pays
        for the merge that keeps deleted keys deleted."""
        statement = "merge_with_tombstones" if tables.deletes else "merge"
        return sql.SQL(named("merge/upsert.sql")[statement]).format(
            final=tables.final, contributions=tables.contributions, newest=folded, columns=names(tables.columns),
            keys=names(sink.keys),
            take_new=each("{c} = EXCLUDED.{c}", [c for c in tables.columns if c not in sink.keys]),
            held=sql.SQL(", ").join(_compared(sink, "f.")), new=sql.SQL(", ").join(_compared(sink, "EXCLUDED.")),
            staged=sql.SQL(", ").join(_compared(sink, "n.")), kept=sql.SQL(", ").join(_compared(sink, "c.")),
            same_keys=_same_keys(sink, "f", "n"), tombstone_of_key=_same_keys(sink, "c", "n"),
            first_key=sql.Identifier(sink.keys[0]), truncated=sql.SQL(", ").join(_compared(sink, "t.")),
            newest_first=sql.SQL(", ").join(c + sql.SQL(" DESC") for c in _compared(sink)),
            lock=sql.Literal("exactly_once:tombstones:" + ".".join(tables.final.strings)))

    def live(self, sink, folded, columns) -> sql.Composed:
        return sql.SQL(named("merge/upsert.sql")["live"]).format(newest=folded, columns=names(columns))

    def tombstoned(self, sink, tables) -> sql.Composable:
        return sql.SQL(named("merge/upsert.sql")["tombstoned"] + ";\n").format(
            final=tables.final, contributions=tables.contributions, keys=names(sink.keys),
            same_keys=_same_keys(sink, "c", "f"), first_key=sql.Identifier(sink.keys[0]),
            truncated=sql.SQL(", ").join(_compared(sink, "t.")), kept=sql.SQL(", ").join(_compared(sink, "c.")),
            newest_first=sql.SQL(", ").join(c + sql.SQL(" DESC") for c in _compared(sink, "c.")))

    def widened(self, sink, tables) -> sql.Composable:
        return sql.SQL(named("merge/upsert.sql")["widened"] + ";\n").format(
            contributions=tables.contributions, keys=names(sink.keys), first_key=sql.Identifier(sink.keys[0]))


MODE = Upsert()


def ledger_marks(sink) -> tuple[str, ...]:
    """The columns an upsert sink's staging and contributions tables have besides its final
    table's (registration adds them): kafka_tombstone, false unless a tombstone's row."""
    return (KAFKA_TOMBSTONE,) if sink.strategy is MODE else ()


def tombstone_nulls(sink, columns, source) -> set[str]:
    """Of the final table's `columns`, those a tombstone's staged row leaves null (all but its
    key, order_by and coordinates; a truncate's, its key too) where the sink takes tombstones
    (ordered by offset, or in a pipeline whose records delete, `source.deletes`, or truncate,
    `source.truncates`): the sink's staging table takes nulls there, whatever the final table's
    NOT NULL (a tombstone never reaches it; the row checks refuse a row's null before staging)."""
    if sink.strategy is not MODE or not (by_offset(sink) or source.deletes):
        return set()
    kept = {*order(sink), *COORDINATES, KAFKA_TIMESTAMP} if source.truncates else \
        {*sink.keys, *order(sink), *COORDINATES, KAFKA_TIMESTAMP}
    return set(columns) - kept


def _same_keys(sink, left: str, right: str) -> sql.Composed:
    """The key columns of the rows `left` and `right` (table aliases) equal."""
    return sql.SQL(" AND ").join(sql.SQL(f"{left}.{{k}} = {right}.{{k}}").format(k=sql.Identifier(k))
                                 for k in sink.keys)


def order(sink) -> tuple[str, ...]:
    """The columns of an upsert sink's order, the most significant first."""
    if sink.order_by is None:
        return KAFKA_OFFSET, KAFKA_PARTITION
    return sink.order_by, *COORDINATES


def _compared(sink, alias: str = "") -> list[sql.Composed]:
    """The order's columns as PostgreSQL compares them, of the table `alias` names (with its
    dot): the configured column quoted; the library's need no quoting."""
    compared = []
    for column in order(sink):
        name = sql.SQL(alias) + (sql.Identifier(column) if column == sink.order_by else sql.SQL(column))
        compared.append(name + BYTEWISE if column == KAFKA_TOPIC else name)
    return compared


def _keys(rows, sink) -> list:
    """The key columns, a row's null key failing its write (raise_error: record isolation sets its
    record aside with this reason), but a change feed's truncate's, whose null key is what marks
    it (the merge's SQL takes a tombstone of a null key for a truncate). A NOT NULL column's row
    check refuses it before; a key column that takes nulls does not name a row."""
    from pyspark.sql import functions as F

    truncate = F.coalesce(F.col(OP) == TRUNCATE, F.lit(False)) if OP in rows.columns else F.lit(False)
    null = F.coalesce(*(F.when(F.col(k).isNull(), F.lit(k)) for k in sink.keys))
    refused = F.raise_error(F.concat(F.lit(f"sink {sink.name}: key column "), null,
                                     F.lit(" is null: an upsert sink's key names its row")))
    first, *rest = sink.keys
    return [F.when(null.isNotNull() & ~truncate, refused).otherwise(F.col(first)).alias(first),
            *(F.col(k) for k in rest)]


def _spark_order(rows, sink) -> list:
    """The order's columns as Spark compares them. An order_by value must compare alike in
    PostgreSQL, and be there."""
    from pyspark.sql import functions as F
    from pyspark.sql.types import DateType, NumericType, TimestampNTZType, TimestampType

    if sink.order_by is None:
        return [F.col(c) for c in order(sink)]
    kind = rows.schema[sink.order_by].dataType
    if not isinstance(kind, (NumericType, DateType, TimestampType, TimestampNTZType)):
        raise ConfigError(f"sink {sink.name!r} ({sink.table}): order_by column {sink.order_by} is "
                          f"{kind.simpleString()}: PostgreSQL may order its values otherwise than Spark (text by "
                          "a collation); order by a number, a date or a timestamp (the transform can make one)")
    # Of a null, PostgreSQL's fold would make the newest row (DESC puts nulls first), Spark's the
    # oldest and the merge's comparison neither: the record fails its write (raise_error) and
    # record isolation sets it aside with this reason. A NOT NULL column's row check refuses it before.
    value = F.col(sink.order_by)
    refused = F.raise_error(F.lit(f"order_by column {sink.order_by} is null: a newest row cannot be told"))
    return [F.when(value.isNull(), refused).otherwise(value), *(F.col(c) for c in COORDINATES)]


def by_offset(sink: Sink) -> bool:
    """Whether the sink is an upsert sink ordered by offset, which holds only while each key
    lives in one partition of one topic."""
    return sink.strategy is MODE and sink.order_by is None


def ambiguous_partitions(config: Pipeline, planned_before: set[tuple[str, int]],
                         seen: set[tuple[str, int]]) -> str | None:
    """Why the (topic, partition)s Kafka shows (`seen`) cannot be planned beside those planned
    before, or None: a partition added since holds keys' newer records at offsets below their
    older ones', so an upsert sink ordered by offset would keep stale rows. A first plan adds
    nothing: no key lived anywhere before."""
    added = sorted(seen - planned_before) if planned_before else []
    unordered = [sink.name for sink in config.sinks if by_offset(sink)]
    if not (added and unordered):
        return None
    return (f"pipeline {config.name!r}: partitions {', '.join(f'{t}[{p}]' for t, p in added)} were added; a key's "
            "newer records there may have lower offsets than its older ones, so "
            + ", ".join(f"upsert sink {name!r}" for name in unordered)
            + " (ordered by offset) would keep stale rows: set its order_by (an event time, say) before they are "
              "read")
