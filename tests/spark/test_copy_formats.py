"""The COPY writer's two formats store the same values: random values of every pair of Spark
type and column type that COPY's binary format carries (jvm/src/main/java/exactly_once/copy/
BinaryRow.java), written once in binary and once in text (TextRow.java, whose input functions do
the casts: tests/spark/test_row_checks.py holds it to what Spark's JDBC writer stores), read
back as PostgreSQL's text of each value. A frame is written in binary when every column is
carried: one more column, a double into text, makes the same rows text."""

from __future__ import annotations

import datetime as dt
import math
import random
from decimal import Decimal

import pytest
from psycopg2 import sql
from pyspark.sql import functions as F

from exactly_once.catalog import column_types
from exactly_once.db import jdbc_options
from exactly_once.spark.copy_writer import write_copy
from tests.spark.schemas import committed_schema

ROWS = 2000
# column, Spark type, column type
PAIRS = [
    ("dec_wide", "decimal(38,10)", "numeric"),
    ("dec_int", "decimal(18,0)", "numeric(20,0)"),
    ("dec_frac", "decimal(9,9)", "numeric(12,4)"),
    ("dec_compact", "decimal(15,3)", "numeric"),
    ("dec_whole", "decimal(12,0)", "numeric(14,2)"),
    ("dbl_num", "double", "numeric"),
    ("flt_num", "float", "numeric"),
    ("dbl", "double", "double precision"),
    ("flt", "float", "real"),
    ("long_num", "bigint", "numeric"),
    ("int_num", "int", "numeric(12,0)"),
    ("long", "bigint", "bigint"),
    ("int_long", "int", "bigint"),
    ("short_int", "smallint", "integer"),
    ("short_long", "smallint", "bigint"),
    ("byte_short", "tinyint", "smallint"),
    ("byte_int", "tinyint", "integer"),
    ("ts_tz", "timestamp", "timestamptz"),
    ("ts_wall", "timestamp", "timestamp"),
    ("ntz", "timestamp_ntz", "timestamp"),
    ("ntz_tz", "timestamp_ntz", "timestamptz"),
    ("day", "date", "date"),
    ("txt", "string", "text"),
    ("chars", "string", "varchar(40)"),
    ("padded", "string", "char(12)"),
    ("bytes", "binary", "bytea"),
    ("flag", "boolean", "boolean"),
]


def random_row(rng: random.Random, n: int) -> tuple:
    def decimal(digits: int, scale: int) -> Decimal:
        unscaled = rng.randrange(10 ** rng.randint(0, digits))
        return Decimal(rng.choice((-1, 1)) * unscaled).scaleb(-scale)

    def double() -> float:
        special = (math.nan, math.inf, -math.inf, -0.0, 0.0, 5e-324, 1.7976931348623157e308, 0.1, 1e15, 123456.5)
        if rng.random() < 0.1:
            return rng.choice(special)
        return rng.choice((-1, 1)) * rng.random() * 10 ** rng.randint(-320, 300)

    def instant() -> dt.datetime:
        return dt.datetime(1, 1, 1) + dt.timedelta(microseconds=rng.randrange(315_537_897_600_000_000))

    def text() -> str:
        return "".join(chr(rng.choice((rng.randint(32, 126), rng.randint(0xA0, 0xD7FF), rng.randint(0x10000, 0x1F6FF),
                                       9, 10, 13, 92)))
                       for _ in range(rng.randint(0, 12)))

    flt = double()
    extreme_long = rng.choice((-2 ** 63, 2 ** 63 - 1, 0)) if rng.random() < 0.05 else rng.randint(-2 ** 63, 2 ** 63 - 1)
    return (n, decimal(28, 10), decimal(18, 0), decimal(9, 9), decimal(15, 3), decimal(12, 0), double(),
            flt if not math.isfinite(flt) or abs(flt) < 3e38 else 1.5, double(),
            flt if not math.isfinite(flt) or abs(flt) < 3e38 else -2.5, extreme_long,
            rng.randint(-2 ** 31, 2 ** 31 - 1), rng.randint(-2 ** 63, 2 ** 63 - 1), rng.randint(-2 ** 31, 2 ** 31 - 1),
            rng.randint(-2 ** 15, 2 ** 15 - 1),
            rng.randint(-2 ** 15, 2 ** 15 - 1), rng.randint(-128, 127), rng.randint(-128, 127),
            instant(), instant(), instant(), instant(),
            dt.date(1, 1, 1) + dt.timedelta(days=rng.randrange(3_652_059)), text(), text()[:40], text()[:10] + "  ",
            bytes(rng.randrange(256) for _ in range(rng.randint(0, 16))), rng.random() < 0.5)


@pytest.fixture
def tables(ledger_db):
    """Two tables of PAIRS' columns and `forced` (text), in a committed schema (the writer's
    tasks connect on their own), dropped at the end."""
    columns = ", ".join(f"{name} {kind}" for name, _, kind in PAIRS)
    with committed_schema(ledger_db, "copy_formats", *(f"CREATE TABLE {{schema}}.{name} (n int NOT NULL, {columns}, "
                                                        "forced text)" for name in ("binary", "text"))) as created:
        yield created


def stored(cur, table: sql.Identifier) -> list[tuple]:
    cur.execute(sql.SQL("SELECT n, {} FROM {} ORDER BY n").format(
        sql.SQL(", ").join(sql.SQL("{}::text").format(sql.Identifier(name)) for name, *_ in PAIRS), table))
    return cur.fetchall()


def test_binary_and_text_copies_store_the_same_values(tables, spark, ledger_db):
    cur, schema = tables
    rng = random.Random(63)
    rows = [random_row(rng, n) for n in range(ROWS)]
    rows += [(ROWS + i, *(None for _ in PAIRS)) for i in range(3)]  # every column null
    frame = spark.createDataFrame(rows, "n int, " + ", ".join(f"{name} {kind}" for name, kind, _ in PAIRS))
    jdbc = jdbc_options(ledger_db)
    binary, text = sql.Identifier(schema, "binary"), sql.Identifier(schema, "text")
    targets = {c.name: c.base for c in column_types(cur, binary)}

    write_copy(frame, f"{schema}.binary", jdbc, targets)
    write_copy(frame.withColumn("forced", F.lit(0.5)), f"{schema}.text", jdbc, targets)
    assert len(stored(cur, binary)) == ROWS + 3
    assert stored(cur, binary) == stored(cur, text)

    # Which format each frame took: a NOT NULL column's refusal names it.
    refused = frame.where("n = 0").withColumn("n", F.lit(None).cast("int"))
    with pytest.raises(Exception, match=r"PostgreSQL refused binary COPY into \S+ \(SQLSTATE 23502\)"):
        write_copy(refused, f"{schema}.binary", jdbc, targets)
    with pytest.raises(Exception, match=r"PostgreSQL refused COPY into \S+ \(SQLSTATE 23502\)"):
        write_copy(refused.withColumn("forced", F.lit(0.5)), f"{schema}.text", jdbc, targets)
