"""The one oracle of the tests: what a pipeline's final tables and dead letters must hold
once each of a set of committed Kafka records was committed exactly once, what they do
hold, and the comparison of the two, to the row.

What is expected is computed from the pipeline's configuration, each sink by its mode,
keys and measures, and from the test's own model of the pipeline in Python, `row_of`:
the row a record becomes after parse and transform, None for a bad record (a dead
letter), or DROPPED for one the transform filters out. Nothing of the library's Spark
job or SQL merges is used, so the oracle checks them rather than repeating them. A new
sink mode is one more entry in `_MODES`.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Callable, Iterable, Sequence
from contextlib import closing
from dataclasses import dataclass, field
from typing import Any

import psycopg2
from psycopg2 import sql

from exactly_once.config import PipelineConfig, Sink
from exactly_once.kafka_columns import KAFKA_OFFSET, KAFKA_PARTITION, KAFKA_TOPIC
from exactly_once.ledger.tables import DEAD_LETTERS, final_table

Row = dict[str, Any]
Tables = dict[str, list[Row]]  # per sink name (and DEAD_LETTERS), every row, duplicates kept
COORDINATES = (KAFKA_TOPIC, KAFKA_PARTITION, KAFKA_OFFSET)
DEAD_LETTER_COLUMNS = ("topic", "partition", "offset", "key", "value")
_DEAD_LETTER_IDENTITY = DEAD_LETTER_COLUMNS[:3]


@dataclass(frozen=True)
class Record:
    """A committed Kafka record."""

    topic: str
    partition: int
    offset: int
    key: bytes | None
    value: bytes | None

    @classmethod
    def of(cls, message) -> Record:
        """From a confluent_kafka message."""
        return cls(message.topic(), message.partition(), message.offset(), message.key(), message.value())


RowOf = Callable[[Record], "Row | None"]


def in_ranges(record: Record, ranges: Iterable) -> bool:
    """Whether the record lies in one of the offset ranges (exactly_once.ledger.planning.OffsetRange)."""
    return any(r.topic == record.topic and r.partition == record.partition and r.start <= record.offset < r.end
               for r in ranges)


class _Missing:
    def __repr__(self) -> str:
        return "<no value>"


MISSING = _Missing()  # a column the expected row has no value for: never equal to a value read
DROPPED: Row = {}     # what `row_of` gives for a record the transform filters out: no row, no dead letter


# -- what the tables must hold ----------------------------------------------------------------


def _append(sink: Sink, good: list[tuple[Record, Row]]) -> list[Row]:
    """A row per record, with its coordinates."""
    return [{**row, **_coordinates(record)} for record, row in good]


def _upsert(sink: Sink, good: list[tuple[Record, Row]]) -> list[Row]:
    """Per key, the row with its coordinates that is highest in the sink's order."""
    newest: dict[tuple, Row] = {}
    for record, row in good:
        row = {**row, **_coordinates(record)}
        key = tuple(row[k] for k in sink.keys)
        if key not in newest or _upsert_order(sink, row) > _upsert_order(sink, newest[key]):
            newest[key] = row
    return list(newest.values())


def _upsert_order(sink: Sink, row: Row) -> tuple:
    """The documented rule, stated apart from the library's: by `order_by`, then topic
    (compared by code point, as bytes of UTF-8), partition and offset; without `order_by`,
    by offset, then partition."""
    if sink.order_by is None:
        return row[KAFKA_OFFSET], row[KAFKA_PARTITION]
    return row[sink.order_by], row[KAFKA_TOPIC], row[KAFKA_PARTITION], row[KAFKA_OFFSET]


_FOLDS: dict[str, Callable[[list], Any]] = {"count": len, "sum": sum, "min": min, "max": max}


def _aggregate(sink: Sink, good: list[tuple[Record, Row]]) -> list[Row]:
    """Per group of the keys, each measure folded over the group's rows: count counts
    them, sum / min / max fold the column of the measure's name."""
    groups: dict[tuple, list[Row]] = defaultdict(list)
    for _, row in good:
        groups[tuple(row[k] for k in sink.keys)].append(row)
    return [{**dict(zip(sink.keys, key)),
             **{m: _FOLDS[how]([r[m] for r in rows] if how != "count" else rows) for m, how in sink.measures.items()}}
            for key, rows in groups.items()]


@dataclass(frozen=True)
class _Model:
    """A sink mode in the oracle: the table's rows from the good records and their rows,
    and what the table has one row per."""

    rows: Callable[[Sink, list[tuple[Record, Row]]], list[Row]]
    one_row_per: Callable[[Sink], Sequence[str]]


