"""A Spark task's fold of a keyed sink's rows in the one-pass write (exactly_once.spark.one_pass;
jvm/src/main/java/exactly_once/copy/Folds.java and Newest.java) stages what the sink's own Spark
aggregate stages (`staging_rows`): random rows of every type a measure or an order folds, with
nulls, NaN, non-ASCII text and repeated keys, written in one Spark task both ways and read back
as PostgreSQL's text of each value; on local Spark and over Spark Connect. And over several tasks,
each writing its fold whenever it holds a few keys, the commit's fold of the staged rows
(`folded`, sql/merge/) is what it makes of Spark's."""

from __future__ import annotations

import datetime as dt
import math
import random
from decimal import Decimal
from types import SimpleNamespace

import pytest
from psycopg2 import sql
from pyspark.sql import SparkSession
from pyspark.sql import functions as F

from exactly_once.catalog import column_types
from exactly_once.db import jdbc_options
from exactly_once.sinks._keyed import STAGED
from exactly_once.sinks.aggregate import MODE as AGGREGATE
from exactly_once.sinks.upsert import MODE as UPSERT
from exactly_once.spark.copy_writer import TableCopy, write_copy, write_tables
from tests.spark.schemas import committed_schema

ROWS = 3000
INPUT = ("k string, k2 int, i int, l bigint, d decimal(12,3), x double, s1 string, s2 string, t timestamp, day date, "
         "d2 decimal(12,3), x2 double, o bigint, kafka_topic string, kafka_partition int, kafka_offset bigint")
TOTALS = SimpleNamespace(name="totals", keys=("k", "k2"), order_by=None, measures={
    "n": "count", "i": "sum", "l": "sum", "d": "sum", "x": "sum", "t": "min", "day": "max", "d2": "min", "x2": "max"})
TOTALS_TABLE = ("k text, k2 int, n bigint, i bigint, l numeric, d numeric(22,3), x double precision, "
                "t timestamptz, day date, d2 numeric(12,3), x2 double precision")
LATEST = SimpleNamespace(name="latest", keys=("k", "k2"), order_by="o", measures={})
LATEST_COLUMNS = ["k", "k2", "o", "s1", "x", "kafka_topic", "kafka_partition", "kafka_offset"]
LATEST_TABLE = ("k text, k2 int, o bigint, s1 text, x double precision, kafka_topic text, kafka_partition int, "
                "kafka_offset bigint, kafka_tombstone boolean")


def random_row(rng: random.Random, n: int) -> tuple:
    def maybe(value):
        return None if rng.random() < 0.1 else value

    def text() -> str:
        return "".join(chr(rng.choice((rng.randint(32, 126), rng.randint(0xA0, 0xD7FF), rng.randint(0x10000, 0x1F6FF))))
                       for _ in range(rng.randint(0, 6)))

    def decimal() -> Decimal:
        return Decimal(rng.randint(-10 ** 9, 10 ** 9)).scaleb(-3)

    def double() -> float:
        return rng.choice((math.nan, -0.0, 0.0, math.inf)) if rng.random() < 0.05 else rng.uniform(-1e6, 1e6)

    return (maybe(rng.choice(("a", "b", "é", "😀", "A"))), rng.randint(0, 3), maybe(rng.randint(-2 ** 31, 2 ** 31 - 1)),
            maybe(rng.randint(-2 ** 50, 2 ** 50)), maybe(decimal()), maybe(double()), maybe(text()), maybe(text()),
            maybe(dt.datetime(1970, 1, 1) + dt.timedelta(seconds=rng.randrange(2 * 10 ** 9))),
            maybe(dt.date(1, 1, 1) + dt.timedelta(days=rng.randrange(3_652_059))), maybe(decimal()), maybe(double()),
            rng.randint(0, 50), rng.choice(("orders", "orders_b")), rng.randint(0, 2), n)


@pytest.fixture(params=["local", "connect"])
def session(request):
    """A local SparkSession, or a client of the stack's Spark Connect server (whose driver
    leaves each table's rows in the session's configuration, which the client reads)."""
    if request.param == "local":
        return request.getfixturevalue("spark")
    server = request.getfixturevalue("connect_server")
    created = SparkSession.builder.remote(f"sc://{server['host']}:{server['port']}").create()
    request.addfinalizer(created.stop)
    return created


