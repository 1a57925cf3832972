"""Row checks against their oracle, PostgreSQL itself: every row, with one value on either
side of a column's limit, is refused by an INSERT into a real table if and only if the checks
give it a reason, and the reason names the sink and that column. The COPY staging writer
(jvm/) stores every row the INSERT stores, value for value, and refuses, with a record's
SQLSTATE, every row the INSERT refuses: what the checks judge is what it writes."""

from __future__ import annotations

import re
import uuid
from contextlib import closing

import psycopg2
import pytest
from psycopg2 import sql
from pyspark.sql import functions as F

from exactly_once.catalog import ColumnType, column_types
from exactly_once.db import jdbc_options
from exactly_once.spark.copy_writer import write_staging
from exactly_once.spark.row_checks import first_refusal, refusals
from exactly_once.sqlstates import record_failure
from tests.spark.schemas import committed_schema

SINK = "orders"
# Spark field, its type, the final table's column (name as the field), what Spark's JDBC writer
# sends for the type (a string as text, made here from UTF-8 bytes so that PostgreSQL, not
# psycopg2, meets a NUL).
COLUMNS = [
    ("txt", "string", "text NOT NULL", "convert_from(%s, 'UTF8')"),
    ("v", "string", "varchar(8)", "convert_from(%s, 'UTF8')"),
    ("ch", "string", "char(3)", "convert_from(%s, 'UTF8')"),
    ("code", "string", "{schema}.code", "convert_from(%s, 'UTF8')"),
    ("i2", "int", "smallint", "%s::int4"),
    ("i4", "double", "integer", "%s::float8"),
    ("i8", "decimal(20,1)", "bigint", "%s::numeric"),
    ("n", "decimal(10,3)", "numeric(6,2)", "%s::numeric"),
    ("nd", "double", "numeric(6,2)", "%s::float8"),
    ("nf", "float", "numeric(6,2)", "%s::float4"),
    ("nl", "bigint", "numeric(4,-2)", "%s::int8"),
    ("nu", "double", "numeric", "%s::float8"),
    ("r", "double", "real", "%s::float8"),
    ("tz", "timestamp", "timestamptz", "%s::timestamptz"),
    ("ts", "timestamp_ntz", "timestamp", "%s::timestamp"),
    ("d", "date", "date", "%s::date"),
    ("dx", "double", "text", "%s::float8"),
    ("fx", "float", "text", "%s::float4"),
    ("tx", "timestamp", "text", "%s::timestamptz"),
    ("i4w", "int", "integer", "(%s)::int4"),
    ("i8w", "bigint", "bigint", "(%s)::int8"),
    ("f4", "float", "real", "%s::float4"),
    ("f8", "double", "double precision", "%s::float8"),
    ("b", "boolean", "boolean", "%s::boolean"),
    ("by", "binary", "bytea", "%s::bytea"),
]
# The columns whose values the COPY writer can send as the column's own type (its binary format:
# jvm/src/main/java/exactly_once/copy/BinaryRow.java); the others need the text format's cast.
BINARY = [name for name, *_ in COLUMNS if name not in {"i2", "i4", "i8", "r", "dx", "fx", "tx"}]
DATETIMES = ("timestamp", "timestamp_ntz", "date")
# A row every column lets in, most values at their limit.
VALID = {"txt": "ok", "v": "abcdefgh", "ch": "abc", "code": "abcd", "i2": "32767", "i4": "2147483647.4",
         "i8": "9223372036854775807.4", "n": "9999.994", "nd": "9999.994", "nf": "9999.99", "nl": "999949",
         "nu": "1e300", "r": "3.4028235e38", "tz": "2020-01-01 00:00:00", "ts": "2020-01-01 00:00:00",
         "d": "2020-01-01", "dx": "0.1", "fx": "0.1", "tx": "2020-01-01 00:00:00", "i4w": "-2147483648",
         "i8w": "9223372036854775807", "f4": "1.17549435e-38", "f8": "-0.0", "b": "true", "by": "a\x00\\b"}