_MODES = {
    "append": _Model(_append, lambda sink: COORDINATES),
    "upsert": _Model(_upsert, lambda sink: sink.keys),
    "aggregate": _Model(_aggregate, lambda sink: sink.keys),
    # What the sink's topic holds: a record per row, or per-key folds that add up as an aggregate's rows
    "kafka": _Model(lambda sink, good: (_aggregate if sink.measures else _append)(sink, good),
                    lambda sink: sink.keys if sink.measures else COORDINATES),
}


def _coordinates(record: Record) -> Row:
    return dict(zip(COORDINATES, (record.topic, record.partition, record.offset)))


@dataclass(frozen=True)
class Expected:
    """What the pipeline's tables must hold: per sink, its rows with every field `row_of`
    gave (a table holds the columns it has of them); under DEAD_LETTERS, the bad records'
    coordinates, key and value."""

    config: PipelineConfig
    tables: Tables

    def values(self, name: str, columns: Sequence[str]) -> list[tuple]:
        """The rows of a sink (or DEAD_LETTERS) as tuples of `columns`, e.g. a table's."""
        return [tuple(row.get(c, MISSING) for c in columns) for row in self.tables[name]]


def expected(config: PipelineConfig, records: Iterable[Record], row_of: RowOf) -> Expected:
    """The tables after each of `records` was committed once, bad records dead-lettered
    (the `dead_letter` policy)."""
    good, dead = [], []
    for record in records:
        row = row_of(record)
        if row is DROPPED:
            continue
        if row is None:
            dead.append(dict(zip(DEAD_LETTER_COLUMNS, (record.topic, record.partition, record.offset, record.key,
                                                       record.value))))
        else:
            good.append((record, row))
    return Expected(config, {**{sink.name: _model(sink).rows(sink, good) for sink in config.sinks}, DEAD_LETTERS: dead})


def _model(sink: Sink) -> _Model:
    if sink.mode not in _MODES:
        raise KeyError(f"the oracle has no model of sink mode {sink.mode!r} (sink {sink.name!r})")
    return _MODES[sink.mode]


# -- what they hold -----------------------------------------------------------------------------


def table_columns(cur, sink: Sink) -> list[str]:
    """The final table's columns in table order, from the catalog."""
    schema, table = sink.schema_and_table
    cur.execute("SELECT column_name FROM information_schema.columns WHERE table_schema = %s AND table_name = %s "
                "ORDER BY ordinal_position", (schema, table))
    return [c for c, in cur.fetchall()]


def final_columns(db_url: str, config: PipelineConfig) -> dict[str, list[str]]:
    with closing(psycopg2.connect(db_url)) as conn, conn.cursor() as cur:
        return {sink.name: table_columns(cur, sink) for sink in config.sinks}


def actual(db_url: str, config: PipelineConfig, kafka_servers: str | None = None) -> Tables:
    """Every row of each sink's final table, all its columns, duplicates kept, and the
    pipeline's dead letters; each list in the order of its columns' values, so two reads
    are equal when the tables hold the same rows. A kafka sink's rows are its topic's
    records (read_committed), as its table's types, its folds folded per key."""
    with closing(psycopg2.connect(db_url)) as conn, conn.cursor() as cur:
        out = {}
        for sink in config.sinks:
            if sink.mode == "kafka":
                out[sink.name] = _published(cur, sink, kafka_servers)
                continue
            out[sink.name] = _read(cur, table_columns(cur, sink), final_table(sink), sql.SQL(""))
        out[DEAD_LETTERS] = _read(cur, DEAD_LETTER_COLUMNS, sql.Identifier("exactly_once", "dead_letters"),
                                  sql.SQL("WHERE pipeline = {}").format(sql.Literal(config.name)))
    return out


