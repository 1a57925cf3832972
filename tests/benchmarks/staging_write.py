"""Staging-write throughput of the increment job: Spark executors writing N narrow
rows (the shape of an append sink's staging rows) into PostgreSQL with the function the
job uses (the COPY writer, jvm/), beside Spark's JDBC writer (batches of 10,000 rewritten
into multi-row INSERTs), which the job used before. Prints figures; asserts nothing.

    ./dev setup && .venv/bin/python -m tests.benchmarks.staging_write 1000000 5000000

Starts the local stack if it is not running and stops what it started.
"""

from __future__ import annotations

import os
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
COLUMNS = ("id text, k text, n bigint, kafka_topic text, kafka_partition int, kafka_offset bigint, "
           "checkpoint_id bigint NOT NULL, attempt int NOT NULL")


def fresh_table(url: str) -> None:
    with closing(psycopg2.connect(url)) as conn, conn, conn.cursor() as cur:
        cur.execute(f"DROP TABLE IF EXISTS {TABLE}; CREATE TABLE {TABLE} ({COLUMNS})")


def main(sizes: list[int]) -> None:
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
        print(f"cores {os.cpu_count()}, Spark local[2], table {TABLE} ({COLUMNS})")
        print(f"{'rows':>10} {'write_staging (COPY) s':>22} {'rows/s':>10} {'Spark JDBC writer s':>20} "
              f"{'rows/s':>10} {'JDBC / COPY':>11}")
        targets = {"id": "text", "k": "text", "n": "int8", "kafka_topic": "text", "kafka_partition": "int4",
                   "kafka_offset": "int8", "checkpoint_id": "int8", "attempt": "int4"}
        for n in [WARM_UP, *sizes]:
            rows = spark.range(n, numPartitions=4).select(
                F.concat(F.lit("o"), F.col("id").cast("string")).alias("id"),
                F.concat(F.lit("sku-"), (F.col("id") % 1000).cast("string")).alias("k"),
                (F.col("id") % 97).alias("n"), F.lit("orders").alias("kafka_topic"),
                (F.col("id") % 3).cast("int").alias("kafka_partition"), F.col("id").alias("kafka_offset"))
            fresh_table(url)
            begin = time.perf_counter()
            written = write_staging(rows, TABLE, jdbc_options(url), targets, checkpoint_id=1, attempt=1)
            staging = time.perf_counter() - begin
            fresh_table(url)
            begin = time.perf_counter()
            rows.withColumns({"checkpoint_id": F.lit(1), "attempt": F.lit(1)}).write.format("jdbc") \
                .options(**jdbc_options(url)).option("dbtable", TABLE).option("batchsize", 10_000) \
                .mode("append").save()
            jdbc = time.perf_counter() - begin
            if n == WARM_UP:
                continue  # JIT, class loading and connections: not what is measured
            print(f"{written:>10} {staging:>22.1f} {n / staging:>10,.0f} {jdbc:>20.1f} {n / jdbc:>10,.0f} "
                  f"{jdbc / staging:>11.2f}")
        with closing(psycopg2.connect(url)) as conn, conn, conn.cursor() as cur:
            cur.execute(f"DROP TABLE {TABLE}")
    finally:
        spark.stop()
        lifecycle.down(started)


if __name__ == "__main__":
    main([int(a) for a in sys.argv[1:]] or [1_000_000, 5_000_000])