# (column, value as text, refused by PostgreSQL, the exact reason when asserted)
CASES = [
    ("txt", None, True, "null in a NOT NULL column"),
    ("txt", "a\x00b", True, "contains NUL (0x00)"),
    ("txt", "", False, None),
    ("v", "abcdefghi", True, "9 characters, longer than character varying(8)"),
    ("v", "abcdefgh   ", False, None),  # spaces past the limit are cut off
    ("v", "abcdefg ! ", True, None),
    ("v", "ééééééé😀", False, None),  # 8 characters, 17 bytes
    ("v", None, False, None),
    ("ch", "abcd", True, None),
    ("ch", "ab  ", False, None),
    ("code", None, True, "null in a NOT NULL column"),  # the domain's NOT NULL
    ("code", "abcde", True, None),
    ("i2", "32768", True, "32768 is out of range for smallint"),
    ("i2", "-32768", False, None),
    ("i2", "-32769", True, None),
    ("i4", "2147483647.5", True, None),  # rint: ties to even
    ("i4", "-2147483648.5", False, None),
    ("i4", "-2147483648.51", True, None),
    ("i4", "NaN", True, None),
    ("i4", "-Infinity", True, None),
    ("i8", "9223372036854775807.5", True, None),  # numeric: ties away from zero
    ("i8", "-9223372036854775808.4", False, None),
    ("i8", "-9223372036854775808.5", True, None),
    ("n", "9999.995", True, "9999.995 does not fit numeric(6,2)"),
    ("n", "-9999.995", True, None),
    ("n", "-9999.994", False, None),
    ("nd", "12345.678", True, "12345.678 does not fit numeric(6,2)"),
    ("nd", "9999.995", True, None),
    ("nd", "-9999.995", True, None),
    ("nd", "9999.994999999999", True, None),  # 15 significant digits: 9999.99500000000
    ("nd", "9999.99499999999", False, None),
    ("nd", "NaN", False, None),
    ("nd", "Infinity", True, None),
    ("nd", "-Infinity", True, None),
    ("nf", "9999.995", True, None),  # 9999.9951171875, 6 significant digits: 10000.0
    ("nf", "9999.994", False, None),
    ("nl", "999950", True, None),  # scale -2: to hundreds
    ("nl", "-999950", True, None),
    ("nl", "-999949", False, None),
    ("nu", "Infinity", False, None),
    ("nu", "NaN", False, None),
    ("nu", "-1e308", False, None),
    ("r", "-1e39", True, "-1.0E39 is out of range for real"),
    ("r", "3.4028235677973366e+38", True, None),  # halfway between FLT_MAX and 2^128
    ("r", "3.4028235677973362e+38", False, None),
    ("r", "7.006492321624085e-46", True, None),  # 2^-150, half the least denormal
    ("r", "7.006492321624087e-46", False, None),
    ("r", "1e-46", True, None),
    ("r", "-1e-45", False, None),
    ("r", "Infinity", False, None),
    ("r", "NaN", False, None),
    ("r", "-0.0", False, None),
    ("tz", "-5000-01-01 00:00:00", True,
     "-5000-01-01 00:00:00 is outside PostgreSQL's timestamp range (-4713-11-24 to 294276-12-31)"),
    ("tz", "-4713-11-24 00:00:00", False, None),
    ("tz", "-4713-11-23 23:59:59.999999", True, None),
    ("tz", "294247-01-01 00:00:00", False, None),
    ("ts", "-4713-11-24 00:00:00", False, None),
    ("ts", "-4713-11-23 23:59:59.999999", True, None),
    ("d", "-4713-11-24", False, None),
    ("d", "-4713-11-23", True, "-4713-11-23 is outside PostgreSQL's date range (-4713-11-24 to 5874897-12-31)"),
    ("d", "5874897-12-31", False, None),
    ("d", "5874898-01-01", True, None),
    # Into text, as a cast of the JDBC writer's value to text shows it: what the COPY writer must write.
    *(("dx", value, False, None) for value in ("1e-5", "0.0001", "100", "123456789012345", "1e15", "1.5e300", "-0.0",
                                               "NaN", "-Infinity", "2.5e-310")),
    *(("fx", value, False, None) for value in ("123456", "1e6", "1e-5", "3.4e38", "1.17549435e-38")),
    *(("tx", value, False, None) for value in ("2020-01-01 12:34:56.5", "2020-01-01 12:34:56.000001",
                                               "-1043-03-15 12:00:00", "12345-01-01 00:00:00")),
    ("i4w", None, False, None),
    ("i8w", "-9223372036854775808", False, None),
    *(("f4", value, False, None) for value in ("NaN", "-3.4028235e38", "1e-45")),
    *(("f8", value, False, None) for value in ("NaN", "1e308", "-Infinity", "4.9e-324")),
    ("b", "false", False, None),
    ("b", None, False, None),
    ("by", "", False, None),
]


