"""The COPY writer's datetimes do not depend on the executor's time zone (issue 60): with the
Spark JVM in TZ=America/New_York, a `timestamp` (without time zone) column gets the wall time
in Spark's session time zone (`spark.sql.session.timeZone`) as Spark shows it, a `timestamptz`
column the exact instant (what Spark's JDBC writer stores too), a `date` column the date as
Spark shows it, and a timestamp into a text column PostgreSQL's text of that instant in the
session time zone; for session time zones equal to the JVM's, UTC and neither. In both of the
writer's formats: the columns COPY's binary format carries are written again on their own,
which makes that COPY binary (the whole frame's is text)."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from tests.spark.schemas import committed_schema

EXECUTOR_ZONE = "America/New_York"
SESSION_ZONES = ["America/New_York", "UTC", "Asia/Kolkata"]
# The final table's columns: Spark type of the value written into it, PostgreSQL type.
COLUMNS = [
    ("ts", "timestamp", "timestamp"),
    ("tstz", "timestamp", "timestamptz"),
    ("d", "date", "date"),
    ("ts_d", "timestamp", "date"),
    ("d_tz", "date", "timestamptz"),
    ("ntz", "timestamp_ntz", "timestamp"),
    ("ntz_tz", "timestamp_ntz", "timestamptz"),
    ("tx", "timestamp", "text"),
]
BINARY = ["ts", "tstz", "d", "ntz", "ntz_tz"]  # a datetime into its own kind
# (id, the instant in UTC, a date, a local date-time): near midnight UTC, the last microsecond
# of a year, after New York's spring gap, and before 1883 (local mean time, an offset in seconds).
ROWS = [
    (1, "2024-01-01 00:30:00", "2024-01-01", "2024-01-01 00:30:00"),
    (2, "2023-12-31 23:59:59.999999", "2023-12-31", "2023-12-31 23:59:59.999999"),
    (3, "2024-03-10 07:30:00.5", "2024-03-10", "2024-03-10 02:30:00"),  # 02:30 does not exist in New York
    (4, "1800-01-01 04:00:00", "1800-01-01", "1800-01-01 04:00:00"),
]
JDBC_EXACT = {1, 2, 3}  # the rows whose instant Spark's JDBC writer stores exactly

# Runs in a Python process of its own, whose Spark JVM (driver and executor, local mode) runs in
# EXECUTOR_ZONE: writes the rows with the COPY writer (and the timestamptz column with Spark's
# JDBC writer) once per session time zone, and prints what Spark shows of each value.
CHILD = r"""
import json, os, sys
from pyspark.sql import SparkSession, functions as F
from exactly_once.db import jdbc_options
from exactly_once.spark.copy_writer import write_copy

schema, zones, columns, binary, rows, zone = json.loads(sys.argv[1])
spark = (SparkSession.builder.master("local[2]").appName("copy_time_zones")
         .config("spark.driver.extraJavaOptions", "-Duser.timezone=" + zone)
         .config("spark.executor.extraJavaOptions", "-Duser.timezone=" + zone).getOrCreate())
jdbc = jdbc_options(os.environ["PIPELINE_DB_URL"])
shown = {"jvm_zone": spark._jvm.java.util.TimeZone.getDefault().getID(), "zones": {}}
for session_zone in zones:
    spark.conf.set("spark.sql.session.timeZone", session_zone)
    base = spark.createDataFrame(rows, "id int, instant string, day string, local string")
    instant = F.concat("instant", F.lit("Z")).cast("timestamp")  # in UTC, whatever the session's zone
    values = {"timestamp": instant, "date": F.to_date("day"), "timestamp_ntz": F.to_timestamp_ntz("local")}
    frame = base.select("id", *(values[kind].alias(name) for name, kind, _ in columns))
    table = f"{schema}.copied_{session_zone.replace('/', '_').lower()}"
    targets = {"id": "int4", **{name: target for name, _, target in columns}}
    write_copy(frame, table, jdbc, targets)
    write_copy(frame.select("id", *binary), table + "_binary", jdbc, targets)
    try:  # which format that write took: a refusal names it (the table's id is NOT NULL)
        write_copy(frame.select(F.lit(None).cast("int").alias("id"), *binary).limit(1), table + "_binary", jdbc,
                   targets)
    except Exception as refused:
        shown.setdefault("refusals", []).append(str(refused).split("PostgreSQL refused ")[1].split(" into ")[0])
    frame.select("id", "tstz").write.jdbc(jdbc["url"], table.replace("copied", "jdbc"), mode="append",
                                          properties={k: v for k, v in jdbc.items() if k != "url"})
    # What Spark shows, in the session time zone; instants as microseconds since the epoch.
    spark_shows = frame.select(
        "id",
        F.col("ts").cast("timestamp_ntz").cast("string").alias("ts"),
        F.unix_micros("tstz").alias("tstz"),
        F.col("d").cast("string").alias("d"),
        F.to_date("ts_d").cast("string").alias("ts_d"),
        F.unix_micros(F.col("d_tz").cast("timestamp")).alias("d_tz"),
        F.col("ntz").cast("string").alias("ntz"),
        F.unix_micros(F.col("ntz_tz").cast("timestamp")).alias("ntz_tz"),
        F.unix_micros("tx").alias("tx"))
    shown["zones"][session_zone] = {"table": table, "rows": [r.asDict() for r in spark_shows.orderBy("id").collect()]}
