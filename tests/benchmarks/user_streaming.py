"""The demo's three tables as a user of Spark would fill them without this library: a
Structured Streaming job, the benchmark's `streaming` peer (tests/benchmarks/throughput.py).

    spark-submit tests/benchmarks/user_streaming.py RANGES --schema S --checkpoint-dir DIR --report FILE

RANGES is the checkpoint's ranges as JSON, [[topic, partition, start, end], …]: the job
reads their partitions from their start offsets (all the topic holds) with Spark's Kafka
source, `Trigger.AvailableNow`, read_committed (the producer aborts some transactions);
parses each value with `from_json` and the demo's value schema; applies the demo's
transform (`exactly_once_demo.pipeline.prepare`); and in `foreachBatch` writes the tables
of schema S with Spark's own JDBC writer (batches of 10,000, `reWriteBatchedInserts`):

- `orders`: appended (`df.write.jdbc(…, mode="append")`);
- `sku_minute_totals`: the batch's orders, quantity and revenue per minute and sku, written
  over an unlogged table (a JDBC overwrite that truncates it), then added to the table's
  with `INSERT … ON CONFLICT … DO UPDATE` from the driver (psycopg2), as the usual answers
  to "upsert from Spark into PostgreSQL" do;
- `sku_last_price`: the batch's newest order per sku — by Kafka offset, then partition,
  the demo's upsert sink's order (exactly_once.sinks.upsert; the demo keys records by sku,
  so a sku's records are in one partition) — the same way, the newer replacing the older.

No row checks and no dead letters. A value that is not an order (`from_json` leaves it or
its fields null) is dropped with a `where`, and so is an order whose sku holds a NUL
character: PostgreSQL's text cannot hold one, so the batch would fail on it. The demo's
checkpoint sends exactly these records to its dead letters (every 997th order is
malformed, every 499th has a NUL in its sku), so the three tables equal the checkpoint's.
The only helper of the library used is `exactly_once.db.jdbc_options`, which spells the
database URL the benchmark runs with as a JDBC URL, user and password.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from contextlib import closing
from pathlib import Path

import psycopg2
from pyspark.sql import DataFrame, SparkSession, Window
from pyspark.sql import functions as F

from exactly_once.db import jdbc_options
from exactly_once_demo.pipeline import prepare

ORDER = "order_id string, sku string, qty int, price decimal(12,2), ts timestamp"  # the demo's value schema
FIELDS = ["order_id", "sku", "qty", "price", "ts"]
COORDINATES = ["kafka_topic", "kafka_partition", "kafka_offset"]
# table: (its key, what a row of the batch does to the table's row of that key)
UPSERTS = {
    "sku_minute_totals": ("minute, sku", "orders = t.orders + EXCLUDED.orders, qty = t.qty + EXCLUDED.qty, "
                                         "revenue = t.revenue + EXCLUDED.revenue"),
    "sku_last_price": ("sku", "price = EXCLUDED.price, ts = EXCLUDED.ts, kafka_partition = EXCLUDED.kafka_partition, "
                              "kafka_offset = EXCLUDED.kafka_offset"),
}


def orders(records: DataFrame) -> DataFrame:
    """The records' orders with their Kafka coordinates, the demo's transform applied; values
    that are not orders and skus PostgreSQL would refuse (a NUL) dropped."""
    parsed = records.select(F.from_json(F.col("value").cast("string"), ORDER).alias("o"),
                            *(F.col(kafka).alias(name) for kafka, name in zip(("topic", "partition", "offset"),
                                                                               COORDINATES)))
    return prepare(parsed.select("o.*", *COORDINATES).dropna(subset=FIELDS).where(~F.col("sku").contains("\u0000")))


def write_batch(rows: DataFrame, schema: str, jdbc: dict[str, str]) -> None:
    url = jdbc["url"]
    properties = {"user": jdbc["user"], "password": jdbc["password"], "driver": "org.postgresql.Driver",
                  "reWriteBatchedInserts": "true", "batchsize": "10000"}
    rows.select(*FIELDS, *COORDINATES).write.jdbc(url, f"{schema}.orders", mode="append", properties=properties)
    totals = rows.groupBy("minute", "sku").agg(F.count("*").alias("orders"), F.sum("qty").alias("qty"),
                                               F.sum("revenue").alias("revenue"))
    newest = Window.partitionBy("sku").orderBy(F.col("kafka_offset").desc(), F.col("kafka_partition").desc())
    last = (rows.withColumn("n", F.row_number().over(newest)).where("n = 1")
            .select("sku", "price", "ts", "kafka_partition", "kafka_offset"))
    for table, frame in (("sku_minute_totals", totals), ("sku_last_price", last)):
        frame.write.jdbc(url, f"{schema}.{table}_batch", mode="overwrite", properties={**properties, "truncate": "true"})
        key, update = UPSERTS[table]
        columns = ", ".join(frame.columns)
        with closing(psycopg2.connect(os.environ["PIPELINE_DB_URL"])) as conn, conn, conn.cursor() as cur:
            cur.execute(f"INSERT INTO {schema}.{table} AS t ({columns}) SELECT {columns} FROM {schema}.{table}_batch "
                        f"ON CONFLICT ({key}) DO UPDATE SET {update}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("ranges", type=json.loads)
    parser.add_argument("--schema", required=True, help="schema of the demo's tables this job writes")
    parser.add_argument("--checkpoint-dir", required=True, help="the query's checkpoint location (new)")
    parser.add_argument("--report", type=Path, required=True)
    args = parser.parse_args()
    starting, assign = {}, {}
    for topic, partition, start, _end in args.ranges:
        starting.setdefault(topic, {})[str(partition)] = start
        assign.setdefault(topic, []).append(partition)
    jdbc = jdbc_options(os.environ["PIPELINE_DB_URL"])  # url (reWriteBatchedInserts=true), user, password, driver
    with closing(psycopg2.connect(os.environ["PIPELINE_DB_URL"])) as conn, conn, conn.cursor() as cur:
        for table in UPSERTS:  # the user's DDL, run once: where each batch's rows land before the upsert
            cur.execute(f"CREATE UNLOGGED TABLE IF NOT EXISTS {args.schema}.{table}_batch (LIKE {args.schema}.{table})")

    spark = SparkSession.builder.appName("benchmark peer streaming, as users write it").getOrCreate()
    batches = []

    def each_batch(batch: DataFrame, batch_id: int) -> None:
        batches.append(batch_id)
        rows = orders(batch).persist()  # three writes read it
        try:
            write_batch(rows, args.schema, jdbc)
        finally:
            rows.unpersist()

    try:
        started = time.perf_counter()
        query = (spark.readStream.format("kafka")
                 .option("kafka.bootstrap.servers", os.environ["KAFKA_BOOTSTRAP_SERVERS"])
                 .option("assign", json.dumps(assign)).option("startingOffsets", json.dumps(starting))
                 .option("kafka.isolation.level", "read_committed")
                 # tasks of at most 250,000 offsets, as the increment job's: the comparison is not about task size
                 .option("maxRecordsPerPartition", 250_000)
                 .load()
                 .writeStream.trigger(availableNow=True).option("checkpointLocation", args.checkpoint_dir)
                 .foreachBatch(each_batch).start())
        query.awaitTermination()
        seconds = time.perf_counter() - started
    finally:
        spark.stop()
    args.report.write_text(json.dumps({"batches": len(batches), "seconds": seconds}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