def postgresql_datetime(spark_text: str) -> str:
    """Spark's signed years ('-4713-11-24', '+5874898-01-01') as PostgreSQL reads them."""
    year, rest = re.fullmatch(r"([+-]?\d+)(-.*)", spark_text).groups()
    return f"{int(year)}{rest}" if int(year) > 0 else f"{1 - int(year)}{rest} BC"


@pytest.fixture
def table(ledger_db):
    """A table with a column of each kind, in a schema of its own, and a cursor in the
    transaction that created them (rolled back at the end: nothing stays)."""
    schema = f"row_checks_{uuid.uuid4().hex[:8]}"
    definitions = ", ".join(f"{name} {kind}" for name, _, kind, _ in COLUMNS).format(schema=schema)
    with closing(psycopg2.connect(ledger_db)) as conn, conn.cursor() as cur:
        cur.execute(f"CREATE SCHEMA {schema}; CREATE DOMAIN {schema}.code AS varchar(4) NOT NULL; "
                    f"CREATE TABLE {schema}.final ({definitions}, extra int NOT NULL DEFAULT 0)")
        try:
            yield cur, sql.Identifier(schema, "final")
        finally:
            conn.rollback()


def test_column_types(table):
    cur, final = table
    types = {c.name: c for c in column_types(cur, final)}
    schema = final.strings[0]
    assert list(types) == [name for name, *_ in COLUMNS] + ["extra"]
    assert types["txt"] == ColumnType("txt", "text", "text", None, None, None, True)
    assert types["v"] == ColumnType("v", "character varying(8)", "varchar", 8, None, None, False)
    assert types["ch"] == ColumnType("ch", "character(3)", "bpchar", 3, None, None, False)
    assert types["code"] == ColumnType("code", f"{schema}.code", "varchar", 4, None, None, True)
    assert types["n"] == ColumnType("n", "numeric(6,2)", "numeric", None, 6, 2, False)
    assert types["nl"] == ColumnType("nl", "numeric(4,-2)", "numeric", None, 4, -2, False)
    assert types["nu"] == ColumnType("nu", "numeric", "numeric", None, None, None, False)
    assert types["tz"].base == "timestamptz" and types["r"].base == "float4"
    assert column_types(cur, sql.Identifier(schema, "missing")) == []


def typed_cases(spark):
    """The valid row (case 0) and each case's, typed as COLUMNS say."""
    rows = [(0, *VALID.values())] + [(case, *{**VALID, column: value}.values())
                                     for case, (column, value, _, _) in enumerate(CASES, 1)]
    texts = spark.createDataFrame(rows, "case int, " + ", ".join(f"{name} string" for name in VALID))
    return texts.select("case", *(F.col(name).cast(kind).alias(name) for name, kind, _, _ in COLUMNS))


def inserted(cur, table: sql.Identifier, row, columns=COLUMNS) -> str | None:
    """Inserts a row of typed_cases (of `columns`) as Spark's JDBC writer sends its values;
    PostgreSQL's error if it refuses it (the transaction goes on, without the row)."""
    insert = sql.SQL("INSERT INTO {} ({}) VALUES ({})").format(
        table, sql.SQL(", ").join(sql.Identifier(name) for name in ("case", *(name for name, *_ in columns))),
        sql.SQL(", ").join([sql.SQL("%s"), *(sql.SQL(placeholder) for *_, placeholder in columns)]))
    params = [row[0]] + [value.encode() if kind == "string" and value is not None
                         else postgresql_datetime(value) if kind in DATETIMES and value is not None else value
                         for (_, kind, _, _), value in zip(columns, row[1:])]
    cur.execute("SAVEPOINT row")
    try:
        cur.execute(insert, params)
    except psycopg2.Error as e:
        cur.execute("ROLLBACK TO SAVEPOINT row")
        return e.pgerror
    cur.execute("RELEASE SAVEPOINT row")
    return None


