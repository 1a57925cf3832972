"""Staging-write throughput of the increment job: Spark executors writing N rows shaped like
the demo's `orders` staging rows (text, integers, a numeric, a timestamptz) into a table like a
staging table (its index and its trigger that freezes pre-committed rows) with the function the
job uses (the COPY writer, jvm/) in COPY's binary format, the same rows in its text format (one
more column, a double into text, all null, makes the write text: BinaryRow.java), and Spark's
JDBC writer (batches of 10,000 rewritten into multi-row INSERTs), which the job used before.
Interleaved repetitions, medians. Prints figures; asserts nothing.

    ./dev setup && PYTHONPATH=plugins .venv/bin/python -m tests.benchmarks.staging_write [--repetitions 3] 1000000 5000000

Starts the local stack if it is not running and stops what it started.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from contextlib import closing

import psycopg2
from pyspark.sql import SparkSession
from pyspark.sql import functions as F

from exactly_once_stack import lifecycle
from exactly_once_stack.settings import process_environment

TABLE = "exactly_once.bench_staging"
WARM_UP = 100_000
COLUMNS = ("order_id text NOT NULL, sku text NOT NULL, qty int NOT NULL, price numeric(12, 2) NOT NULL, "
           "ts timestamptz NOT NULL, kafka_topic text NOT NULL, kafka_partition int NOT NULL, "
           "kafka_offset bigint NOT NULL, as_text text, checkpoint_id bigint NOT NULL, attempt int NOT NULL, "
           "writer_task bigint")
TARGETS = {"order_id": "text", "sku": "text", "qty": "int4", "price": "numeric", "ts": "timestamptz",
           "kafka_topic": "text", "kafka_partition": "int4", "kafka_offset": "int8", "as_text": "text",
           "checkpoint_id": "int8", "attempt": "int4"}
WRITERS = ("COPY, binary", "COPY, text", "Spark JDBC writer")


def fresh_table(url: str) -> None:
    """A table like a staging table: its index, and its trigger (sql/ledger.sql, create_staging)."""
    with closing(psycopg2.connect(url)) as conn, conn, conn.cursor() as cur:
        cur.execute(f"DROP TABLE IF EXISTS {TABLE}; CREATE TABLE {TABLE} ({COLUMNS}); "
                    f"CREATE INDEX ON {TABLE} (checkpoint_id, attempt); "
                    f"CREATE TRIGGER frozen_inserts AFTER INSERT ON {TABLE} REFERENCING NEW TABLE AS changed "
                    "FOR EACH STATEMENT EXECUTE FUNCTION exactly_once.freeze_precommitted_staging()")


def main(sizes: list[int], repetitions: int) -> None:
    started = lifecycle.up()
    os.environ.update(process_environment())
    sys.path.insert(0, "plugins")
    from exactly_once.db import jdbc_options
    from exactly_once.ledger.migrate import migrate
    from exactly_once.spark.copy_writer import write_staging

    url = os.environ["PIPELINE_DB_URL"]
    spark = SparkSession.builder.master("local[2]").appName("staging_write benchmark").getOrCreate()
    try:
        with closing(psycopg2.connect(url)) as conn:
            migrate(conn)
        print(f"cores {os.cpu_count()}, Spark local[2], table {TABLE} ({COLUMNS}), medians of {repetitions}")
        print(f"{'rows':>10} " + " ".join(f"{w + ' s':>20} {'rows/s':>10}" for w in WRITERS)
              + f" {'text / binary':>13} {'JDBC / binary':>13}")
        jdbc = jdbc_options(url)

        def write(rows, n: int, writer: str) -> float:
            fresh_table(url)
            begin = time.perf_counter()
            if writer == "Spark JDBC writer":
                rows.withColumns({"checkpoint_id": F.lit(1), "attempt": F.lit(1)}).write.format("jdbc") \
                    .options(**jdbc).option("dbtable", TABLE).option("batchsize", 10_000).mode("append").save()
            else:
                as_text = rows.withColumn("as_text", F.lit(None).cast("double")) if writer == "COPY, text" else rows
                assert write_staging(as_text, TABLE, jdbc, TARGETS, checkpoint_id=1, attempt=1) == n
            return time.perf_counter() - begin

        for n in [WARM_UP, *sizes]:
            rows = spark.range(n, numPartitions=4).select(
                F.concat(F.lit("order-"), F.col("id").cast("string")).alias("order_id"),
                F.concat(F.lit("sku-"), (F.col("id") % 50).cast("string")).alias("sku"),
                (F.col("id") % 7 + 1).cast("int").alias("qty"),
                ((F.col("id") % 10_000) / 100).cast("decimal(12,2)").alias("price"),
                F.timestamp_micros(F.lit(1_764_000_000_000_000) + F.col("id") * 1_000_003).alias("ts"),
                F.lit("orders").alias("kafka_topic"), (F.col("id") % 3).cast("int").alias("kafka_partition"),
                F.col("id").alias("kafka_offset")).cache()
            rows.count()
            seconds = {writer: [] for writer in WRITERS}
            for repetition in range(1 if n == WARM_UP else repetitions):
                for writer in WRITERS[repetition % 3:] + WRITERS[:repetition % 3]:  # each goes first in turn
                    seconds[writer].append(write(rows, n, writer))
            rows.unpersist()
            if n == WARM_UP:
                continue  # JIT, class loading and connections: not what is measured
            median = {writer: statistics.median(times) for writer, times in seconds.items()}
            print(f"{n:>10} " + " ".join(f"{median[w]:>20.2f} {n / median[w]:>10,.0f}" for w in WRITERS)
                  + f" {median['COPY, text'] / median['COPY, binary']:>13.2f}"
                  + f" {median['Spark JDBC writer'] / median['COPY, binary']:>13.2f}", flush=True)
        with closing(psycopg2.connect(url)) as conn, conn, conn.cursor() as cur:
            cur.execute(f"DROP TABLE {TABLE}")
    finally:
        spark.stop()
        lifecycle.down(started)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("sizes", type=int, nargs="*", default=[1_000_000, 5_000_000])
    parser.add_argument("--repetitions", type=int, default=3)
    arguments = parser.parse_args()
    main(arguments.sizes, arguments.repetitions)