def _published(cur, sink: Sink, kafka_servers: str | None) -> list[Row]:
    """The records of a kafka sink's topic as rows of its table (PostgreSQL reads each JSON
    value as the table's row type), as a consumer keeps them: per checkpoint, the records of
    its latest reprocessing (header exactly_once.replaces) instead of those it replaces; a
    sink with measures, folded per key as its consumers add them up."""
    from exactly_once.publishing.transactions import CHECKPOINT_HEADER, REPLACES_HEADER
    from tests.kafka_records import committed_records, wait_for_markers

    assert kafka_servers, f"sink {sink.name} publishes to Kafka: the oracle needs the brokers to read it"
    wait_for_markers(kafka_servers, sink.topic)  # the last publish's commit markers too
    columns = table_columns(cur, sink)
    latest: dict[int, tuple[int, list[Row]]] = {}  # per checkpoint replaced: (by checkpoint, its rows)
    for record in committed_records(kafka_servers, sink.topic):
        headers = {name: int(value) for name, value in record.headers}
        checkpoint = headers[CHECKPOINT_HEADER]
        replaced = headers.get(REPLACES_HEADER, checkpoint)
        by, held = latest.get(replaced, (checkpoint, []))
        if checkpoint < by:
            continue  # replaced (the partition read before held its replacement)
        cur.execute(sql.SQL("SELECT {columns} FROM jsonb_populate_record(NULL::{table}, %s)").format(
            columns=sql.SQL(", ").join(map(sql.Identifier, columns)), table=final_table(sink)),
            (record.value.decode(),))
        latest[replaced] = (checkpoint, (held if checkpoint == by else []) + [dict(zip(columns, cur.fetchone()))])
    rows = [row for _, held in latest.values() for row in held]
    if not sink.measures:
        return rows
    folds = {"count": sum, "sum": sum, "min": min, "max": max}
    groups: dict[tuple, list[Row]] = defaultdict(list)
    for row in rows:
        groups[tuple(row[k] for k in sink.keys)].append(row)
    return [{**dict(zip(sink.keys, key)), **{m: folds[how](r[m] for r in group) for m, how in sink.measures.items()}}
            for key, group in groups.items()]


def _read(cur, columns: Sequence[str], table: sql.Identifier, where: sql.Composable) -> list[Row]:
    cur.execute(sql.SQL("SELECT {columns} FROM {table} {where} ORDER BY {order}").format(
        columns=sql.SQL(", ").join(map(sql.Identifier, columns)), table=table, where=where,
        order=sql.SQL(", ").join(sql.Literal(i) for i in range(1, len(columns) + 1))))
    return [{c: bytes(v) if isinstance(v, memoryview) else v for c, v in zip(columns, row)} for row in cur.fetchall()]


# -- the comparison ------------------------------------------------------------------------------


@dataclass
class Comparison:
    """Per table: lost (expected, absent or short), duplicated (counted more than once)
    and wrong (present but different, or not expected at all). Rows, but records for an
    aggregate sink with a `count` measure, which tells lost records from duplicated ones."""

    lost: Counter = field(default_factory=Counter)
    duplicated: Counter = field(default_factory=Counter)
    wrong: Counter = field(default_factory=Counter)
    examples: list[str] = field(default_factory=list)

    @property
    def exact(self) -> bool:
        return not (+self.lost or +self.duplicated or +self.wrong)

    def __str__(self) -> str:
        return (f"lost {dict(self.lost)}, duplicated {dict(self.duplicated)}, wrong {dict(self.wrong)}: "
                f"{self.examples}")

    def _note(self, kind: Counter, table: str, n: int, example: str) -> None:
        kind[table] += n
        if len(self.examples) < 5:
            self.examples.append(f"{table}: {example}")


def compare(expected: Expected, actual: Tables) -> Comparison:
    result = Comparison()
    tables = [(s.name, _model(s).one_row_per(s), next((m for m, how in s.measures.items() if how == "count"), None))
              for s in expected.config.sinks]
    for name, identity, count in [*tables, (DEAD_LETTERS, _DEAD_LETTER_IDENTITY, None)]:
        wanted = {tuple(r[c] for c in identity): r for r in expected.tables[name]}
        found = defaultdict(list)
        for r in actual[name]:
            found[tuple(r[c] for c in identity)].append(r)
        for key in sorted(wanted.keys() | found.keys(), key=repr):
            want, got = wanted.get(key), found.get(key, [])
            if want is None:
                result._note(result.wrong, name, len(got), f"unexpected {got[0]}")
            elif not got:
                result._note(result.lost, name, want[count] if count else 1, f"missing {want}")
            elif count and got[0][count] != want[count]:  # an aggregate: more records counted is duplication
                kind = result.duplicated if got[0][count] > want[count] else result.lost
                result._note(kind, name, abs(got[0][count] - want[count]),
                             f"{key} counts {got[0][count]} of {want[count]}")
            elif (held := {c: want.get(c, MISSING) for c in got[0]}) != got[0]:  # the columns the table has
                result._note(result.wrong, name, 1, f"{got[0]} instead of {held}")
            if len(got) > 1:
                result._note(result.duplicated, name, len(got) - 1, f"{key} {len(got)} times")
    return result


def assert_exact(expected: Expected, actual: Tables) -> None:
    comparison = compare(expected, actual)
    assert comparison.exact, str(comparison)


def assert_same_rows(expected: dict[str, set], actual: dict[str, set]) -> None:
    """Each table's rows (as sets) equal the model's; what is missing or not expected shown sorted."""
    for table in expected:
        missing, extra = expected[table] - actual[table], actual[table] - expected[table]
        assert not (missing or extra), f"{table}: missing {sorted(map(repr, missing))}, not expected " \
                                       f"{sorted(map(repr, extra))}"