def test_reasons_match_postgresql(table, spark):
    cur, final = table
    frame = typed_cases(spark)
    reason = first_refusal(refusals(SINK, column_types(cur, final), frame.schema))
    # Datetimes as text: Python's cannot hold most of these years.
    sent = [F.col(name).cast("string") if kind in DATETIMES else F.col(name) for name, kind, _, _ in COLUMNS]
    results = frame.select("case", reason.alias("reason"), first_refusal([]).alias("none"), *sent).collect()

    # Timestamps are shown, and read, in Spark's session time zone.
    cur.execute("SET TIME ZONE %s", (spark.conf.get("spark.sql.session.timeZone"),))
    cur.execute(sql.SQL("ALTER TABLE {} ADD COLUMN \"case\" int").format(final))
    for case, reason, none, *values in sorted(results, key=lambda row: row.case):
        refused_by = inserted(cur, final, (case, *values))
        column, value, refused, exact = CASES[case - 1] if case else ("", None, False, None)
        where = f"case {case}: {column} = {value!r}: reason {reason!r}, PostgreSQL: {refused_by!r}"
        assert none is None
        assert (refused_by is not None) == refused, where
        assert (reason is not None) == refused, where
        if reason is not None:
            assert reason.startswith(f"sink {SINK}: column {column}: "), where
        if exact is not None:
            assert reason == f"sink {SINK}: column {column}: {exact}", where


@pytest.fixture
def tables(ledger_db):
    """Two tables with the columns of COLUMNS: one the COPY writer writes (as a staging table,
    tagged), one the INSERTs of the JDBC writer's values; in a committed schema (the writer's
    tasks connect on their own), dropped at the end."""
    definitions = ", ".join(f"{name} {kind}" for name, _, kind, _ in COLUMNS)
    with committed_schema(ledger_db, "copy", "CREATE DOMAIN {schema}.code AS varchar(4) NOT NULL",
                          *(f'CREATE TABLE {{schema}}.{name} ("case" int, {definitions}, checkpoint_id bigint, '
                            "attempt int)" for name in ("copied", "inserted"))) as created:
        yield created


def stored_text(cur, table: sql.Identifier) -> list[tuple]:
    """Each row's values as PostgreSQL shows them, by case."""
    cur.execute(sql.SQL('SELECT "case", {} FROM {} ORDER BY "case"').format(
        sql.SQL(", ").join(sql.SQL("{}::text").format(sql.Identifier(name)) for name, *_ in COLUMNS), table))
    return cur.fetchall()


@pytest.mark.parametrize("names, copy", [([name for name, *_ in COLUMNS], "COPY"), (BINARY, "binary COPY")],
                         ids=["text", "binary"])
def test_the_copy_writer_stores_what_the_insert_stores_and_refuses_what_it_refuses(tables, spark, ledger_db, names,
                                                                                 copy):
    cur, schema = tables
    copied, by_insert = sql.Identifier(schema, "copied"), sql.Identifier(schema, "inserted")
    targets = {c.name: c.base for c in column_types(cur, copied)}
    columns = [column for column in COLUMNS if column[0] in names]
    frame = typed_cases(spark).select("case", *names)
    sent = [F.col(name).cast("string") if kind in DATETIMES else F.col(name) for name, kind, _, _ in columns]
    cur.execute("SET TIME ZONE %s", (spark.conf.get("spark.sql.session.timeZone"),))
    refused = {row[0]: inserted(cur, by_insert, row, columns) for row in frame.select("case", *sent).collect()}
    cur.connection.commit()
    assert {case for case, why in refused.items() if why} == \
        {case for case, (column, _, refused_by_postgresql, _) in enumerate(CASES, 1)
         if refused_by_postgresql and column in names}

    stored = write_staging(frame.where(~F.col("case").isin([c for c, why in refused.items() if why])),
                           f"{schema}.copied", jdbc_options(ledger_db), targets, checkpoint_id=1, attempt=1)
    assert stored == sum(1 for why in refused.values() if why is None)
    assert stored_text(cur, copied) == stored_text(cur, by_insert)

    for case in sorted(case for case, why in refused.items() if why):
        with pytest.raises(Exception, match=f"PostgreSQL refused {copy} into") as refusal:
            write_staging(frame.where(F.col("case") == case).coalesce(1), f"{schema}.copied", jdbc_options(ledger_db),
                          targets, checkpoint_id=1, attempt=2)
        state, message = record_failure(refusal.value) or (None, str(refusal.value)[:300])
        assert state is not None and state.startswith(("22", "23")), f"case {case} {CASES[case - 1]}: {message}"
    cur.execute(sql.SQL("SELECT count(*) FROM {} WHERE attempt = 2").format(copied))
    assert cur.fetchone() == (0,)