@pytest.fixture
def tables(ledger_db):
    tagged = ", checkpoint_id bigint, attempt int"
    with committed_schema(ledger_db, "one_pass_folds", *(
            f"CREATE TABLE {{schema}}.{name} ({columns}{tagged})" for name, columns in (
                ("totals_spark", TOTALS_TABLE), ("totals_tasks", TOTALS_TABLE), ("totals_flushed", TOTALS_TABLE),
                ("latest_spark", LATEST_TABLE), ("latest_tasks", LATEST_TABLE), ("latest_flushed", LATEST_TABLE)))
    ) as created:
        yield created


def stored(cur, table: sql.Identifier) -> list[tuple]:
    cur.execute(sql.SQL("SELECT * FROM {} LIMIT 0").format(table))
    return as_text(cur, [c.name for c in cur.description], table)


def as_text(cur, columns: list[str], rows: sql.Composable, **values) -> list[tuple]:
    cur.execute(sql.SQL("SELECT {} FROM {} AS r").format(
        sql.SQL(", ").join(sql.SQL("{}::text").format(sql.Identifier(c)) for c in columns), rows), values)
    return sorted(cur.fetchall(), key=repr)


def folded(cur, mode, sink, table: sql.Identifier, columns: list[str]) -> list[tuple]:
    """The commit's fold of the table's staged rows, but a double's sum, whose last digits
    depend on the order of its terms."""
    every = [*columns, *mode.marks(sink)]
    fold = sql.SQL("({})").format(mode.folded(sink, table, STAGED, every))
    return as_text(cur, [c for c in every if (c, sink.measures.get(c)) != ("x", "sum")], fold,
                   checkpoint_id=7, attempt=1)


@pytest.mark.parametrize("sink,columns", [(TOTALS, list(TOTALS.keys) + list(TOTALS.measures)),
                                          (LATEST, LATEST_COLUMNS)], ids=["aggregate", "upsert"])
def test_a_tasks_fold_stages_what_sparks_fold_stages(tables, session, ledger_db, sink, columns):
    cur, schema = tables
    rng = random.Random(63)
    rows = session.createDataFrame([random_row(rng, n) for n in range(ROWS)], INPUT).coalesce(1)
    mode = AGGREGATE if sink.measures else UPSERT
    if mode is UPSERT:
        rows = rows.where(F.col("k").isNotNull())  # a null key fails its record (exactly_once.sinks.upsert._keys)
    else:  # text's least or greatest: Spark compares bytes, the commit's fold of several rows a collation
        assert AGGREGATE.rows_in_tasks(rows, SimpleNamespace(**{**vars(sink), "measures": {"s1": "min"}}),
                                       ["k", "k2", "s1"]) is None
    by_spark, in_tasks = (sql.Identifier(schema, f"{sink.name}_{how}") for how in ("spark", "tasks"))
    targets = {c.name: c.base for c in column_types(cur, by_spark)}
    jdbc = jdbc_options(ledger_db)
    staged = mode.staging_rows(rows, sink, columns)

    write_copy(staged.coalesce(1).withColumns({"checkpoint_id": F.lit(7), "attempt": F.lit(1)}),
               ".".join(by_spark.strings), jdbc, targets)
    fields, roles = mode.rows_in_tasks(rows, sink, columns)
    written = write_tables(rows.select(F.struct(*fields).alias("t0")),
                           [TableCopy(".".join(in_tasks.strings), targets, roles, staged)], jdbc, 7, 1)

    found = stored(cur, in_tasks)
    assert written == [len(found)] and len(found) > 10
    assert found == stored(cur, by_spark)

    flushed = sql.Identifier(schema, f"{sink.name}_flushed")
    [several] = write_tables(rows.repartition(3).select(F.struct(*fields).alias("t0")),
                             [TableCopy(".".join(flushed.strings), targets, roles, staged)], jdbc, 7, 1,
                             max_folded_keys=4)
    assert several > 2 * len(found)  # folds of a few keys each, in three tasks
    assert folded(cur, mode, sink, flushed, columns) == folded(cur, mode, sink, by_spark, columns)