spark.stop()
print(json.dumps(shown))
"""

STORED = """SELECT id, ts::text, (extract(epoch FROM tstz) * 1e6)::bigint, d::text, ts_d::text,
                   (extract(epoch FROM d_tz) * 1e6)::bigint, ntz::text,
                   (extract(epoch FROM ntz_tz) * 1e6)::bigint, tx
            FROM {} ORDER BY id"""
# PostgreSQL's text of an instant (microseconds since the epoch) in the session's time zone.
INSTANT_TEXT = "SELECT ('epoch'::timestamptz + (%s || ' microseconds')::interval)::text"


@pytest.fixture
def schema(ledger_db):
    """A committed schema with COPY tables and a JDBC table per session time zone; dropped."""
    definitions = ", ".join(f"{column} {kind}" for column, _, kind in COLUMNS)
    tables = []
    for suffix in (zone.replace("/", "_").lower() for zone in SESSION_ZONES):
        tables += [f"CREATE TABLE {{schema}}.copied_{suffix} (id int, {definitions})",
                   f"CREATE TABLE {{schema}}.copied_{suffix}_binary (id int NOT NULL, {definitions})",
                   f"CREATE TABLE {{schema}}.jdbc_{suffix} (id int, tstz timestamptz)"]
    with committed_schema(ledger_db, "copy_tz", *tables) as created:
        yield created


def run_child(stack_env, schema: str) -> dict:
    argument = json.dumps([schema, SESSION_ZONES, COLUMNS, BINARY, ROWS, EXECUTOR_ZONE])
    done = subprocess.run([sys.executable, "-c", CHILD, argument], capture_output=True, text=True, timeout=600,
                          env={**stack_env, "TZ": EXECUTOR_ZONE})
    assert done.returncode == 0, done.stderr[-4000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_copy_writer_datetimes_follow_the_session_time_zone_not_the_executors(stack_env, schema):
    cur, name = schema
    shown = run_child(stack_env, name)
    assert shown["jvm_zone"] == EXECUTOR_ZONE  # the executor's JVM really is in New York
    assert shown["refusals"] == ["binary COPY"] * len(SESSION_ZONES)  # the datetimes alone went in binary

    mismatches = []
    for zone, written in shown["zones"].items():
        # PostgreSQL's text of a timestamptz, in the session time zone: what a text column gets.
        cur.execute("SET TIME ZONE %s", (zone,))
        cur.execute(STORED.format(written["table"]))
        stored = cur.fetchall()
        cur.execute(STORED.format(written["table"] + "_binary"))
        stored_binary = cur.fetchall()
        jdbc_table = written["table"].replace("copied", "jdbc")
        cur.execute(f"SELECT id, (extract(epoch FROM tstz) * 1e6)::bigint FROM {jdbc_table} ORDER BY id")
        by_jdbc = dict(cur.fetchall())
        assert [row[0] for row in stored] == [row[0] for row in stored_binary] == [row[0] for row in ROWS]
        for spark_row, (row_id, *values), (_, *binary_values) in zip(written["rows"], stored, stored_binary):
            got = dict(zip(("ts", "tstz", "d", "ts_d", "d_tz", "ntz", "ntz_tz", "tx"), values))
            tstz = got["tstz"]
            cur.execute(INSTANT_TEXT, (spark_row["tx"],))
            expected = {**{k: v for k, v in spark_row.items() if k != "id"}, "tx": cur.fetchone()[0]}
            for column in got:
                if got[column] != expected[column]:
                    mismatches.append(f"session {zone}, row {row_id}, {column}: COPY stored {got[column]!r}, "
                                      f"Spark shows {expected[column]!r}")
            for column, value in zip(got, binary_values):
                if column in BINARY and value != expected[column]:
                    mismatches.append(f"session {zone}, row {row_id}, {column}: binary COPY stored {value!r}, "
                                      f"Spark shows {expected[column]!r}")
            # Before 1883 (row 4) pgjdbc sends New York's local mean time with a whole-minute offset
            # (-05, not -04:56:02): the JDBC writer's instant is 3 min 58 s late, Spark's is not.
            if row_id in JDBC_EXACT and by_jdbc[row_id] != tstz:
                mismatches.append(f"session {zone}, row {row_id}, tstz: COPY stored {tstz}, JDBC {by_jdbc[row_id]}")
    assert not mismatches, "\n".join(mismatches)
